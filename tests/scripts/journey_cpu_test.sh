#!/usr/bin/env bash
# scripts/journey --cpu at its smallest (3 runs, 2 lanes, 1 thread, 20,000 WRITEs a run) over
# shm: every rung of the ladder is in the table with its runs and a verdict, and with the
# figure it exists to move measured below and at that rung (the server's own counts; the
# warmup's first WRITE over loopback tcp), each a number or, for NUMA on a one-node host, the
# reason it cannot show. Bad input: exit 2.
set -uo pipefail
root=$1 build=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
out=$(cd "$root" && BUILD_DIR=$build JOURNEY_OUT=$dir JOURNEY_LABEL=test WRITES=20000 \
  scripts/journey --cpu 3 2 1 2>&1) || fail "journey exited $?: $out"
echo "$out"
md=$dir/journey-cpu-test.md
[ -f "$md" ] || fail "no $md"
rows=$(awk '/^[|] step [|] Mpps [|] gain [|] runs/ {on = 1; next} on && /^[|]---/ {next}
  on && /^[|]/ {n++} on && /^$/ {exit} END {print n + 0}' "$md")
[ "$rows" -eq 9 ] || fail "$rows ladder rows, not 9"
row() { grep -F "| $1" "$md" | head -1; }
cell() { awk -F' [|] ' -v c="$2" '{print $c}' <<<"$(row "$1")"; }  # column c of step $1's row
verdicts='^(gain|loss|no change)$'
num='[0-9]+(\.[0-9]+)?'
for step in "+ warmup" "+ sharded" "+ batching" "+ lazy" "+ one doorbell"; do
  [ -n "$(row "$step")" ] || fail "no row for '$step'"
  [[ "$(cell "$step" 5)" =~ $verdicts ]] || fail "'$step': Mpps verdict '$(cell "$step" 5)'"
  [[ "$(cell "$step" 7)" =~ ^$num\ -\>\ $num ]] || fail "'$step': its figure below and on: '$(cell "$step" 7)'"
  [ "$step" = "+ one doorbell" ] ||  # below: over shm, its first figure cannot show
    [[ "$(cell "$step" 8)" =~ ^(gain|loss|no\ change) ]] || fail "'$step': its figure's verdict '$(cell "$step" 8)'"
done
# What each rung must do to its own figure, whatever the host: sharding takes the lock away,
# batching prepares more per visit, lazy posting posts from the CQ poll; the doorbell saves no
# doorbell over shm (it reads no FI_MORE), and its groups share a completion where shm
# completes on delivery (libfabric from 1.18).
[[ "$(cell "+ sharded" 7)" =~ -\>\ 0(\.00)?$ ]] || fail "sharded: locks per WRITE '$(cell "+ sharded" 7)'"
[ "$(cell "+ sharded" 8)" = gain ] || fail "sharded: fewer locks is not a gain: $(row "+ sharded")"
[ "$(cell "+ batching" 8)" = gain ] || fail "batching: $(row "+ batching")"
# The warmup's first WRITE over loopback tcp, where rxm connects each lane on its first WRITE.
[[ "$(cell "+ warmup" 7)" == *" over tcp; over shm "* ]] || fail "warmup: $(row "+ warmup")"
# Its medians, not its ranges: beside other work one warm run of three can take as long as
# a cold one, and the ranges then overlap although the medians differ many times over.
read -r cold _ warm _ <<<"$(cell "+ warmup" 7)"
awk -v c="$cold" -v w="$warm" 'BEGIN {exit !(w < c)}' &&
  [[ "$(cell "+ warmup" 8)" =~ ^(gain|no\ change)$ ]] ||
  fail "warmup: a first WRITE no sooner: $(row "+ warmup")"
[ "$(cell "+ lazy" 8)" = gain ] || fail "lazy: $(row "+ lazy")"
verdict='(gain|loss|no change)'
[[ "$(cell "+ one doorbell" 8)" =~ ^cannot\ show:\ shm\ reads\ no\ FI_MORE\ \(efa\ does\)\;\ $verdict\;\ $verdict$ ]] ||
  fail "doorbell: $(row "+ one doorbell")"
IFS=';' read -r doorbells completions _ <<<"$(cell "+ one doorbell" 7)"
[ "$doorbells" = "1.00 -> 1.00" ] || fail "doorbell: WRITEs per doorbell over shm '$doorbells'"
read -r _ _ grouped <<<"$completions"
if awk -v g="$grouped" 'BEGIN {exit !(g > 2)}'; then
  [[ "$(cell "+ one doorbell" 8)" == *"; gain; "* ]] || fail "doorbell: $grouped WRITEs per completion is a gain: $(row "+ one doorbell")"
else
  [ "$grouped" = 1.00 ] || fail "doorbell: WRITEs per completion '$completions'"
fi
# Pinned threads never change cores; the spread between runs comes beside it.
[[ "$(cell "+ pinning" 7)" =~ ^$num\ -\>\ 0\;\ $num%\ -\>\ $num% ]] || fail "pinning: moves '$(cell "+ pinning" 7)'"
# Whether the unpinned threads moved at all is the scheduler's affair; a pinned one never does.
[[ "$(cell "+ pinning" 8)" =~ ^(gain:\ unpinned\ threads\ moved\ in\ [1-9][0-9]*\ of\ [0-9]+\ runs,\ pinned\ ones\ in\ none|cannot\ show:\ the\ scheduler\ moved\ no\ unpinned\ thread)$ ]] ||
  fail "pinning: $(row "+ pinning")"
nodes=$(ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | wc -l)
if [ "$nodes" -le 1 ]; then
  [ "$(cell "+ NUMA" 8)" = "cannot show: one NUMA node, nothing to place" ] || fail "NUMA: $(row "+ NUMA")"
fi
err=$(cd "$root" && BUILD_DIR=$build JOURNEY_OUT=$dir scripts/journey --cpu 0 2>&1); rc=$?
[ "$rc" -eq 2 ] && [[ "$err" == *"'0'"* ]] || fail "RUNS 0: exit $rc, '$err'"
echo "journey --cpu: ok"
