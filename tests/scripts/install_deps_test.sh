#!/usr/bin/env bash
# scripts/install-deps on a dnf machine (Amazon Linux 2023's names), run here with dnf and rpm
# standing in: a PATH without apt-get, an rpm that knows some packages installed, and a dnf
# that logs what it is asked and has no cli11-devel (as Amazon Linux 2023). It must ask for
# exactly the missing ones, one by one, name the one it could not get with what to do, and
# exit 1; with everything there, ask for nothing. And on this machine (apt), --print works.
set -uo pipefail
root=$1
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin"
for tool in bash env id grep cat rm mkdir printf sort head; do ln -s "$(command -v $tool)" "$work/bin/$tool"; done
cat >"$work/bin/rpm" <<'EOF'
#!/bin/bash
# rpm -q NAME: installed when listed in $RPM_INSTALLED
[[ " $RPM_INSTALLED " == *" $2 "* ]]
EOF
cat >"$work/bin/dnf" <<'EOF'
#!/bin/bash
echo "$*" >>"$DNF_LOG"
[[ "$*" != *cli11-devel* ]]
EOF
chmod +x "$work/bin/rpm" "$work/bin/dnf"
fail() { echo "FAIL: $*"; exit 1; }

# Some packages there, the rest missing; not root (no sudo here): refused before dnf runs.
out=$(env -i PATH="$work/bin" RPM_INSTALLED="gcc-c++ meson python3" DNF_LOG="$work/log" \
      bash "$root/scripts/install-deps" --print 2>&1)
echo "$out"
want="install-deps: dnf; missing: pkgconf-pkg-config ninja-build hwloc-devel gtest-devel cli11-devel iproute python3-pyyaml python3-jsonschema libfabric-devel"
[ "$out" = "$want" ] || fail "--print said '$out', not '$want'"

if [ "$(id -u)" -eq 0 ]; then
  out=$(env -i PATH="$work/bin" RPM_INSTALLED="gcc-c++ meson python3" DNF_LOG="$work/log" \
        bash "$root/scripts/install-deps" 2>&1); rc=$?
  echo "$out"; echo "dnf was asked:"; cat "$work/log"
  [ $rc -eq 1 ] || fail "exit $rc with cli11-devel missing, not 1"
  [[ "$out" == *"no cli11-devel"*"/usr/local/include"* ]] || fail "cli11-devel's fix not named"
  [ "$(wc -l <"$work/log")" -eq 9 ] || fail "dnf asked $(wc -l <"$work/log") times, not 9"
  grep -q "^install -y -q hwloc-devel$" "$work/log" || fail "hwloc-devel not asked for"
  grep -q "gcc-c++" "$work/log" && fail "asked for gcc-c++, which is installed"
fi

all="gcc-c++ pkgconf-pkg-config meson ninja-build hwloc-devel gtest-devel cli11-devel iproute python3 python3-pyyaml python3-jsonschema libfabric-devel"
rm -f "$work/log"
env -i PATH="$work/bin" RPM_INSTALLED="$all" DNF_LOG="$work/log" bash "$root/scripts/install-deps" ||
  fail "exit $? with everything installed"
[ ! -f "$work/log" ] || fail "dnf was run with everything installed"

# Everything there, but the distribution's libfabric below the floor (Ubuntu 22.04's 1.11):
# said, with what to do, exit 1; with LIBFABRIC naming another install, not said.
printf '#!/bin/bash\necho 1.11.0\n' >"$work/bin/pkg-config"; chmod +x "$work/bin/pkg-config"
out=$(env -i PATH="$work/bin" RPM_INSTALLED="$all" DNF_LOG="$work/log" bash "$root/scripts/install-deps" 2>&1)
rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"libfabric is 1.11.0, below the 1.17"*"LIBFABRIC=/opt/amazon/efa"* ]] ||
  fail "libfabric 1.11: exit $rc, '$out'"
env -i PATH="$work/bin" RPM_INSTALLED="$all" DNF_LOG="$work/log" LIBFABRIC=/opt/x \
  bash "$root/scripts/install-deps" || fail "LIBFABRIC set: exit $?"
echo "libfabric 1.11 named: $out"

# This machine's own package manager.
out=$("$root/scripts/install-deps" --print) || fail "--print here: exit $?"
echo "here: $out"
"$root/scripts/install-deps" --bogus 2>/dev/null; [ $? -eq 2 ] || fail "--bogus not refused with 2"
echo "install-deps: dnf and this machine's manager as expected"
