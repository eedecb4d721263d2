#!/usr/bin/env bash
# The Meson floor is what the build files need: configured afresh, Meson reports no feature
# newer than the meson_version that meson.build declares (its FeatureNew warnings: "Project
# targets '>= X' but uses feature introduced in 'Y'"). Ubuntu 22.04 has Meson 0.61.
set -uo pipefail
root=$1
floor=$(sed -n "s/.*meson_version: '>= \([0-9.]*\)'.*/\1/p" "$root/meson.build")
[ -n "$floor" ] || { echo "meson.build declares no meson_version floor"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
meson setup "$tmp/build" "$root" -Dtests=enabled >"$tmp/out" 2>&1 ||
  { echo "meson setup failed:"; tail -20 "$tmp/out"; exit 1; }
newer=$(grep -h "uses feature introduced in\|uses feature deprecated since" "$tmp/out" \
          "$tmp/build/meson-logs/meson-log.txt" | sort -u)
if [ -n "$newer" ]; then
  echo "meson_version '>= $floor', but:"; echo "$newer"; exit 1
fi
echo "meson_version '>= $floor': no feature newer than it (Meson $(meson --version) checked)"
