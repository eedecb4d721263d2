#!/usr/bin/env bash
# Every stage README from 02 on cites the size of its step as scripts/stage-diff counts it
# ("N changed lines (I in, O out)"), so a figure never goes stale by hand. An unknown stage is
# refused with exit 2.
set -uo pipefail
root=$1
fail() { echo "FAIL: $*"; exit 1; }
while IFS= read -r line; do
  stage=${line#* -> }
  stage=${stage%%:*}
  figure=${line#*: }
  grep -qF "$figure" "$root/$stage/README.md" ||
    fail "$stage/README.md does not cite its step as scripts/stage-diff counts it: $figure"
  echo "ok: $line"
done < <("$root/scripts/stage-diff")
[ "$("$root/scripts/stage-diff" | wc -l)" -eq 6 ] || fail "stage-diff did not list 6 steps"
"$root/scripts/stage-diff" 09 2>/dev/null
[ $? -eq 2 ] || fail "stage-diff 09 did not exit 2"
echo "stage-diff: every README cites its step"
