#!/bin/bash
# Megatron-LM pretrain_gpt.py for the trainplan plan "mixtral-8x7b-ep8-fp8":
#   mixtral-8x7b on dgx-h100, 64 GPUs = 8 nodes x 8; tp 2, pp 1, cp 1, dp 32, ep 8
#   (Megatron derives dp from the world size: 64 / (tp 2 * pp 1 * cp 1) = 32).
# Written by `planner export --to megatron`. Option names from NVIDIA/Megatron-LM d98e8a64dd:
# megatron/training/arguments.py and the dataclasses it turns into options
# (megatron/core/model_parallel_config.py, megatron/core/transformer/transformer_config.py).
# Run it from a Megatron-LM checkout on each node, with NODE_RANK (0 to 7) and MASTER_ADDR
# (the first node's host name) set.
set -euo pipefail
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
# Tensor or context parallelism: one CUDA connection, as megatron/training/arguments.py requires before Blackwell
export CUDA_DEVICE_MAX_CONNECTIONS=1

ARGS=(
  # Model: mixtral-8x7b (Llama: RMSNorm, SwiGLU, rotary positions, no biases)
  --num-layers 32
  --hidden-size 4096
  --num-attention-heads 32
  --group-query-attention
  --num-query-groups 8
  --ffn-hidden-size 14336
  --seq-length 4096
  --max-position-embeddings 32768
  --swiglu
  --normalization RMSNorm
  --position-embedding-type rope
  --rotary-base 1000000
  --disable-bias-linear
  --untie-embeddings-and-output-weights
  --attention-dropout 0.0
  --hidden-dropout 0.0
  # Mixture of experts: every layer's MLP
  --num-experts 8
  --moe-router-topk 2
  --moe-ffn-hidden-size 14336
  # Parallelism
  --tensor-model-parallel-size 2
  --pipeline-model-parallel-size 1
  --expert-model-parallel-size 8
  --sequence-parallel
  # ZeRO-1: Megatron's distributed optimizer shards optimizer states and fp32 master weights over dp
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  # Batch: 256 sequences per step = dp 32 x 8 micro-batches of 1; 1e+12 tokens
  --micro-batch-size 1
  --global-batch-size 256
  --train-iters 953675
  # Precision: fp8 matrix multiplies through Transformer Engine (e4m3 forward, e5m2 gradients), bf16 elsewhere
  --bf16
  --fp8-format hybrid
  # fp8 current scaling (Transformer Engine's Float8CurrentScaling), as the plan states; Megatron's default is delayed
  --fp8-recipe tensorwise
  # Recompute: 4 layers of each pipeline stage
  --recompute-granularity full
  --recompute-method block
  --recompute-num-layers 4
  # Optimizer: Megatron's adam is AdamW (decoupled weight decay by default)
  --optimizer adam
  # Data: mock data and a null tokenizer; replace with --data-path and your tokenizer
  --mock-data
  --tokenizer-type NullTokenizer
  --vocab-size 32000
  # Not in the plan: learning-rate schedule and optimizer settings (Llama 2's); set yours
  --lr 3.0e-4
  --min-lr 3.0e-5
  --lr-decay-style cosine
  --lr-warmup-fraction 0.01
  --weight-decay 0.1
  --adam-beta1 0.9
  --adam-beta2 0.95
  --clip-grad 1.0
)

torchrun --nnodes 8 --nproc-per-node 8 --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port 29500 \
  pretrain_gpt.py "${ARGS[@]}"
