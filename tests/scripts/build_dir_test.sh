#!/usr/bin/env bash
# scripts/build never wipes a build folder configured for another libfabric (a test run in it
# calls scripts that call scripts/build, maybe without that run's LIBFABRIC): it refuses, exit
# 1, naming both libfabrics, and the folder is left as it was.
set -uo pipefail
root=$1
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
touch "$dir/build.ninja" "$dir/keep"
echo /nowhere/lib >"$dir/.libfabric"
err=$(BUILD_DIR=$dir "$root/scripts/build" 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 1 ] || { echo "FAIL: exit $rc, '$err'"; exit 1; }
[[ "$err" == *"configured for the libfabric in /nowhere/lib, not "* ]] || { echo "FAIL: '$err'"; exit 1; }
[ -f "$dir/keep" ] && [ -f "$dir/build.ninja" ] || { echo "FAIL: the folder was wiped"; exit 1; }
echo "refused, folder kept: $err"
