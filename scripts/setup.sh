#!/usr/bin/env bash
# One entry point for a fresh machine: installs what is missing (Debian packages), configures and
# builds, then runs the planner demo or the whole test suite.
#
#   scripts/setup.sh demo   # install, build, run `planner --model 70b --gpus 64`
#   scripts/setup.sh test   # also LibTorch + MPI: build the executor, run every test (ctest)
#   scripts/setup.sh build  # install and build everything, executor included
#
# The executor needs LibTorch, which comes from PyPI's torch wheel (pinned below, ~4 GB with its
# CUDA libraries) installed into .venv/ beside the sources; pip's cache makes a second run cheap.
# `demo` skips it: the planner and the cost model never need LibTorch.
#
# Environment: BUILD_DIR (default build), JOBS (default: number of cores), VENV (default .venv).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$here/build}"
jobs="${JOBS:-$(nproc)}"
action="${1:-demo}"

# Debian packages the costmodel, planner and tests need (see docs/installing.md, "Dependencies"); dpkg-dev
# gives dpkg-shlibdeps, which the Debian package (cpack -G DEB) takes its dependencies from.
packages=(g++ cmake ninja-build dpkg-dev libcli11-dev nlohmann-json3-dev libeigen3-dev libgtest-dev libgmock-dev)
# ... and the Qt planning app (gui/, trainplan-gui; its tests run on Qt's offscreen platform):
# Qt 6 Widgets, Charts and Svg; Qt6Charts' CMake package needs the Qt OpenGL one, which
# qt6-base-dev only recommends; fonts so that offscreen text renders; xvfb for a virtual display.
packages+=(qt6-base-dev qt6-charts-dev qt6-svg-dev libqt6opengl6-dev libgl-dev fonts-dejavu-core xvfb)
# ... and the executor (LibTorch comes from pip, see install_torch).
executor_packages=(openmpi-bin libopenmpi-dev zlib1g-dev python3-venv)
torch_version="2.11.0"
venv="${VENV:-$here/.venv}"

install_missing() {
  local missing=()
  for p in "$@"; do
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

# torch==$torch_version (CUDA 13.0 build) into the virtual environment, once.
install_torch() {
  if [ ! -x "$venv/bin/python" ]; then
    echo "setup: creating $venv"
    python3 -m venv "$venv"
  fi
  if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
    echo "setup: installing torch==$torch_version into $venv (LibTorch for the executor; large download)"
    "$venv/bin/pip" install --progress-bar off "torch==$torch_version"
  fi
  # safetensors + numpy: the test that reads the executor's export with the Python library;
  # transformers: the tests that load Hugging Face checkpoints with LlamaForCausalLM itself
  # (tests/executor/hf_transformers_logits.py).
  "$venv/bin/python" -c "import safetensors.numpy" 2>/dev/null || "$venv/bin/pip" install -q safetensors numpy
  "$venv/bin/python" -c "import transformers" 2>/dev/null || "$venv/bin/pip" install -q "transformers==4.57.1"
}

# The stacks whose own parsers check the planner's exports (ctest -L export), pinned.
install_stacks() {
  local want="$here/tests/export/requirements.txt"
  local stamp="$venv/.trainplan-stacks"
  if ! cmp -s "$want" "$stamp" 2>/dev/null; then
    echo "setup: installing the export checks' stacks into $venv (tests/export/requirements.txt)"
    DS_BUILD_OPS=0 "$venv/bin/pip" install -q --progress-bar off -r "$want"
    cp "$want" "$stamp"
  fi
}

build() {
  cmake -S "$here" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
  cmake --build "$build_dir" -j "$jobs"
}

# Configure options that switch the executor on, with LibTorch from the virtual environment.
executor_options() {
  local prefix
  prefix="$("$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)"
  # TORCH_CUDA_ARCH_LIST skips GPU detection (there may be no GPU); 9.0 = Hopper.
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
  echo "-DTRAINPLAN_BUILD_EXECUTOR=ON -DCMAKE_PREFIX_PATH=$prefix -DTRAINPLAN_PYTHON=$venv/bin/python"
}

case "$action" in
  demo)
    install_missing "${packages[@]}"
    build
    "$build_dir/planner/planner" --model 70b --gpus 64
    ;;
  test)
    install_missing "${packages[@]}" "${executor_packages[@]}"
    install_torch
    install_stacks
    # shellcheck disable=SC2046
    build $(executor_options)
    ctest --test-dir "$build_dir" --output-on-failure -j "$jobs"
    ;;
  build)
    install_missing "${packages[@]}" "${executor_packages[@]}"
    install_torch
    # shellcheck disable=SC2046
    build $(executor_options)
    ;;
  *)
    echo "usage: scripts/setup.sh [demo|test|build]" >&2
    exit 2
    ;;
esac
