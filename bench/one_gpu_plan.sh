#!/usr/bin/env bash
# Writes to stdout the one-device plan that bench/eager_bench.sh and bench/fused_exactness.sh
# train: no parallelism, ZeRO 0, no recompute, AdamW, the model file by its absolute path.
#
#   bench/one_gpu_plan.sh NAME MODEL CLUSTER SEQ MICRO GLOBAL PRECISION
set -euo pipefail
[ $# -eq 7 ] || { sed -n '5p' "$0" >&2; exit 2; }
name="$1" model="$2" cluster="$3" seq="$4" micro="$5" global="$6" precision="$7"
model="$(cd "$(dirname "$model")" && pwd)/$(basename "$model")"
cat <<JSON
{"schema": "trainplan/plan/v1", "name": "$name", "model": "$model", "cluster": "$cluster", "gpus": 1,
 "training": {"seq_len": $seq, "global_batch": $global, "precision": "$precision", "optimizer": "adamw", "train_tokens": 1e9},
 "parallel": {"tp": 1, "pp": 1, "dp": 1, "zero_stage": 0, "micro_batch": $micro, "recompute": "none"}}
JSON
