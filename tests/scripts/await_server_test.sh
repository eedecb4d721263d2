#!/usr/bin/env bash
# await_server (scripts/bench-lib.sh), the scripts' wait for a server's address: it returns
# as soon as the address is there, at once when the server has died (not at its limit), and
# at its limit when the server lives on without one, saying which on stderr.
set -uo pipefail
root=$1
cd "$root" || exit 1
source scripts/bench-lib.sh
tmp=$(mktemp -d); trap 'kill "$live" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# A server that writes its address after a while: waited for.
(sleep 1; echo addr >"$tmp/addr"; sleep 5) & live=$!
start=$SECONDS
await_server "$live" 30 test -s "$tmp/addr" 2>"$tmp/why" || fail "address written after 1 s: $(cat "$tmp/why")"
[ $((SECONDS - start)) -lt 10 ] || fail "waited $((SECONDS - start)) s for an address written after 1 s"
kill "$live"; wait "$live" 2>/dev/null

# A server that dies without one: said at once, not after the 30 s.
rm -f "$tmp/addr"; (sleep 0.5; exit 3) & dead=$!
start=$SECONDS
await_server "$dead" 30 test -s "$tmp/addr" 2>"$tmp/why" && fail "a dead server's wait succeeded"
[ $((SECONDS - start)) -lt 10 ] || fail "a dead server was waited for $((SECONDS - start)) s"
grep -q "^the server (pid $dead) ended before it gave its address$" "$tmp/why" || fail "why: $(cat "$tmp/why")"

# A server that lives on without one: the limit, and the reason.
sleep 60 & live=$!
start=$SECONDS
await_server "$live" 2 test -s "$tmp/addr" 2>"$tmp/why" && fail "a silent server's wait succeeded"
[ $((SECONDS - start)) -ge 2 ] || fail "the limit of 2 s ended after $((SECONDS - start)) s"
grep -q "^the server (pid $live) gave no address in 2 s$" "$tmp/why" || fail "why: $(cat "$tmp/why")"
echo "await_server: ok"
