#!/bin/bash
# Megatron-LM pretrain_gpt.py for the trainplan plan "gpt3-175b-1024xa100":
#   gpt3-175b on dgx-a100-80g, 1024 GPUs = 128 nodes x 8; tp 8, pp 8, cp 1, dp 16
#   (Megatron derives dp from the world size: 1024 / (tp 8 * pp 8 * cp 1) = 16).
# Written by `planner export --to megatron`. Option names from NVIDIA/Megatron-LM d98e8a64dd:
# megatron/training/arguments.py and the dataclasses it turns into options
# (megatron/core/model_parallel_config.py, megatron/core/transformer/transformer_config.py).
# Run it from a Megatron-LM checkout on each node, with NODE_RANK (0 to 127) and MASTER_ADDR
# (the first node's host name) set.
set -euo pipefail
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
# Tensor or context parallelism: one CUDA connection, as megatron/training/arguments.py requires before Blackwell
export CUDA_DEVICE_MAX_CONNECTIONS=1

ARGS=(
  # Model: gpt3-175b (GPT: LayerNorm, GELU, learned positions, biases)
  --num-layers 96
  --hidden-size 12288
  --num-attention-heads 96
  --ffn-hidden-size 49152
  --seq-length 2048
  --max-position-embeddings 2048
  --normalization LayerNorm
  --position-embedding-type learned_absolute
  --attention-dropout 0.0
  --hidden-dropout 0.0
  # Parallelism: interleaved 1F1B with 2 model chunks per pipeline rank (96 / (8 * 2) = 6 layers each)
  --tensor-model-parallel-size 8
  --pipeline-model-parallel-size 8
  --num-layers-per-virtual-pipeline-stage 6
  --sequence-parallel
  # ZeRO-1: Megatron's distributed optimizer shards optimizer states and fp32 master weights over dp
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  # Batch: 1536 sequences per step = dp 16 x 96 micro-batches of 1; 3e+11 tokens
  --micro-batch-size 1
  --global-batch-size 1536
  --train-iters 95368
  # Precision
  --bf16
  # Recompute: every layer of every stage
  --recompute-granularity full
  --recompute-method uniform
  --recompute-num-layers 1
  # Optimizer: Megatron's adam is AdamW (decoupled weight decay by default)
  --optimizer adam
  # Data: mock data and a null tokenizer; replace with --data-path and your tokenizer
  --mock-data
  --tokenizer-type NullTokenizer
  --vocab-size 51200
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

torchrun --nnodes 128 --nproc-per-node 8 --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port 29500 \
  pretrain_gpt.py "${ARGS[@]}"
