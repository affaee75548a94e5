#!/usr/bin/env bash
# fp8 training against bf16 (issue 31): the executor trains the same one-device plan twice, in bf16
# and in fp8 (executor/src/model/fp8.hpp), from the same initial weights (--seed) on the same data
# (synthetic, seeded), and sets the two loss curves side by side: the relative gap per step, its
# largest value over the run and over the second half, and each curve's mean over its last 20
# steps. The acceptance bound is 1% (the fp8 curve within 1% of the bf16 curve).
#
#   bench/fp8_loss.sh BUILD_DIR DEVICE MODEL SEQ MICRO GLOBAL STEPS [OUT_JSON]
#   GPU (issue 31): CLUSTER=dgx-h200 bench/fp8_loss.sh build-gpu cuda samples/models/llama3.2-1b.json 2048 4 4 200 out.json
#   CPU (the paths only; fp8 GEMMs are LibTorch's reference kernels there, slow):
#     bench/fp8_loss.sh build cpu samples/models/tiny-llama.json 64 2 4 10
# Environment: CLUSTER (default dgx-h200), THREADS (CPU threads, default the cores), PYTHON
# (default .venv/bin/python, else python3). Exit 0 when both ran and the bound holds, 1 when
# the gap exceeds it, 2 on bad input or a failed run.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ $# -ge 7 ] || { sed -n '7,10p' "$0" >&2; exit 2; }
build="$1" device="$2" model="$3" seq="$4" micro="$5" global="$6" steps="$7" out="${8:-}"
cluster="${CLUSTER:-dgx-h200}" threads="${THREADS:-$(nproc)}"
python="${PYTHON:-$here/.venv/bin/python}"
[ -x "$python" ] || python=python3
exe="$build/executor/executor"
[ -x "$exe" ] || { echo "fp8_loss: $exe not built" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for precision in bf16 fp8; do
  "$here/bench/one_gpu_plan.sh" "fp8-loss-$precision" "$model" "$cluster" "$seq" "$micro" "$global" "$precision" > "$work/$precision.plan.json"
  echo "fp8_loss: $precision, $steps steps ..."
  "$exe" --plan "$work/$precision.plan.json" --device "$device" --steps "$steps" --seed 7 --threads "$threads" --quiet \
    --measurement "$work/$precision.json" > "$work/$precision.log" 2>&1 || { tail -20 "$work/$precision.log" >&2; exit 2; }
  tail -2 "$work/$precision.log"
done
"$python" - "$work" "$out" "$*" <<'PY'
import json, os, sys
work, out, args = sys.argv[1:4]
runs = {p: json.load(open(f"{work}/{p}.json")) for p in ("bf16", "fp8")}
loss = {p: r["losses"] for p, r in runs.items()}
a, b = loss["bf16"], loss["fp8"]
if len(a) != len(b) or not a:
    sys.exit("fp8_loss: the runs' loss curves differ in length")
gap = [abs(y - x) / abs(x) for x, y in zip(a, b)]
half = len(gap) // 2
tail = min(20, len(a))
summary = {"steps": len(a), "max_relative_gap": max(gap), "max_relative_gap_second_half": max(gap[half:]),
           "mean_last_bf16": sum(a[-tail:]) / tail, "mean_last_fp8": sum(b[-tail:]) / tail,
           "first_loss": a[0], "last_loss_bf16": a[-1], "last_loss_fp8": b[-1]}
summary["mean_last_relative_gap"] = abs(summary["mean_last_fp8"] - summary["mean_last_bf16"]) / summary["mean_last_bf16"]
summary["within_1_percent"] = summary["max_relative_gap"] <= 0.01
for k in range(0, len(a), max(1, len(a) // 10)):
    print(f"step {k + 1:5d}  bf16 {a[k]:9.5f}  fp8 {b[k]:9.5f}  gap {100 * gap[k]:6.3f}%")
print(f"largest gap {100 * summary['max_relative_gap']:.3f}% (second half {100 * summary['max_relative_gap_second_half']:.3f}%); "
      f"last {tail} steps: bf16 {summary['mean_last_bf16']:.5f}, fp8 {summary['mean_last_fp8']:.5f}")
for p, r in runs.items():
    print(f"{p}: {r['throughput']['tokens_per_second']:.0f} tokens/s, step {r['time']['step_seconds']:.4f} s")
if out:
    doc = {"schema": "trainplan/bench/fp8-loss/v1", "command": "bench/fp8_loss.sh " + args, "summary": summary,
           "losses": loss, "relative_gap": gap, "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    json.dump(doc, open(out, "w"), indent=1)
    print(f"written: {out}")
sys.exit(0 if summary["within_1_percent"] else 1)
PY
