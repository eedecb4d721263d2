#!/usr/bin/env bash
# scripts/rung-diff, for every rung it lists: the rung below (07_full_p5 without that rung)
# builds, its changed files compiled with the build's own commands and linked with the build's
# other objects, and serves a client over shm with every page verified; the rung's diff then
# applies to it with `patch -p1` and gives 07_full_p5 back byte for byte. An unknown rung is
# refused with exit 2.
set -uo pipefail
root=$1 build=$2
tmp=$(mktemp -d)
server=
cleanup() {  # a server killed here leaves its shm regions in /dev/shm: removed
  [ -n "$server" ] && kill -9 "$server" 2>/dev/null &&
    { wait "$server" 2>/dev/null; remove_shm_regions "$server"; }
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
source "$root/scripts/bench-lib.sh"  # await_server, remove_shm_regions

# Builds DIR/07_full_p5 (the rung below) into DIR/07_full_p5.bin: the files that differ from
# 07_full_p5 are compiled as compile_commands.json compiles 07's, without optimization or
# debug information (-O0 -g0 last: a rung below is built to be run once, not timed, and
# compiles much faster so), and linked with the build's others.
build_below() {
  python3 - "$root" "$build" "$1" <<'PY'
import json, os, shlex, subprocess, sys
root, build, below = (os.path.realpath(p) for p in sys.argv[1:])
entries = json.load(open(os.path.join(build, "compile_commands.json")))
link = subprocess.run(["ninja", "-C", build, "-t", "commands", "07_full_p5/07_full_p5"],
                      capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
link = shlex.split(link)
objects = {}
for e in entries:
    src = os.path.realpath(os.path.join(e["directory"], e["file"]))
    if os.path.dirname(src) != os.path.join(root, "07_full_p5"):
        continue
    mine = os.path.join(below, "07_full_p5", os.path.basename(src))
    if open(mine, "rb").read() == open(src, "rb").read():
        continue
    args, out, skip = [], os.path.join(below, os.path.basename(src) + ".o"), 0
    for a in shlex.split(e["command"]):
        if skip:
            skip -= 1
        elif a in ("-MQ", "-MF"):
            skip = 1
        elif a == "-MD":
            pass
        elif a == "-o":
            args += ["-o", out]
            skip = 1
        elif a == e["file"]:
            args.append(mine)
        else:
            args.append(a)
    if subprocess.run(args + ["-O0", "-g0"], cwd=e["directory"]).returncode != 0:
        sys.exit(f"{mine} does not compile")
    objects[e["output"]] = out
    print(f"compiled {os.path.basename(src)}")
if not objects:
    sys.exit("no file differs from 07_full_p5")
binary = os.path.join(below, "07_full_p5.bin")
link = [objects.get(a, a) for a in link]
link[link.index("-o") + 1] = binary
if subprocess.run(link, cwd=build).returncode != 0:
    sys.exit("the rung below does not link")
PY
}

rungs=$("$root/scripts/rung-diff" | awk 'NR > 1 {print $1}')
[ "$(echo "$rungs" | wc -w)" -eq 8 ] || fail "expected 8 rungs, got: $rungs"
for r in $rungs; do
  below=$tmp/$r
  "$root/scripts/rung-diff" "$r" --below "$below" || fail "rung $r: the rung below was not written"
  "$root/scripts/rung-diff" "$r" >"$tmp/$r.diff" || fail "rung $r: no diff"
  lines=$(grep -c '^[-+][^-+]' "$tmp/$r.diff")
  # 07's README cites each rung's size: it must be this one.
  grep -qE "(^|: | )$r ${lines}[,)]" "$root/07_full_p5/README.md" ||
    fail "rung $r: $lines lines changed, but 07_full_p5/README.md cites another figure"
  build_below "$below" || fail "rung $r: the rung below does not build"
  bin=$below/07_full_p5.bin
  "$bin" --help >/dev/null || fail "rung $r: the rung below's --help exits $?"
  # A client over shm, served by the rung below (its other switches at their defaults). It
  # waits up to 60 s for answers, not the default 10: a rung below's server is built without
  # optimization and may leave a CONNECT unanswered for 10 s beside another test on 2 cores. This test is about builds and diffs; a server that never answers still
  # fails it, with its output and state.
  rm -f "$tmp/addr"
  "$bin" -p shm --memory host --address-file "$tmp/addr" --exit-after 1 >"$tmp/server.out" 2>&1 &
  server=$!
  await_server "$server" 60 test -s "$tmp/addr" 2>"$tmp/why" ||
    fail "rung $r: the rung below's server: $(cat "$tmp/why"): $(cat "$tmp/server.out")"
  out=$(timeout 120 "$bin" -p shm "$(cat "$tmp/addr")" --memory host -S 4k --pages 64 --requests 2 \
    --timeout 60 --json 2>&1) || fail "rung $r: the rung below's client exited $?: $out
--- its server ($(kill -0 "$server" 2>/dev/null && echo "alive, state $(awk '{print $3}' /proc/"$server"/stat 2>/dev/null)" || echo gone)):
$(cat "$tmp/server.out")"
  grep -q '"verified_bytes":524288' <<<"$out" || fail "rung $r: not every page verified: $out"
  timeout 30 tail --pid="$server" -f /dev/null || fail "rung $r: the rung below's server did not end"
  wait "$server" || fail "rung $r: the rung below's server exited $?: $(cat "$tmp/server.out")"
  server=
  # The diff shows no marker line, and, applied to the rung below, gives 07_full_p5 back but
  # for this rung's markers.
  ! grep -E '^[-+] *// </?(rung|without) ' "$tmp/$r.diff" || fail "rung $r: the diff shows marker lines"
  patch -s -p1 -d "$below" <"$tmp/$r.diff" || fail "rung $r: the diff does not apply"
  for f in "$root"/07_full_p5/*.cpp "$root"/07_full_p5/*.hpp; do
    grep -v -E "^ *// (<rung $r>|</rung $r>|<without $r> )" "$f" |
      cmp -s - "$below/07_full_p5/$(basename "$f")" || fail "rung $r: patched, $(basename "$f") differs from 07's"
  done
  echo "rung $r: $lines lines changed; the rung below built and verified 524288 bytes; the diff applies"
done
"$root/scripts/rung-diff" nope 2>"$tmp/err"
rc=$?
err=$(cat "$tmp/err")
[ "$rc" -eq 2 ] && [[ "$err" == *"unknown rung 'nope'"* ]] || fail "unknown rung: exit $rc, '$err'"
echo "unknown rung refused: $err"
