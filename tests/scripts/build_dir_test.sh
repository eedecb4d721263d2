#!/usr/bin/env bash
# scripts/build never wipes a build folder configured for another libfabric (a test run in it
# calls scripts that call scripts/build, maybe without that run's LIBFABRIC): it refuses, exit
# 1, naming both libfabrics, and the folder is left as it was. Two builds of one folder never
# run at once: the second says so and waits for the first.
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

# A build under way (its lock held for 2 s): the next one waits, says so, then builds.
dir2=$(mktemp -d); trap 'rm -rf "$dir" "$dir2"' EXIT
printf 'rule nop\n  command = true\nbuild all: phony\ndefault all\n' >"$dir2/build.ninja"
(cd "$root" && source scripts/libfabric-env && { pkg-config --variable=libdir libfabric || echo none; }) \
  >"$dir2/.libfabric" 2>/dev/null
flock "$dir2/.build-lock" sleep 2 &
sleep 0.3
start=$(date +%s.%N)
err=$(BUILD_DIR=$dir2 "$root/scripts/build" 2>&1 >/dev/null); rc=$?
waited=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}')
wait
[ "$rc" -eq 0 ] || { echo "FAIL: the waiting build exited $rc: $err"; exit 1; }
[[ "$err" == *"another build of $dir2 is under way; waiting for it"* ]] || { echo "FAIL: '$err'"; exit 1; }
awk -v w="$waited" 'BEGIN {exit !(w >= 1.2)}' || { echo "FAIL: it did not wait (${waited} s)"; exit 1; }
echo "the second build waited ${waited} s: $err"
