#!/usr/bin/env bash
# The executor against the same model in PyTorch eager Python, on one device, in one run: the
# executor trains the plan (executor --plan), bench/eager_reference.py trains the same model on
# batches of the same shape the same way, and the cost model estimates the plan (planner
# evaluate). Prints step time, tokens/s, MFU and peak memory of all three and writes them to one
# JSON document.
#
#   bench/eager_bench.sh [BUILD_DIR] [DEVICE] [MODEL] [SEQ] [MICRO] [GLOBAL] [STEPS] [OUT_JSON]
#   defaults: build cpu (a 6.4 M-parameter Llama-style model) 256 4 8 6 (no JSON)
#   GPU (issue 3's target, an H200): bench/eager_bench.sh build cuda samples/models/llama3.2-1b.json 2048 4 32 12 bench/gpu/llama3.2-1b-h200.json
# Environment: PRECISION (bf16 or fp32, default bf16), CLUSTER (default dgx-h200: the peak used
# for MFU), THREADS (CPU threads for both, default the cores), PYTHON (default .venv/bin/python).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$here/build}"
device="${2:-cpu}"
model="${3:-}"
seq="${4:-256}"
micro="${5:-4}"
global="${6:-8}"
steps="${7:-6}"
out="${8:-}"
precision="${PRECISION:-bf16}"
cluster="${CLUSTER:-dgx-h200}"
threads="${THREADS:-$(nproc)}"
python="${PYTHON:-$here/.venv/bin/python}"
exe="$build/executor/executor"
planner="$build/planner/planner"
[ -x "$exe" ] || { echo "eager_bench: $exe not built (scripts/setup.sh build)" >&2; exit 2; }
[ -x "$planner" ] || { echo "eager_bench: $planner not built" >&2; exit 2; }
"$python" -c "import torch" 2>/dev/null || { echo "eager_bench: $python cannot import torch (scripts/setup.sh installs it into .venv)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [ -z "$model" ]; then
  model="$work/model.json"
  cat > "$model" <<'JSON'
{"schema": "trainplan/model/v1", "name": "bench-llama-6m", "source": "eager benchmark model",
 "architecture": "llama", "layers": 8, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn_hidden": 768, "vocab": 256,
 "tied_embeddings": false, "max_seq_len": 256}
JSON
fi
model="$(cd "$(dirname "$model")" && pwd)/$(basename "$model")"
cat > "$work/plan.json" <<JSON
{"schema": "trainplan/plan/v1", "name": "eager-bench", "model": "$model", "cluster": "$cluster", "gpus": 1,
 "training": {"seq_len": $seq, "global_batch": $global, "precision": "$precision", "optimizer": "adamw", "train_tokens": 1e9},
 "parallel": {"tp": 1, "pp": 1, "dp": 1, "zero_stage": 0, "micro_batch": $micro, "recompute": "none"}}
JSON

echo "eager_bench: $(basename "$model") seq $seq, micro-batch $micro, global batch $global, $precision, $steps steps on $device ($threads CPU threads)"
"$planner" evaluate "$work/plan.json" --format json > "$work/estimate.json"
echo "eager_bench: executor ..."
"$exe" --plan "$work/plan.json" --device "$device" --steps "$steps" --threads "$threads" --measurement "$work/executor.json" | tail -3
echo "eager_bench: PyTorch eager ..."
"$python" "$here/bench/eager_reference.py" --model "$model" --seq-len "$seq" --micro-batch "$micro" --global-batch "$global" \
  --precision "$precision" --steps "$steps" --device "$device" --threads "$threads" --out "$work/eager.json" | tail -2

"$python" - "$work" "$out" "$*" <<'PY'
import json, os, platform, subprocess, sys
work, out, args = sys.argv[1], sys.argv[2], sys.argv[3]
est = json.load(open(f"{work}/estimate.json")); ex = json.load(open(f"{work}/executor.json")); eg = json.load(open(f"{work}/eager.json"))
gib = lambda b: "-" if not b else f"{b / 2**30:.2f}"
pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"
ex_tps = ex["throughput"]["tokens_per_second"]
ex_mfu = ex["throughput"].get("mfu")
# Same model, same FLOPs per token: the eager run's MFU scales with its tokens/s.
eg_mfu = None if ex_mfu is None else ex_mfu * eg["tokens_per_second"] / ex_tps
rows = [(f"cost model ({est['cluster']})", est["time"]["step_seconds"], est["throughput"]["tokens_per_second"], est["throughput"]["mfu"], est["memory"]["total_bytes"]),
        ("executor", ex["time"]["step_seconds"], ex_tps, ex_mfu, ex["memory"].get("total_bytes")),
        ("pytorch eager", eg["step_seconds"], eg["tokens_per_second"], eg_mfu, eg["peak_memory_bytes"])]
print(f"{'':<22} {'step (s)':>10} {'tokens/s':>12} {'MFU':>7} {'peak (GiB)':>11}")
for name, s, tps, mfu, peak in rows:
    print(f"{name:<22} {s:10.4f} {tps:12.0f} {pct(mfu):>7} {gib(peak):>11}")
print(f"executor / eager speed: {ex_tps / eg['tokens_per_second']:.3f}x; parameters: executor {ex['parameters']:.0f}, eager {eg['parameters']:.0f}")
if out:
    gpu = ""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    doc = {"schema": "trainplan/bench/eager/v1", "command": "bench/eager_bench.sh " + args,
           "machine": {"host": platform.node(), "cpus": os.cpu_count(), "gpu": gpu or None},
           "estimate": est, "executor": ex, "eager": eg,
           "executor_over_eager": ex_tps / eg["tokens_per_second"]}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    json.dump(doc, open(out, "w"), indent=1)
    print(f"written: {out}")
PY
