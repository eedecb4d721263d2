#!/usr/bin/env bash
# Every program in scripts/ answers -h and --help at once with what it does, from a tree that
# has nothing but its scripts (as a fresh clone has no build folder): exit 0, text on stdout,
# nothing on stderr, nothing built, installed or written. Commands that would build or install
# (apt-get, dnf, sudo, meson, ninja, compilers) stand first in PATH as tripwires that record
# any call. Then every shell file of scripts/ and tests/scripts/ passes `shellcheck -S warning`.
set -uo pipefail
root=$1
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/repo" "$tmp/trip"
cp -r "$root/scripts" "$tmp/repo/"
for tool in apt-get dnf sudo meson ninja make cmake cc c++ gcc g++ pip pip3 sbatch; do
  printf '#!/bin/sh\ntouch "%s/tripped.%s"\nexit 1\n' "$tmp" "$tool" >"$tmp/trip/$tool"
  chmod +x "$tmp/trip/$tool"
done
# Python's own bytecode cache is Python's doing, not the script's: left out of the comparison.
listing() { (cd "$tmp/repo" && find . -name __pycache__ -prune -o -print | sort); }
before=$(listing)
checked=0
for script in "$tmp"/repo/scripts/*; do
  [ -x "$script" ] || continue
  name=${script##*/}
  for flag in -h --help; do
    out=$(cd "$tmp" && PATH="$tmp/trip:$PATH" timeout 10 "$script" "$flag" 2>"$tmp/err" </dev/null)
    rc=$?
    [ "$rc" -eq 0 ] || fail "$name $flag exited $rc: $(head -c 300 "$tmp/err")"
    [ -n "$out" ] || fail "$name $flag printed nothing"
    [ ! -s "$tmp/err" ] || fail "$name $flag wrote to stderr: $(head -c 300 "$tmp/err")"
    tripped=$(cd "$tmp" && ls tripped.* 2>/dev/null)
    [ -z "$tripped" ] || fail "$name $flag called ${tripped//tripped./}"
    [ "$(listing)" = "$before" ] || fail "$name $flag wrote into the tree: $(diff <(echo "$before") <(listing))"
  done
  echo "ok: $name --help: $(head -1 <<<"$out" | cut -c1-70)"
  checked=$((checked + 1))
done
[ "$checked" -ge 15 ] || fail "only $checked programs in scripts/"

if ! command -v shellcheck >/dev/null; then
  echo "shellcheck is not installed (scripts/install-deps installs it): not checked"
  exit 77
fi
# From the root, as a user runs it: shellcheck then follows the scripts' `source scripts/...`
# (bench-lib.sh uses variables of the scripts that source it).
cd "$root" || fail "no $root"
shell_files=()
for f in scripts/* tests/scripts/*.sh; do
  head -1 "$f" | grep -qE '^#!.*(bash|/sh)|^# shellcheck shell=' && shell_files+=("$f")
done
[ "${#shell_files[@]}" -ge 20 ] || fail "only ${#shell_files[@]} shell files found"
shellcheck -S warning "${shell_files[@]}" || fail "shellcheck -S warning has findings (above)"
echo "scripts: $checked programs answer --help without side effects;" \
  "shellcheck -S warning clean over ${#shell_files[@]} shell files"
