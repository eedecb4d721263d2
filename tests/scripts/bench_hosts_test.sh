#!/usr/bin/env bash
# scripts/bench-fabtests hosts A B: the two-host mode a p5 user runs over ssh, here with an
# ssh that runs each command on this host (both "hosts" are this one, by two names that
# resolve here: fi_rma_bw's client finds its server by name) over shm, host memory,
# one small run: the servers' addresses read from what they print, the clients run "on B",
# and a table with a figure for 05 and for 07 (and fi_rma_bw where fabtests is installed).
#   tests/scripts/bench_hosts_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1; build=$2
source "$src/scripts/bench-lib.sh"  # remove_shm_regions
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cat >"$work/ssh" <<'SH'
#!/bin/bash
# ssh HOST COMMAND: run here, as ssh would run it there
echo "$1" >>"$(dirname "$0")/hosts"
shift; exec bash -c "$1"
SH
# Into a file, not $(...): a command substitution waits for every process that holds its
# pipe, so a server left behind by a run cut short by timeout would hold the test past
# meson's 300 s with nothing printed. Whatever the run left is ended with it.
(cd "$src" && BUILD_DIR=$build SSH="bash $work/ssh" PROVIDER=shm BYTES=16m LANES=1 \
  exec setsid timeout -k 5 120 scripts/bench-fabtests hosts localhost 127.0.0.1 64k host 1) \
  >"$work/out" 2>&1 &
runner=$!
wait "$runner"
rc=$?
# Its session: servers and clients it left running, and the shm regions they leave when killed.
for left in $(pgrep -s "$runner" 2>/dev/null); do
  kill -KILL "$left" 2>/dev/null && remove_shm_regions "$left"
done
out=$(cat "$work/out")
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: exit $rc"; exit 1; }
row=$(grep '^| 64k |' <<<"$out")
[ -n "$row" ] || { echo "FAIL: no row for 64k"; exit 1; }
# | 64k | fab Mpps | Gbps | 05 Mpps | Gbps | 07 Mpps | Gbps | best |: 05's and 07's are figures
awk -F'|' '{exit !($5 + 0 > 0 && $7 + 0 > 0)}' <<<"$row" || { echo "FAIL: 05 or 07 gave no figure: $row"; exit 1; }
grep -q "servers on localhost, clients on 127.0.0.1, over shm" <<<"$out" || { echo "FAIL: no header"; exit 1; }
grep -qx localhost "$work/hosts" && grep -qx 127.0.0.1 "$work/hosts" || { echo "FAIL: not both hosts used"; exit 1; }
echo "bench-fabtests hosts: servers on A and clients on B through ssh, figures for 05 and 07"

# A server that cannot start (a provider this host lacks): its pair says why and gives no
# figure, and the table is still printed (the failure path once ended the script: exit 143).
out=$(cd "$src" && BUILD_DIR=$build SSH="bash $work/ssh" PROVIDER=no-such-provider BYTES=16m \
  LANES=1 timeout -k 5 60 scripts/bench-fabtests hosts localhost 127.0.0.1 64k host 1 2>&1)
rc=$?
[ $rc -eq 0 ] || { echo "$out"; echo "FAIL: servers that cannot start: exit $rc"; exit 1; }
for stage in 05_queuing 07_full_p5; do
  grep -q "^bench-fabtests: $stage: the server (pid [0-9]*) ended before it gave its address:$" <<<"$out" ||
    { echo "$out"; echo "FAIL: $stage's failed server is not said"; exit 1; }
done
grep -q "^| 64k | - | - | - | - | - | - | - |$" <<<"$out" || { echo "$out"; echo "FAIL: no row of failed pairs"; exit 1; }
echo "bench-fabtests hosts: a server that cannot start is said, and the table still printed"
