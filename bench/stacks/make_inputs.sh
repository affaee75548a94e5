#!/usr/bin/env bash
# The plans and exports that bench/stack_runs.sh runs on one GPU (issue 32), written by the planner:
#   bench/stacks/make_inputs.sh [PLANNER]      (default build/planner/planner; run from the repository root)
# Each export's header line "trainplan predicts for the STACK stack: ..." is the prediction the run is put against.
set -euo pipefail
planner="${1:-build/planner/planner}"
d=bench/stacks
common=(--gpus 1 --cluster dgx-h200 --seq-len 8192 --global-batch 2 --fix offload=none --quiet --top 1)
# torchtitan: Llama 3 8B's layer x 16, local batch 2, per-operator selective recompute (torchtitan's llama3_8b.toml
# settings at seq 8192), eager and compiled, bf16 and torchao float8
"$planner" --model $d/llama3-8b-16l.json "${common[@]}" --stack fsdp2-compile --fix micro_batch=2 --fix recompute=selective --save-plan $d/titan-bf16-compile.plan.json > /dev/null
"$planner" --model $d/llama3-8b-16l.json "${common[@]}" --stack fsdp2-compile --precision fp8 --fix micro_batch=2 --fix recompute=selective --save-plan $d/titan-fp8-compile.plan.json > /dev/null
"$planner" --model $d/llama3-8b-16l.json "${common[@]}" --stack fsdp2 --fix micro_batch=2 --fix recompute=selective --save-plan $d/titan-bf16-eager.plan.json > /dev/null
# The same layer at 32K tokens (x 8, one sequence a step), eager and compiled; and eager with full recompute
long=(--gpus 1 --cluster dgx-h200 --seq-len 32768 --global-batch 1 --fix offload=none --quiet --top 1 --fix micro_batch=1 --fix recompute=selective)
"$planner" --model $d/llama3-8b-8l.json "${long[@]}" --stack fsdp2 --save-plan $d/titan-bf16-eager-32k.plan.json > /dev/null
"$planner" --model $d/llama3-8b-8l.json "${long[@]}" --stack fsdp2-compile --save-plan $d/titan-bf16-compile-32k.plan.json > /dev/null
"$planner" --model $d/llama3-8b-16l.json "${common[@]}" --stack fsdp2 --fix micro_batch=2 --fix recompute=full --save-plan $d/titan-bf16-eager-full.plan.json > /dev/null
# DeepSpeed ZeRO-3 and Accelerate: Llama 3 8B's layer x 8 as a Hugging Face model, micro-batch 1, 2 micro-batches a step;
# its SDPA under torch 2.11 takes cuDNN's kernel (the profile's measured table), which the plans state
"$planner" --model $d/llama3-8b-8l.json "${common[@]}" --stack deepspeed --attention-kernel profile --fix zero=3 --fix micro_batch=1 --fix recompute=none --save-plan $d/deepspeed-zero3.plan.json > /dev/null
"$planner" --model $d/llama3-8b-8l.json "${common[@]}" --stack fsdp1 --attention-kernel profile --fix zero=3 --fix micro_batch=1 --fix recompute=none --save-plan $d/accelerate.plan.json > /dev/null
for run in titan-bf16-compile titan-fp8-compile titan-bf16-eager titan-bf16-eager-32k titan-bf16-compile-32k titan-bf16-eager-full; do "$planner" export $d/$run.plan.json --to torchtitan --out $d/$run.toml; done
"$planner" export $d/deepspeed-zero3.plan.json --to deepspeed --out $d/deepspeed-zero3.json
"$planner" export $d/accelerate.plan.json --to accelerate --out $d/accelerate.yaml
