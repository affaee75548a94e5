#!/usr/bin/env bash
# Pipeline schedules on CPU ranks: runs the executor under mpirun for GPipe, 1F1B and interleaved
# 1F1B on a Llama-style model (8 layers, hidden 256, seq 128; 8 micro-batches of 2) and prints
# the measured bubble (idle time within the step over compute time, per rank, median over steps
# 2..N) beside the cost model's simulation of the same schedule and the closed form
# (p-1)/(v m), plus the step time and the micro-batches each stage held.
#
#   bench/pipeline_bench.sh [BUILD_DIR] [STAGES] [STEPS]     # defaults: build 2 8
# STAGES ranks must have a core each, or pass times depend on how many stages compute at once.
# Record results in bench/results.md with the command and the machine.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$here/build}"
stages="${2:-2}"
steps="${3:-8}"
exe="$build/executor/executor"
[ -x "$exe" ] || { echo "pipeline_bench: $exe not built (scripts/setup.sh build)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

cat > "$work/model.json" <<'JSON'
{"schema": "trainplan/model/v1", "name": "bench-llama-8l", "source": "pipeline benchmark model",
 "architecture": "llama", "layers": 8, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn_hidden": 768, "vocab": 256,
 "tied_embeddings": false, "max_seq_len": 128}
JSON

printf "%-12s %6s %10s %10s %10s %10s %12s  %s\n" schedule stages measured simulated "(p-1)/vm" "step (s)" "tokens/s" "in flight per stage"
for spec in "gpipe 1" "1f1b 1" "interleaved 2"; do
  read -r schedule chunks <<<"$spec"
  cat > "$work/$schedule.json" <<JSON
{"schema": "trainplan/plan/v1", "name": "$schedule", "model": "$work/model.json", "cluster": "dgx-h100", "gpus": $stages,
 "training": {"seq_len": 128, "global_batch": 16, "precision": "fp32", "optimizer": "adamw", "train_tokens": 1e6},
 "parallel": {"tp": 1, "pp": $stages, "dp": 1, "cp": 1, "ep": 1, "zero_stage": 0, "micro_batch": 2,
              "schedule": "$schedule", "virtual_stages": $chunks, "recompute": "none"}}
JSON
  mpirun --oversubscribe --mca btl_vader_single_copy_mechanism none -n "$stages" "$exe" --plan "$work/$schedule.json" \
    --steps "$steps" --threads 1 --quiet --measurement "$work/$schedule.m.json" > "$work/$schedule.log" 2>&1 ||
    { echo "pipeline_bench: $schedule failed:" >&2; tail -5 "$work/$schedule.log" >&2; exit 1; }
  python3 - "$work/$schedule.m.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); t = m["trace"]
closed = (t["stages"] - 1) / (t["virtual_stages"] * t["micro_batches"])
print(f"{t['schedule']:<12} {t['stages']:>6} {t['bubble_fraction']:10.3f} {t['predicted_bubble_fraction']:10.3f} {closed:10.3f} "
      f"{m['time']['step_seconds']:10.3f} {m['throughput']['tokens_per_second']:12.0f}  {' '.join(f'{x:g}' for x in t['peak_in_flight'])}")
PY
done
