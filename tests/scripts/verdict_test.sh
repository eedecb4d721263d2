#!/usr/bin/env bash
# The verdict on a rung (scripts/bench-lib.sh): gain or loss only when the two rungs' ranges
# of runs do not overlap, in the figure's own direction; no change when they do; too few
# runs for a range below 3; the verdict on a count a rung makes zero by construction; and the
# spread between runs as a share of their median.
set -uo pipefail
root=$1
cd "$root" || exit 1
source scripts/bench-lib.sh
failed=0
check() {  # expected, then the command
  local want=$1; shift
  local got; got=$("$@" 2>&1)
  if [ "$got" = "$want" ]; then echo "ok: $* -> $got"; else echo "FAIL: $* -> '$got', want '$want'"; failed=1; fi
}
check gain verdict "1.0 1.1 1.2" "1.3 1.4 1.5" up
check loss verdict "1.3 1.4 1.5" "1.0 1.1 1.2" up
check "no change" verdict "1.0 1.1 1.4" "1.3 1.4 1.5" up      # 1.3-1.4 overlap
check "no change" verdict "1.0 1.1 1.2" "1.2 1.4 1.5" up      # touching ranges are no gain
check gain verdict "9 8 7" "3 2 1" down                        # fewer locks, shorter times
check loss verdict "3 2 1" "9 8 7" down
check "no change" verdict "5 5 5" "5 5 5" up
check gain verdict "0.43 0.47 0.47 1.52 0.54" "1.6 1.7 1.8 1.9 2.0" up  # a wide range above
check "no change" verdict "0.43 0.47 0.47 1.52 0.54" "0.9 1.0 1.1 1.2 1.6" up
check "too few runs" verdict "1 2" "3 4 5" up
check "too few runs" verdict "1 2 3" "" up
check 'verdict: direction is up or down, not "more"' verdict "1 2 3" "4 5 6" more
check gain removed "0 3 0 1 0" "0 0 0 0 0"    # moves: some below, none pinned
check "cannot show" removed "0 0 0" "0 0 0"    # the scheduler moved no unpinned thread
check loss removed "2 3 4" "0 1 0"             # a pinned thread that moved
check "too few runs" removed "1 2" "0 0 0"
check 100 spread "1 2 3"
check 20 spread "0.9 1.0 1.1 1.0 0.95"
check - spread "7"
check - spread ""
exit $failed
