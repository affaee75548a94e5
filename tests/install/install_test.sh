#!/usr/bin/env bash
# The installed tools work from a fresh directory, as a user would run them (issue 14, item 4):
#   1. `cmake --install BUILD --prefix FRESH`: planner, the GUI and the executor (those built), man
#      pages, presets and samples are there; `planner --model 8b --gpus 8` runs from an empty
#      directory; the executor finds its LibTorch.
#   2. `cpack -G DEB`: the Debian package holds the same files under /usr, unpacks into a fresh
#      directory where planner runs, declares its shared-library dependencies, and apt-get
#      (simulating) finds them all installable.
# Usage: install_test.sh BUILD_DIR
set -euo pipefail
build="$(cd "$1" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }
mkdir -p "$work/empty"

run_planner() {  # run_planner BIN: the flagship-style question from an empty directory
  local out
  out="$(cd "$work/empty" && "$1" --model 8b --gpus 8 --quiet)" || fail "$1 --model 8b --gpus 8 exited $?"
  grep -q "^Recommended: " <<<"$out" || fail "$1 printed no recommendation:"$'\n'"$out"
  echo "install_test: $1 --model 8b --gpus 8: $(grep '^Recommended: ' <<<"$out")"
}

# 1. cmake --install into a fresh prefix.
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null || fail "cmake --install exited $?"
for f in bin/planner share/man/man1/planner.1 share/trainplan/hwprofiles/dgx-h100.json \
         share/trainplan/samples/plans/tiny-llama-pp4.json share/doc/trainplan/README.md; do
  [ -s "$prefix/$f" ] || fail "cmake --install did not install $f"
done
head -1 "$prefix/share/man/man1/planner.1" | grep -q '^\.TH PLANNER 1' || fail "planner.1 does not start with .TH PLANNER 1"
grep -q '^\.SS planner launch' "$prefix/share/man/man1/planner.1" || fail "planner.1 lacks the launch subcommand"
run_planner "$prefix/bin/planner"
if [ -e "$build/gui/trainplan-gui" ]; then
  [ -x "$prefix/bin/trainplan-gui" ] && [ -s "$prefix/share/man/man1/trainplan-gui.1" ] || fail "trainplan-gui or its man page not installed"
  QT_QPA_PLATFORM=offscreen "$prefix/bin/trainplan-gui" --help >/dev/null || fail "installed trainplan-gui --help exited $?"
fi
if [ -e "$build/executor/executor" ]; then
  [ -x "$prefix/bin/executor" ] && [ -s "$prefix/share/man/man1/executor.1" ] || fail "executor or its man page not installed"
  (cd "$work/empty" && "$prefix/bin/executor" --help >/dev/null) || fail "installed executor does not start (LibTorch not found?)"
fi
echo "install_test: cmake --install: $(cd "$prefix" && find . -type f | wc -l) files, every check passed"

# 2. The Debian package.
if ! command -v cpack >/dev/null || ! command -v dpkg-deb >/dev/null || ! command -v dpkg-shlibdeps >/dev/null; then
  echo "install_test: SKIP the Debian package: cpack, dpkg-deb or dpkg-shlibdeps (dpkg-dev) missing"
  exit 0
fi
(cd "$work" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/pkg" >"$work/cpack.log" 2>&1) ||
  { cat "$work/cpack.log" >&2; fail "cpack -G DEB exited"; }
deb="$(ls "$work"/pkg/trainplan_*.deb 2>/dev/null | head -1)"
[ -n "$deb" ] || { cat "$work/cpack.log" >&2; fail "cpack wrote no trainplan_*.deb"; }
depends="$(dpkg-deb -f "$deb" Depends)"
grep -q 'libc6' <<<"$depends" || fail "the package declares no shared-library dependencies (Depends: $depends)"
listing="$(dpkg-deb -c "$deb")"
grep -q '\./usr/bin/planner$' <<<"$listing" || fail "the package lacks /usr/bin/planner"
grep -q '\./usr/share/man/man1/planner\.1' <<<"$listing" || fail "the package lacks planner's man page"
if grep -q 'bin/executor$' <<<"$listing"; then fail "the package holds the executor, whose LibTorch no Debian package provides"; fi
dpkg-deb -x "$deb" "$work/root"
run_planner "$work/root/usr/bin/planner"
if command -v apt-get >/dev/null; then
  apt-get install -s -qq "$deb" >"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; fail "apt-get cannot install $(basename "$deb")"; }
fi
echo "install_test: $(basename "$deb"): $(dpkg-deb -f "$deb" Installed-Size) KiB installed; Depends: $depends"
