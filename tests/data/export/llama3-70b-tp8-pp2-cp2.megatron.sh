#!/bin/bash
# Megatron-LM pretrain_gpt.py for the trainplan plan "llama3-70b-tp8-pp2-cp2":
#   llama3-70b on dgx-h100, 128 GPUs = 16 nodes x 8; tp 8, pp 2, cp 2, dp 4
#   (Megatron derives dp from the world size: 128 / (tp 8 * pp 2 * cp 2) = 4).
# Written by `planner export --to megatron`. Option names from NVIDIA/Megatron-LM d98e8a64dd:
# megatron/training/arguments.py and the dataclasses it turns into options
# (megatron/core/model_parallel_config.py, megatron/core/transformer/transformer_config.py).
# Run it from a Megatron-LM checkout on each node, with NODE_RANK (0 to 15) and MASTER_ADDR
# (the first node's host name) set.
set -euo pipefail
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
# Tensor or context parallelism: one CUDA connection, as megatron/training/arguments.py requires before Blackwell
export CUDA_DEVICE_MAX_CONNECTIONS=1

ARGS=(
  # Model: llama3-70b (Llama: RMSNorm, SwiGLU, rotary positions, no biases)
  --num-layers 80
  --hidden-size 8192
  --num-attention-heads 64
  --group-query-attention
  --num-query-groups 8
  --ffn-hidden-size 28672
  --seq-length 8192
  --max-position-embeddings 8192
  --swiglu
  --normalization RMSNorm
  --position-embedding-type rope
  --rotary-base 500000
  --disable-bias-linear
  --untie-embeddings-and-output-weights
  --attention-dropout 0.0
  --hidden-dropout 0.0
  # Parallelism: 1F1B
  --tensor-model-parallel-size 8
  --pipeline-model-parallel-size 2
  --context-parallel-size 2
  --sequence-parallel
  # ZeRO-1: Megatron's distributed optimizer shards optimizer states and fp32 master weights over dp
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  # Batch: 512 sequences per step = dp 4 x 128 micro-batches of 1; 1.5e+13 tokens
  --micro-batch-size 1
  --global-batch-size 512
  --train-iters 3576279
  # Precision
  --bf16
  # Recompute: selective (the attention core, Korthikanti et al. 2022; --recompute-modules defaults to core_attn)
  --recompute-granularity selective
  # Optimizer: Megatron's adam is AdamW (decoupled weight decay by default)
  --optimizer adam
  # Data: mock data and a null tokenizer; replace with --data-path and your tokenizer
  --mock-data
  --tokenizer-type NullTokenizer
  --vocab-size 128256
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

torchrun --nnodes 16 --nproc-per-node 8 --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port 29500 \
  pretrain_gpt.py "${ARGS[@]}"
