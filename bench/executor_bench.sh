#!/usr/bin/env bash
# CPU step time per data-parallel strategy: runs the executor under mpirun on a 1.3 M-parameter
# Llama-style model (4 layers, hidden 256) for each strategy and prints one aligned row each
# (median step time after the first step, tokens/s, model states per rank, exposed DP wait).
#
#   bench/executor_bench.sh [BUILD_DIR] [RANKS] [STEPS]     # defaults: build 4 12
# Record results in bench/results.md with the command and the machine.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$here/build}"
ranks="${2:-4}"
steps="${3:-12}"
exe="$build/executor/executor"
[ -x "$exe" ] || { echo "executor_bench: $exe not built (scripts/setup.sh build)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

cat > "$work/model.json" <<'JSON'
{"schema": "trainplan/model/v1", "name": "bench-llama-1.3m", "source": "executor benchmark model",
 "architecture": "llama", "layers": 4, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn_hidden": 512, "vocab": 1024,
 "tied_embeddings": false, "max_seq_len": 256}
JSON

plan() {  # name zero shard micro_batch recompute
  cat > "$work/$1.json" <<JSON
{"schema": "trainplan/plan/v1", "name": "$1", "model": "$work/model.json", "cluster": "dgx-h100", "gpus": $ranks,
 "training": {"seq_len": 256, "global_batch": 16, "precision": "fp32", "optimizer": "adamw", "train_tokens": 1e6},
 "parallel": {"tp": 1, "pp": 1, "dp": $ranks, "cp": 1, "ep": 1, "zero_stage": $2, "shard_group": $3, "micro_batch": $4, "recompute": "$5"}}
JSON
}

printf "%-22s %5s %12s %12s %14s %14s %14s %12s\n" strategy ranks "step (s)" "tokens/s" "weights (MiB)" "grads (MiB)" "optim (MiB)" "DP wait (s)"
mb=$((16 / ranks))
for spec in "ddp 0 0 $mb none" "zero1 1 0 $mb none" "zero2 2 0 $mb none" "zero3 3 0 $mb none" \
            "hybrid-shard2 3 2 $mb none" "zero3+full-recompute 3 0 $mb full" "ddp+accumulation 0 0 1 none"; do
  read -r name zero shard micro recompute <<<"$spec"
  [ "$name" = hybrid-shard2 ] && [ "$ranks" -lt 4 ] && continue
  plan "$name" "$zero" "$shard" "$micro" "$recompute"
  mpirun --oversubscribe --mca btl_vader_single_copy_mechanism none -n "$ranks" "$exe" --plan "$work/$name.json" \
    --steps "$steps" --threads 1 --quiet --measurement "$work/$name.m.json" > "$work/$name.log" 2>&1 ||
    { echo "executor_bench: $name failed:" >&2; tail -5 "$work/$name.log" >&2; exit 1; }
  python3 - "$work/$name.m.json" "$name" "$ranks" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); mem = m["memory"]; t = m["time"]; th = m["throughput"]
mib = lambda b: b / 2**20
print(f"{sys.argv[2]:<22} {sys.argv[3]:>5} {t['step_seconds']:12.4f} {th['tokens_per_second']:12.0f} "
      f"{mib(mem['weights_bytes']):14.2f} {mib(mem['gradients_bytes']):14.2f} {mib(mem['optimizer_bytes']):14.2f} {t['dp_comm_exposed_seconds']:12.4f}")
PY
done
