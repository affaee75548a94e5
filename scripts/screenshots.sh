#!/usr/bin/env bash
# Renders the screenshots of README.md and docs/gui.md of the planning app (trainplan-gui) to PNG on Qt's offscreen
# platform (no display needed; `xvfb-run scripts/screenshots.sh` works as well):
#   docs/gui-main.png      the main window, llama3-70b on 64 GPUs (dgx-h100)
#   docs/gui-pipeline.png  the pipeline schedule of the best tp=8 pp=8 1F1B plan for llama3-70b on 64 GPUs
#                          (global batch 16 sequences, so that each of the 16 micro-batches is readable)
#   docs/gui-measured.png  the "Measured vs predicted" view: an executor measurement over its plan
#
#   scripts/screenshots.sh [MEASUREMENT [PLAN]]
#
# MEASUREMENT defaults to samples/measurements/tiny-llama-pp4.measurement.json (a real executor
# run of PLAN, default samples/plans/tiny-llama-pp4.json, on 4 CPU ranks).
# Environment: BUILD_DIR (default build), OUT_DIR (default docs).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$here/build}"
out="${OUT_DIR:-$here/docs}"
# Relative to the repository, so that the pictures show no machine's paths.
cd "$here"
measurement="${1:-samples/measurements/tiny-llama-pp4.measurement.json}"
plan="${2:-samples/plans/tiny-llama-pp4.json}"
gui="$build_dir/gui/trainplan-gui"
[ -x "$gui" ] || { echo "screenshots: $gui not built (cmake --build $build_dir --target trainplan-gui)" >&2; exit 2; }

export QT_QPA_PLATFORM="${QT_QPA_PLATFORM:-offscreen}"
runtime="$(mktemp -d)"
trap 'rm -rf "$runtime"' EXIT
export XDG_RUNTIME_DIR="$runtime"
mkdir -p "$out"

"$gui" --model llama3-70b --gpus 64 --size 1800x1100 --tab breakdown --screenshot "$out/gui-main.png"
echo "wrote $out/gui-main.png"
"$gui" --model llama3-70b --gpus 64 --fix tp=8 --fix pp=8 --fix schedule=1f1b --global-batch 16 --size 1800x1100 --tab pipeline --screenshot "$out/gui-pipeline.png"
echo "wrote $out/gui-pipeline.png"
# The "Measured vs predicted" page alone, from a large window so that its tables and charts have room.
"$gui" --plan "$plan" --measurement "$measurement" --size 2600x1500 --tab compare --export-chart comparison="$out/gui-measured.png"
echo "wrote $out/gui-measured.png"
