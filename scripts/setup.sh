#!/usr/bin/env bash
# One entry point for a fresh machine: installs what is missing (Debian packages), configures and
# builds, then runs the planner demo or the whole test suite.
#
#   scripts/setup.sh demo   # install, build, run `planner --model 70b --gpus 64`
#   scripts/setup.sh test   # install, build, run every test (ctest)
#   scripts/setup.sh build  # install and build only
#
# Environment: BUILD_DIR (default build), JOBS (default: number of cores).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$here/build}"
jobs="${JOBS:-$(nproc)}"
action="${1:-demo}"

# Debian packages the costmodel, planner and tests need (see README.md, "Dependencies").
packages=(g++ cmake ninja-build libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev)

install_missing() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "setup: installing ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

build() {
  cmake -S "$here" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
  cmake --build "$build_dir" -j "$jobs"
}

case "$action" in
  demo)
    install_missing
    build
    "$build_dir/planner/planner" --model 70b --gpus 64
    ;;
  test)
    install_missing
    build
    ctest --test-dir "$build_dir" --output-on-failure -j "$jobs"
    ;;
  build)
    install_missing
    build
    ;;
  *)
    echo "usage: scripts/setup.sh [demo|test|build]" >&2
    exit 2
    ;;
esac
