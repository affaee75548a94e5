#!/usr/bin/env bash
# Exactness of the executor's fused paths (issue 12, item 5): trains one plan twice from the same
# initialisation and data, with --kernels reference (plain ATen, executor/src/model/model.cpp) and with
# --kernels fused (executor/src/model/fused_ops.hpp and LibTorch's fused AdamW), and compares the losses
# step by step, and the first step's gradient norm (AdamW's update hardly changes when every
# gradient is scaled alike, so a gradient counted twice or scaled wrongly would not show in the
# losses; at step 1 both paths hold the same parameters, so their norms differ by rounding only).
#
#   bench/fused_exactness.sh BUILD_DIR DEVICE MODEL SEQ MICRO GLOBAL STEPS [OUT_JSON]
#   GPU (issue 12's plan): CLUSTER=dgx-h100 bench/fused_exactness.sh build cuda samples/models/llama3.2-1b.json 2048 4 32 10 out.json
#
# Tolerance, relative to the reference loss of each step: bf16 2^-8 (one unit of bf16 rounding:
# the two paths compute the same arithmetic in another order, so their float32 masters drift by
# rounding only, and the worst that drift can do to a step's loss is flip the bf16 rounding of
# the compute copy, which moves a logit by 2^-8 of itself); fp32 1e-5 (summation order in float32
# over the same steps; tests/executor/equivalence_test.cpp uses the same bound across ranks).
# Exit 0 when every step is within it, 1 when one is not, 2 on bad input.
# Environment: PRECISION (bf16 or fp32, default bf16), CLUSTER (default dgx-h100), THREADS
# (CPU threads), PYTHON (default .venv/bin/python, else python3).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ $# -ge 7 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
build="$1" device="$2" model="$3" seq="$4" micro="$5" global="$6" steps="$7" out="${8:-}"
precision="${PRECISION:-bf16}"
cluster="${CLUSTER:-dgx-h100}"
threads="${THREADS:-0}"
python="${PYTHON:-$here/.venv/bin/python}"
[ -x "$python" ] || python=python3
exe="$build/executor/executor"
[ -x "$exe" ] || { echo "fused_exactness: $exe not built" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$here/bench/one_gpu_plan.sh" fused-exactness "$model" "$cluster" "$seq" "$micro" "$global" "$precision" > "$work/plan.json"
for kernels in reference fused; do
  echo "fused_exactness: --kernels $kernels, $(basename "$model") seq $seq, micro-batch $micro, global batch $global, $precision, $steps steps on $device"
  "$exe" --plan "$work/plan.json" --device "$device" --steps "$steps" --threads "$threads" --kernels "$kernels" --quiet \
    --measurement "$work/$kernels.json" | tail -1
done
"$python" - "$work" "$precision" "$out" "$*" <<'PY'
import json, sys
work, precision, out, args = sys.argv[1:5]
ref, fused = (json.load(open(f"{work}/{k}.json")) for k in ("reference", "fused"))
tolerance = 2.0 ** -8 if precision == "bf16" else 1e-5
rows, worst = [], 0.0
print(f"{'step':>4} {'reference loss':>15} {'fused loss':>15} {'relative diff':>14}")
for i, (a, b) in enumerate(zip(ref["losses"], fused["losses"]), 1):
    rel = abs(b - a) / abs(a)
    worst = max(worst, rel)
    rows.append({"step": i, "reference": a, "fused": b, "relative_difference": rel})
    print(f"{i:4d} {a:15.6f} {b:15.6f} {rel:14.2e}")
norm_ref, norm_fused = ref["steps"][0]["grad_norm"], fused["steps"][0]["grad_norm"]
norm_diff = abs(norm_fused - norm_ref) / abs(norm_ref)
print(f"step 1 gradient norm: reference {norm_ref:.6g}, fused {norm_fused:.6g}, relative difference {norm_diff:.2e}")
ok = len(ref["losses"]) == len(fused["losses"]) and worst <= tolerance and norm_diff <= tolerance
speed = fused["throughput"]["tokens_per_second"] / ref["throughput"]["tokens_per_second"]
print(f"worst relative difference {worst:.2e}, tolerance {tolerance:.2e} ({precision}): {'within' if ok else 'OUTSIDE'}; "
      f"fused / reference speed {speed:.3f}x")
if out:
    json.dump({"schema": "trainplan/bench/fused-exactness/v1", "command": "bench/fused_exactness.sh " + args,
               "precision": precision, "tolerance": tolerance, "worst_relative_difference": worst,
               "first_step_grad_norm_relative_difference": norm_diff, "within": ok,
               "steps": rows, "reference": ref, "fused": fused}, open(out, "w"), indent=1)
sys.exit(0 if ok else 1)
PY
