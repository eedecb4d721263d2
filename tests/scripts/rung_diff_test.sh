#!/usr/bin/env bash
# scripts/rung-diff: every rung it lists has code marked in 07_full_p5/ (each "<rung NAME>"
# closed by its "</rung NAME>"), and an unknown rung is refused with exit 2.
set -uo pipefail
root=$1
rungs=$("$root/scripts/rung-diff" | awk 'NR > 1 {print $1}')
[ "$(echo "$rungs" | wc -w)" -eq 8 ] || { echo "expected 8 rungs, got: $rungs"; exit 1; }
for r in $rungs; do
  opened=$(grep -c "// <rung $r>\$" "$root"/07_full_p5/*.cpp | awk -F: '{s += $2} END {print s}')
  closed=$(grep -c "// </rung $r>\$" "$root"/07_full_p5/*.cpp | awk -F: '{s += $2} END {print s}')
  [ "$opened" -gt 0 ] && [ "$opened" -eq "$closed" ] ||
    { echo "rung $r: $opened markers opened, $closed closed"; exit 1; }
  lines=$("$root/scripts/rung-diff" "$r" | grep -c '^+[^+]')
  [ "$lines" -gt 0 ] || { echo "rung $r: no code shown"; exit 1; }
  echo "rung $r: $lines lines in $opened piece(s)"
done
"$root/scripts/rung-diff" nope 2>/tmp/rung-diff-err.$$
rc=$?
err=$(cat /tmp/rung-diff-err.$$); rm -f /tmp/rung-diff-err.$$
[ "$rc" -eq 2 ] && [[ "$err" == *"unknown rung 'nope'"* ]] || { echo "unknown rung: exit $rc, '$err'"; exit 1; }
echo "unknown rung refused: $err"
