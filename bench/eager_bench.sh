#!/usr/bin/env bash
# The executor against the same model in PyTorch, on one device, in one run: the executor trains
# the plan (executor --plan); bench/eager_reference.py trains the same model on batches of the same
# shape the same way, eager and under torch.compile, and so does Hugging Face transformers'
# LlamaForCausalLM of the same shape (the peers); the cost model estimates the plan (planner
# evaluate). Prints step time, tokens/s, MFU and peak memory (allocated and reserved) of each and
# writes them to one JSON document. A peer whose package is missing (transformers) or that fails
# (torch.compile without a working compiler) is skipped with the reason; the others still run.
#
#   bench/eager_bench.sh [BUILD_DIR] [DEVICE] [MODEL] [SEQ] [MICRO] [GLOBAL] [STEPS] [OUT_JSON]
#   defaults: build cpu (a 6.4 M-parameter Llama-style model) 256 4 8 6 (no JSON)
#   GPU (issue 12's plan, an H100): CLUSTER=dgx-h100 bench/eager_bench.sh build cuda samples/models/llama3.2-1b.json 2048 4 32 12 bench/gpu/llama3.2-1b-h100.json
# Environment: PRECISION (bf16, fp32 or fp8, default bf16: fp8 trains the executor's plan in fp8
# and the peers in bf16, so name a float8 peer), CLUSTER (default dgx-h200: the peak used
# for MFU), THREADS (CPU threads for all, default the cores), PYTHON (default .venv/bin/python),
# PEERS (comma-separated, default eager,compile,hf,hf-compile; also compile-float8 and
# eager-float8: the model under torchao's float8 training, the tensorwise recipe, which needs
# torchao; none: the executor and the cost model only).
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
peers="${PEERS:-eager,compile,hf,hf-compile}"
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
"$here/bench/one_gpu_plan.sh" eager-bench "$model" "$cluster" "$seq" "$micro" "$global" "$precision" > "$work/plan.json"

echo "eager_bench: $(basename "$model") seq $seq, micro-batch $micro, global batch $global, $precision, $steps steps on $device ($threads CPU threads)"
"$planner" evaluate "$work/plan.json" --format json > "$work/estimate.json"
echo "eager_bench: executor ..."
"$exe" --plan "$work/plan.json" --device "$device" --steps "$steps" --threads "$threads" --measurement "$work/executor.json" | tail -3
ran=()
[ "$peers" = none ] && peers=""
peer_precision="$precision"
[ "$precision" = fp8 ] && peer_precision=bf16  # the peers' fp8 is torchao's float8 peers
for peer in ${peers//,/ }; do
  case "$peer" in
    eager) flags=() ;;
    compile) flags=(--compile) ;;
    hf) flags=(--impl hf) ;;
    hf-compile) flags=(--impl hf --compile) ;;
    eager-float8) flags=(--float8) ;;
    compile-float8) flags=(--compile --float8) ;;
    *) echo "eager_bench: PEERS: unknown peer \"$peer\" (eager, compile, hf, hf-compile, eager-float8, compile-float8)" >&2; exit 2 ;;
  esac
  if [[ "$peer" == *float8 ]] && ! "$python" -c "import torchao.float8" 2>/dev/null; then
    echo "eager_bench: $peer skipped: $python cannot import torchao.float8 (pip install torchao)"
    continue
  fi
  if [[ "$peer" == hf* ]] && ! "$python" -c "import transformers" 2>/dev/null; then
    echo "eager_bench: $peer skipped: $python cannot import transformers (pip install transformers)"
    continue
  fi
  echo "eager_bench: $peer ..."
  if "$python" "$here/bench/eager_reference.py" --model "$model" --seq-len "$seq" --micro-batch "$micro" --global-batch "$global" \
       --precision "$peer_precision" --steps "$steps" --device "$device" --threads "$threads" --out "$work/$peer.json" "${flags[@]}" \
       > "$work/$peer.log" 2>&1; then
    tail -1 "$work/$peer.log"
    ran+=("$peer")
  else
    echo "eager_bench: $peer skipped: it failed; the end of its output:"
    tail -5 "$work/$peer.log" | sed 's/^/  /'
  fi
done

"$python" - "$work" "$out" "$*" "${ran[@]}" <<'PY'
import json, os, platform, subprocess, sys
work, out, args, ran = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
est = json.load(open(f"{work}/estimate.json")); ex = json.load(open(f"{work}/executor.json"))
peers = {name: json.load(open(f"{work}/{name}.json")) for name in ran}
labels = {"eager": "pytorch eager", "compile": "pytorch compiled", "hf": "hf transformers eager", "hf-compile": "hf transformers compiled",
          "eager-float8": "torchao float8 eager", "compile-float8": "torchao float8 compiled"}
gib = lambda b: "-" if not b else f"{b / 2**30:.2f}"
pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"
ex_tps = ex["throughput"]["tokens_per_second"]
ex_mfu = ex["throughput"].get("mfu")
mem = ex["memory"]
rows = [(f"cost model ({est['cluster']})", est["time"]["step_seconds"], est["throughput"]["tokens_per_second"], est["throughput"]["mfu"],
         est["memory"]["total_bytes"], est["memory"].get("reserved_bytes")),
        ("executor", ex["time"]["step_seconds"], ex_tps, ex_mfu, mem.get("total_bytes"), mem.get("reserved_bytes"))]
for name, p in peers.items():
    # Same model, same FLOPs per token: a peer's MFU scales with its tokens/s.
    mfu = None if ex_mfu is None else ex_mfu * p["tokens_per_second"] / ex_tps
    rows.append((labels[name], p["step_seconds"], p["tokens_per_second"], mfu, p["peak_memory_bytes"], p.get("peak_reserved_bytes")))
print(f"{'':<26} {'step (s)':>10} {'tokens/s':>12} {'MFU':>7} {'allocated (GiB)':>16} {'reserved (GiB)':>15}")
for name, s, tps, mfu, peak, reserved in rows:
    print(f"{name:<26} {s:10.4f} {tps:12.0f} {pct(mfu):>7} {gib(peak):>16} {gib(reserved):>15}")
for name, p in peers.items():
    print(f"executor / {name} speed: {ex_tps / p['tokens_per_second']:.3f}x; parameters: executor {ex['parameters']:.0f}, {name} {p['parameters']:.0f}")
if peers:
    best = max(peers, key=lambda n: peers[n]["tokens_per_second"])
    print(f"fastest peer: {labels[best]}; executor / fastest: {ex_tps / peers[best]['tokens_per_second']:.3f}x")
if out:
    gpu = ""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    doc = {"schema": "trainplan/bench/eager/v2", "command": "bench/eager_bench.sh " + args,
           "machine": {"host": platform.node(), "cpus": os.cpu_count(), "gpu": gpu or None},
           "estimate": est, "executor": ex, "peers": peers,
           "executor_over_peer": {n: ex_tps / p["tokens_per_second"] for n, p in peers.items()}}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    json.dump(doc, open(out, "w"), indent=1)
    print(f"written: {out}")
PY
