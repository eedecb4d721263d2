#!/usr/bin/env bash
# scripts/sweep over shm on this machine, as small as it goes: one page size, host memory,
# one run. The run's figures reach the CSV and the table, what cannot run here is left out with
# the reason, and bad input is refused with exit 2 naming the bad value.
set -uo pipefail
root=$1 build=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
out=$(BUILD_DIR=$build SIZES=4k MEMORY=host,cuda THREADS=1,256 RUNS=1 BYTES=16m \
  "$root/scripts/sweep" "$dir/s" 2>&1) || fail "sweep exited $?: $out"
echo "$out"
grep -q '^sweep: 256 threads left out: [0-9]* cores cannot give' <<<"$out" || fail "256 threads were not left out"
if ! "$build/tests/copy_bandwidth" --gpu --gpu-bytes 16m --repeat 1 >/dev/null 2>&1; then
  grep -q '^sweep: cuda left out: no GPU here' <<<"$out" || fail "cuda was not left out without a GPU"
fi
row=$(grep '^07,host,1,4096,4k,1,' "$dir/s/sweep.csv") || fail "no 07 row in the CSV"
mpps=$(cut -d, -f7 <<<"$row")
awk -v m="$mpps" 'BEGIN {exit !(m + 0 > 0)}' || fail "07's rate is not a figure: $row"
grep -q "^| host | 1 | 4k | $mpps |" "$dir/s/sweep.md" || fail "the table lacks the run's median"
grep -q '^memcpy@4096,' "$dir/s/limits.csv" || fail "no copy limit at 4 KiB"
for bad in "MEMORY=gpu" "SIZES=4q" "THREADS=0" "RUNS=x" "PROGRAMS=nccl"; do
  err=$(env "$bad" BUILD_DIR="$build" "$root/scripts/sweep" "$dir/bad" 2>&1); rc=$?
  value=${bad#*=}
  [ "$rc" -eq 2 ] && [ "$(wc -l <<<"$err")" -eq 1 ] && [[ "$err" == *"'$value'"* ]] ||
    fail "$bad: exit $rc, '$err'"
  echo "$bad refused: $err"
done
echo "sweep: ok"
