# shellcheck shell=bash
# Helpers the benchmark scripts share (sourced, not run): sizes, medians and JSON fields (from
# scripts/benchlib.py), CPU time split, NIC byte counters, and one server/client run across the
# mini-cluster.

benchlib=$(dirname "${BASH_SOURCE[0]}")/benchlib.py  # statistics and records, with unit tests
median() { python3 "$benchlib" median; }  # of the numbers on stdin, one a line; "-" when none
bytes_of() {  # 4096, 64k, 2m, 1g -> bytes; exit status 1 for what is not a size
  awk -v s="$1" 'BEGIN {n = s + 0; u = tolower(substr(s, length(n "") + 1, 1))
    if (n <= 0 || (u != "" && u != "k" && u != "m" && u != "g")) exit 1
    printf "%.0f\n", n * (u == "k" ? 1024 : u == "m" ? 1048576 : u == "g" ? 1073741824 : 1)}'
}
field() { python3 "$benchlib" field "$1"; }  # NAME of each JSON record on stdin; "" if null
fields() { python3 "$benchlib" fields "$@"; }  # a tab-separated row of NAMEs (a.b) per record
# await_server PID SECONDS COMMAND...: waits until COMMAND succeeds (the server has written its
# address), while the server PID lives, for at most SECONDS of wall time; otherwise says why on
# stderr and returns 1. A server that died is seen at once; one that a loaded host has not run
# yet is waited for: 2-core CI VMs have left a runnable process unscheduled for 20 s.
await_server() {
  local pid=$1 limit=$2; shift 2
  local end=$((SECONDS + limit))
  until "$@" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      "$@" 2>/dev/null && return 0
      echo "the server (pid $pid) ended before it gave its address" >&2; return 1
    fi
    [ "$SECONDS" -lt "$end" ] || { echo "the server (pid $pid) gave no address in $limit s" >&2; return 1; }
    sleep 0.05
  done
}
# remove_shm_regions PID...: what shm made for each process in /dev/shm (PID:UID:INDEX, 13 MB
# a file), which one killed with SIGKILL leaves behind; only for processes that are gone (the
# programs' own is common::RemoveShmRegionsOf). Anything but a pid is ignored.
remove_shm_regions() {
  local pid
  for pid in "$@"; do [[ "$pid" =~ ^[0-9]+$ ]] && rm -f /dev/shm/"$pid":*; done
  return 0
}
# verdict "BELOW" "THIS" up|down: what a change did to a figure, from the runs on each side
# (space-separated; up: higher is better, down: lower is better). "gain" when every run of THIS
# beats every run of BELOW in that direction (the two ranges do not overlap), "loss" when every
# run is worse, "no change" when the ranges overlap (the difference is within the spread), and
# "too few runs" with fewer than 3 on either side: a range of one or two runs is no spread.
verdict() { python3 "$benchlib" verdict "$1" "$2" "$3"; }
# removed "BELOW" "THIS": the verdict on a rung that makes a count zero by construction (a
# pinned thread cannot move between cores), from the counts per run: "gain" when THIS counted
# none in any run and BELOW some in at least one, "loss" when THIS counted any, "cannot show"
# when neither did (nothing was there to remove); "too few runs" with fewer than 3 a side.
removed() { python3 "$benchlib" removed "$1" "$2"; }
# spread "RUNS": (max - min) / median of the runs, in percent ("-" for fewer than 2 runs).
spread() { python3 "$benchlib" spread "$1"; }
cpu_ticks() {  # user nice system idle iowait irq softirq, summed over all CPUs
  awk '/^cpu / {print $2, $3, $4, $5, $6, $7, $8}' /proc/stat
}
cpu_split() {  # "before" "after" -> where the time went, in % of all CPU time
  awk -v b="$1" -v a="$2" 'BEGIN {
    split(b, x); split(a, y); t = 0
    for (i = 1; i <= 7; i++) { d[i] = y[i] - x[i]; t += d[i] }
    printf "user %.0f%%, sys %.0f%%, softirq %.0f%%, idle %.0f%%",
      100 * (d[1] + d[2]) / t, 100 * (d[3] + d[6]) / t, 100 * d[7] / t, 100 * (d[4] + d[5]) / t }'
}
tx_bytes() {  # host nic
  scripts/minicluster exec "$1" cat "/sys/class/net/$2/statistics/tx_bytes"
}

# run STAGE "server args" "client args": a server in host A for one client, the client in
# host B with --json; prints what the client printed. Needs $build and $tmp. With
# PROGRAM_CPUS set (e.g. 0), both programs run on those CPUs only (taskset); the server
# serves MAX_CLIENTS clients (default 1; a --ladder client is a session per run, 9 with
# --runs 1 --min-seconds 0).
# shellcheck disable=SC2154  # build and tmp: the sourcing script's
run() {
  local server_args=$2 client_args=$3 bin="$build/$1/$1"
  local cpus=(); [ -n "${PROGRAM_CPUS:-}" ] && cpus=(taskset -c "$PROGRAM_CPUS")
  rm -f "$tmp/addr"
  scripts/minicluster exec A "${cpus[@]}" "$bin" -p tcp $server_args --memory host --address-file "$tmp/addr" \
    --exit-after "${MAX_CLIENTS:-1}" >"$tmp/server.log" 2>&1 &
  local server=$!
  await_server "$server" 60 test -s "$tmp/addr" || true  # the client then says what is missing
  scripts/minicluster exec B "${cpus[@]}" "$bin" -p tcp "$(cat "$tmp/addr")" --memory host --json $client_args ||
    { echo "client failed; server printed:" >&2; cat "$tmp/server.log" >&2; }
  wait "$server"
}
