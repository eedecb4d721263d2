#!/usr/bin/env bash
# scripts/bench-clients at its smallest over shm (K = 1 and 2, one run, a second each): a row
# for each K with figures, no failed client, the server's threads the same for both, the
# CSV and records written; bad input is refused with exit 2 and one line naming the value.
set -uo pipefail
root=$1 build=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
out=$(BUILD_DIR=$build "$root/scripts/bench-clients" --clients 1,2 --runs 1 --total 64m \
  --seconds 1 --pages 64 --out "$dir/r" 2>&1) || fail "bench-clients exited $?: $out"
echo "$out"
num='[0-9]+\.[0-9]+'
for k in 1 2; do
  row=$(grep "^| $k | " <<<"$out") || fail "no row for $k client(s)"
  # aggregate, range, ratio, Jain's index, lowest share, start skew, 0 failed, threads
  [[ "$row" =~ ^\|\ $k\ \|\ $num\ \|\ $num-$num\ \|\ $num\ \|\ $num\ \|\ $num\ \|\ $num\ \|\ 0\ \|\ [0-9]+\ \| ]] ||
    fail "row for $k: $row"
done
grep -q "failed clients: 0; server threads the same for every K" <<<"$out" || fail "verdict line"
[ "$(wc -l <"$dir/r/bench-clients.csv")" -eq 3 ] || fail "CSV: $(cat "$dir/r/bench-clients.csv")"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert len(r) == 2 and all(x['records'] for x in r)" \
  "$dir/r/runs.json" || fail "runs.json"
[ "$(ls "$dir/r/logs" | wc -l)" -ge 3 ] || fail "clients' logs: $(ls "$dir/r/logs")"
# The plot again from the CSV alone: drawn where gnuplot is, said where it is not.
drawn=$("$root/scripts/bench-clients" --draw "$dir/r" 2>&1) || fail "--draw exited $?: $drawn"
if command -v gnuplot >/dev/null; then
  grep -q "<svg" "$dir/r/bench-clients.svg" || fail "--draw: no plot: $drawn"
else
  grep -q "no plot: gnuplot is not installed" <<<"$drawn" || fail "--draw: $drawn"
fi
for bad in "--clients 0" "--clients x" "--total 4q" "--runs 0" "--nics 65" "--seconds 0.1" \
  "--draw $dir/none"; do
  # shellcheck disable=SC2086 # two words: the option and its value
  err=$(BUILD_DIR=$build "$root/scripts/bench-clients" $bad --out "$dir/bad" 2>&1); rc=$?
  value=${bad#* }
  [ "$rc" -eq 2 ] && [ "$(wc -l <<<"$err")" -eq 1 ] && [[ "$err" == *"$value"* ]] ||
    fail "$bad: exit $rc, '$err'"
  echo "$bad refused: $err"
done
[ ! -e "$dir/bad" ] || fail "bad input wrote $dir/bad"
echo "bench-clients: ok"
