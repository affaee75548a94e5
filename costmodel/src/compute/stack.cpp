#include "trainplan/costmodel/stack.hpp"

namespace trainplan::costmodel {

namespace {

// Optimizer bytes per fp32 parameter (fused mixed-precision AdamW moves 32):
//  trainplan (--kernels fused): at::_fused_adamw_ over each unit's flat fp32 buffers (32); the
//    rest: gradient norm with one _foreach_norm (4), zeroing the fp32 gradients (4), copying the
//    fp32 masters into the bf16 weights (6) = 14; about 1 launch per parameter tensor.
//  trainplan-reference (--kernels reference, the executor before its fused paths): AdamW as ATen
//    ops over each unit's flat fp32 buffers (engine.cpp optimizer_step): g = grad * c (8), exp_avg
//    mul_ (8) and add_ (12), exp_avg_sq mul_ (8) and addcmul_ (16), sqrt (8), division (8), + eps
//    (8), decay mul_ (8), addcdiv_ (16), copy into the bf16 weights (6) = 106 = 3.31 x 32; the
//    rest: gradient norm pow + sum (12), zeroing (4) = 16; about 5 launches per parameter tensor
//    (per-slot decay and norm ops).
//  pytorch-eager / torch-compile (bench/eager_reference.py): fused AdamW (32); the rest:
//    master.grad = w.grad.float() (6), clip_grad_norm_ foreach norm and scale (4 + 8),
//    _foreach_copy_ into the bf16 weights (6) = 24.
//  megatron-te: distributed fused Adam (32); the rest: norm (4), copy of the main params into the
//    bf16 weights (6) = 10; and over the whole local main-grad buffer (in the reduce dtype:
//    arguments.py, --bf16 sets accumulate_allreduce_grads_in_fp32 unless --grad-reduce-in-bf16),
//    zero_grad_buffer at the start of each iteration (grad_data.zero_(): NVIDIA/Megatron-LM
//    d98e8a64dd megatron/training/training.py train_step, core/distributed/
//    distributed_data_parallel.py zero_grad_buffer, param_and_grad_buffer.py reset; the same in
//    2022's f0d181e346 megatron/model/distributed.py); a 16-bit buffer's shard copied to fp32 before
//    the step (distrib_optimizer.py _copy_model_grads_to_main_grads, .float(): 6). In fp16 its
//    optimizer unscales the fp32 main grads and checks them for inf before the step
//    (core/optimizer/optimizer.py _unscale_main_grads_and_check_for_nan, 2022's
//    megatron/optimizer/optimizer.py too): one more read and write of each, 8.
//  fp16 in the PyTorch stacks: GradScaler.unscale_ (torch/amp/grad_scaler.py _unscale_grads_;
//    FSDP's ShardedGradScaler alike) runs the same kernel over the gradients the optimizer steps
//    on: 8 bytes each in fp32, 4 in pure fp16 (ShardedGradScaler; GradScaler refuses fp16 ones).
// Host time per kernel: 9.2 us for one eager op issued from Python on the H100 host
// (shared/data/measured/h100-llama3.2-1b/h100_elementwise.csv, launch_tiny_add); LibTorch from
// C++ skips the interpreter: 5 us assumed; Inductor's generated wrapper: 4 us assumed.
// fp8 casts (Fp8Casting, bytes per element beyond the bf16 path):
//  torchao tensorwise dynamic scaling (torchtitan's float8; pytorch-eager, torch-compile), as
//    torchao/testing/float8/roofline_utils.py counts it: an input or output gradient takes an amax
//    pass (reads 2) and a cast reading 2 and writing fp8 twice (2), 6 in all; under Inductor the
//    amax pass fuses into the op that produced the tensor where that op is Inductor's, a norm or
//    the activation function (4); a weight, every micro-batch: amax (2) and the forward cast (3),
//    the backward's transposed cast (3). Eager casts run as more ATen ops than that: the roofline
//    is the least they move.
//  Megatron-LM with Transformer Engine (megatron-te) and its default --fp8-recipe delayed: the
//    scale comes from earlier steps' amax, taken in the cast kernel itself: cast_transpose reads 2
//    and writes 2 (4). The Q/K/V and fc1 GEMMs are TE LayerNormLinear modules, whose norm writes
//    fp8 itself (1 byte less than bf16) and whose transposed copy reads 1 and writes 1 (net 1).
//    The activation function is Megatron's own (bias_swiglu_impl, bias_gelu_impl) and writes bf16,
//    so fc2's input and fc1's output gradient are cast by fc2's and fc1's modules (4). The fp8
//    weights are cast on the first micro-batch and kept for the step (0 per micro-batch).
//  The same with --fp8-recipe tensorwise (TE's Float8CurrentScaling; NVIDIA/TransformerEngine
//    d0067d0d, pytorch/csrc/quantizer.cpp Float8CurrentScalingQuantizer::quantize_impl): the scale
//    needs the tensor's own amax first, so a cast is three kernels, the amax (reads 2), the scale,
//    and the cast-transpose (reads 2, writes 2): 6 for an input or an output gradient. The norms
//    of LayerNormLinear take the amax in their own kernel but cannot write fp8 before the scale is
//    known (csrc/extensions/normalization.cpp, FUSED_NORM_AMAX_FP8): they write bf16 and the cast
//    follows (4). Weights are still cast once per step (0).
//  The executor (executor/src/model/fp8.hpp: torchao's tensorwise recipe, its own kernels): an input
//    takes an amax pass (reads 2) and a cast (reads 2, writes 1) in forward, and in backward is
//    cast again with that amax straight into the transposed layout (reads 2, writes 1): 8; the
//    norm's and the activation's outputs likewise (no kernel of theirs takes the amax); a shared
//    input (Q/K/V, gate/up under --kernels fused) once. An output gradient: amax (2) and one
//    cast writing both layouts (reads 2, writes 2): 6. A weight: amax and cast (5) forward, the
//    transposing cast (3) backward. The weight gradient's GEMM writes float32 that a separate add
//    puts into the float32 sum (12 bytes per element). The inputs kept are the bf16 tensors.
//    Rate: on the H200 of 2026-11-27 (bench/gpu/fp8-llama3.2-3b-h200-kernels.csv, one step of
//    Llama 3.2 3B, seq 4096, mb 1, 4 micro-batches) the casts moved 229 GB in 147 ms, 0.41 of the
//    3.8 TB/s copy rate the same machine's profile measured: the amax reductions ran at 1.9 TB/s,
//    the 32 x 32-tile cast-transposes at 1.1-1.2 TB/s, the plain casts at 3.3 TB/s.
//  What a linear layer keeps for backward: torchao's autograd function keeps the high-precision
//    input (torchao 0.17.0 float8/float8_linear.py, matmul_with_hp_or_float8_args:
//    ctx.save_for_backward(input_hp, weight_hp_t)); under Inductor the partitioner may keep the
//    fp8 cast instead (not measured: counted as fp8); Transformer Engine keeps the fp8 input.
constexpr Fp8Casting kTorchaoEager{.input = 6, .input_from_norm = 6, .input_from_activation = 6, .grad_output = 6,
                                   .grad_output_from_activation = 6, .weight_forward = 5, .weight_backward = 3, .keeps_fp8_inputs = false,
                                   .tp_gathers_fp8 = true};
constexpr Fp8Casting kTrainplanFp8{.input = 8, .input_from_norm = 8, .input_from_activation = 8, .grad_output = 6,
                                   .grad_output_from_activation = 6, .weight_forward = 5, .weight_backward = 3, .keeps_fp8_inputs = false,
                                   .shared_input_cast_once = true, .weight_gradient_add = 12, .rate = 0.41};
constexpr Fp8Casting kTrainplanReferenceFp8 = [] {
  Fp8Casting c = kTrainplanFp8;
  c.shared_input_cast_once = false;  // each at::linear replaced by linear_into casts its own input
  return c;
}();
constexpr Fp8Casting kTorchaoCompiled{.input = 6, .input_from_norm = 4, .input_from_activation = 4, .grad_output = 6,
                                      .grad_output_from_activation = 4, .weight_forward = 5, .weight_backward = 3, .tp_gathers_fp8 = true};
constexpr Fp8Casting kTransformerEngine{4, 1, 4, 4, 4, 0, 0};
constexpr Fp8Casting kTransformerEngineCurrent{.input = 6, .input_from_norm = 4, .input_from_activation = 6, .grad_output = 6,
                                               .grad_output_from_activation = 6, .kernels_per_cast = 3};

// A plain PyTorch module in eager mode (bench/eager_reference.py): ATen's kernel for every
// element-wise op, separate Q/K/V and gate/up GEMMs, the loss on an fp32 copy of the logits,
// bf16 .grad accumulation, fused AdamW on fp32 masters. The FSDP stacks and DeepSpeed run such a
// module too (a Hugging Face or torchtitan model in eager mode) and are derived from it below.
constexpr StackSpec kPytorchEager = {
    .stack = Stack::kPytorchEager,
    .name = "pytorch-eager",
    .summary = "PyTorch eager module: same kernels as trainplan-reference, bf16 .grad accumulation, fused AdamW on fp32 masters",
    .fused_elementwise = false,
    .fused_qkv = false,
    .fused_gate_up = false,
    .loss = LossKernel::kFp32Copy,
    .grads = GradAccumulation::kParamDtype,
    .fused_optimizer = true,
    .optimizer_update_factor = 1,
    .optimizer_overhead_bytes = 24,
    .optimizer_kernels_per_tensor = 0.5,
    .fp16_unscale = true,
    .swiglu_saved = 4,
    .norm_recomputed = false,
    .gemm_sums_input_gradients = false,
    .residual_adds_in_norms = false,
    .host_sync_per_micro_batch = false,
    .host_seconds_per_kernel = 9.2e-6,
    .vocab_pad_multiple = 1,
    .context_attention = ContextAttention::kRing,
    .sequence_parallel_keeps_gathered_input = true,
    .sequence_parallel_rearranges = true,
    .fp8 = kTorchaoEager,
    // torch.utils.checkpoint(use_reentrant=False), the variant PyTorch recommends (torch 2.11.0
    // torch/utils/checkpoint.py) and the one that composes with FSDP and DTensor.
    .full_recompute_replay = FullRecomputeReplay::kUntilLastSaved,
    .op_level_selective = true,
    .dp = {.ddp_bucket_copies = true},  // ZeRO-0/1: torch DDP
    .pure_16bit = true,
    .grads_freed_each_step = true,  // bench/eager_reference.py: w.grad = None, optimizer.zero_grad(set_to_none=True)
    .source = "bench/eager_reference.py (nn.RMSNorm, nn.Linear q/k/v, rotate-half rotary, F.silu(gate) * up, "
              "F.cross_entropy(logits.float()), torch.optim.AdamW(fused=True), clip_grad_norm_(foreach=True))"};

// PyTorch FSDP2 as torchtitan runs it (pytorch/torchtitan 42b0beb4, 2025-06;
// torch/distributed/fsdp/_fully_shard in pytorch v2.8.0): fully_shard per TransformerBlock;
// mixed_precision_reduce float32 by default (config_manager.py); each all-gather copies the
// fp32 shards into a bf16 buffer and, after the collective, copies every parameter out of it
// (_fsdp_collectives.py foreach_all_gather / split_with_sizes_copy: 2 bytes read, 2 written
// per parameter), and in forward keeps the previous unit's output until the next unit's
// copy-out (_fsdp_param_group.py all_gather_state: 3 units); each reduce-scatter copies the
// unsharded gradients into one buffer in the reduce dtype (chunk_cat, the cast fused) and
// adds the result into the fp32 sharded gradient (foreach_reduce), every micro-batch; the loss
// is F.cross_entropy on .float() logits (components/loss.py); fused AdamW; selective recompute is
// torch's op-level policy. Attention is SDPA under sdpa_kernel(..., set_priority=True) with
// CUDNN_ATTENTION first (models/attention.py from 6a3a9da95, 2025-10-09; v0.2.2, the version
// `planner export --to torchtitan` writes for): cuDNN's fused attention, priced from the profile's
// measured SDPA table (kProfile; the H100 and H200 presets' tables are torch 2.11's cuDNN kernels).
// Measured: every step of torchtitan 0.2.2 on the H200 ran cudnn_generated_fort_native_sdpa_sm90_
// flash_{fprop,bprop} (bench/gpu/stacks-h200/titan-*-kernels.csv), at 512-549 TFLOP/s where SDPA's
// flash backend (FlashAttention-2) ran 293-326 (sdpa.json). Before 6a3a9da95 torchtitan asked for
// [FLASH_ATTENTION, EFFICIENT_ATTENTION, MATH] on Hopper and A100 (cuDNN first on B200 from
// 3b85aa31f), and before 5cfe514b6 (2025-03) called SDPA without a choice: FlashAttention-2 there,
// which the validation rows of those runs state (tests/data/torchtitan_*.csv "attention").
// The module runs pytorch-eager's kernels; the rest of its optimizer step moves 12 bytes per parameter.
constexpr StackSpec kFsdp2 = [] {
  StackSpec s = kPytorchEager;
  s.stack = Stack::kFsdp2;
  s.name = "fsdp2";
  s.summary = "PyTorch FSDP2 (torchtitan; Accelerate FSDP2): fully_shard per block, parameters copied into and out of each "
              "all-gather, gradients copied into an fp32 reduce-scatter every micro-batch, eager modules with SDPA's cuDNN attention, "
              "fp32 logits for the loss, fused AdamW";
  s.optimizer_overhead_bytes = 12;
  s.attention_kernel = AttentionImpl::kProfile;
  // ZeRO-0 (pure data parallelism) is not torch DDP here: torchtitan 42b0beb4's replicate was DDP
  // on an fp32 module under autocast, synchronising every micro-batch, and torchtitan replaced it
  // with FSDP's own replication (e1847f439, 2026-03; fully_shard, 00b7f5693): priced as FSDP's
  // buffers.
  s.dp = {.gathered_units = 3, .gather_copy_bytes = 4, .reduce_copy_bytes = 4, .reduce_cast_fused = true, .sharded_grad_bytes = 4,
          .grad_op_units = true};
  s.optimizer_only_sharding = false;  // fully_shard: ZeRO-2 (reshard_after_forward=False) or ZeRO-3
  // torchao's fp8 all-gather hooks fully_shard (torchao float8/fsdp_utils.py; torchtitan's
  // [quantize.linear.float8] enable_fsdp_float8_all_gather).
  s.fp8_all_gather = true;
  // Without FSDP (one GPU, or data_parallel_replicate_degree alone: DDP, v0.2.2
  // models/llama3/infra/parallelize.py apply_ddp) torchtitan trains the fp32 module under
  // torch.autocast (v0.2.2 distributed/utils.py maybe_enable_amp: "Mixed precision training is
  // handled by AMP" unless FSDP (dp_shard or cp) is on; with TP or PP and no FSDP it trains in
  // float32, which the torchtitan export refuses). Measured on one H200 (bench/gpu/stacks-h200/
  // titan-bf16-eager-kernels.csv): 813 dtype copies, 87 ms of a 1016 ms eager step. Its train step
  // starts with optimizers.zero_grad() (train.py; set_to_none by default). Its data parallelism
  // without sharding stays priced as FSDP's replication (above), not DDP's buckets.
  s.autocast = AutocastUse::kUnsharded;
  // Context parallelism as PyTorch runs it by default (torchtitan's context_parallel_rotate_method
  // "allgather"; Accelerate's parallelism_config_cp_comm_strategy the same choice).
  s.context_attention = ContextAttention::kAllGatherRotate;
  // Full recompute as pytorch-eager's: torchtitan 42b0beb4 wraps each block in
  // ptd_checkpoint_wrapper (non-reentrant) with torch's default early stop; from 25413d224
  // (2025-08) it passes early_stop=False and replays the whole block (kWhole).
  s.source = "pytorch/torchtitan 42b0beb4 config_manager.py, components/loss.py, models/llama3/infra/parallelize.py; 6a3a9da95 (v0.2.2) "
             "models/attention.py; "
             "pytorch/pytorch v2.8.0 (a1cb3cc0) torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, _fsdp_param_group.py; "
             "torch 2.11.0 torch/distributed/tensor/experimental/_context_parallel/_attention.py (rotate_method ALL_GATHER)";
  return s;
}();

// FSDP2 as torchtitan runs it with training.compile (models/llama3/infra/parallelize.py
// apply_compile: each TransformerBlock compiled on its own, before fully_shard; the loss compiled
// too, components/loss.py): Inductor's kernels as torch-compile's (fused element-wise work, the
// fused loss, its partitioner's recompute, its wrapper's launches, torchao's compiled fp8 casts),
// FSDP2's collectives and copies as fsdp2's (they run outside the compiled blocks).
constexpr StackSpec compiled(StackSpec s) {
  s.stack = Stack::kFsdp2Compile;
  s.name = "fsdp2-compile";
  s.summary = "PyTorch FSDP2 under torch.compile (torchtitan --compile): blocks and loss compiled by Inductor, FSDP2's "
              "copies and fp32 reduce-scatter as fsdp2, SDPA's cuDNN attention, fused AdamW";
  s.fused_elementwise = true;
  s.loss = LossKernel::kFused;
  s.swiglu_saved = 2;
  s.host_seconds_per_kernel = 4e-6;
  s.fp8 = kTorchaoCompiled;
  s.full_recompute_replay = FullRecomputeReplay::kWhatBackwardNeeds;
  s.source = "pytorch/torchtitan 42b0beb4 models/llama3/infra/parallelize.py (apply_compile), components/loss.py; as fsdp2 for FSDP2";
  return s;
}

// PyTorch FSDP1 as Accelerate, Lightning and Composer run it on a Hugging Face module. Read
// from pytorch v2.8.0 (git a1cb3cc0), torch/distributed/fsdp:
// _flat_param.py (_init_param_reduce_dtypes: the reduce dtype defaults to param_dtype;
// _full_param_padded backs the parameters as views: no copy-out), _runtime_utils.py
// (_post_backward_hook: the unsharded gradient pre-divided in place before the
// reduce-scatter, every micro-batch; _accumulate_sharded_grad: the shard cast to the fp32
// sharded parameter's dtype and added into _saved_grad_shard), _limiter_utils.py
// (limit_all_gathers, on by default: at most 2 all-gathers in flight); SHARD_GRAD_OP keeps the
// unsharded parameters from forward to backward (api.py). The module (transformers 4.51.3):
// the loss on an fp32 copy of the logits (loss/loss_utils.py ForCausalLMLoss: logits.float()),
// attention through SDPA with is_causal and no mask on unpadded batches (the default
// attn_implementation "sdpa"), whose flash backend is FlashAttention-2 (PyTorch 2.2 on; on
// H100 cuDNN only in 2.5.0 and from 2.11, where it is opted into). The optimizer: PyTorch's
// AdamW without fused=True runs its foreach path (one ATen op per step of the update, as
// trainplan-reference moves); Composer's DecoupledAdamW (mosaicml/composer 64051888) the same
// math; the gradient clipped with a foreach norm.
// The module runs pytorch-eager's kernels, with FlashAttention-2.
constexpr StackSpec kFsdp1 = [] {
  StackSpec s = kPytorchEager;
  s.stack = Stack::kFsdp1;
  s.name = "fsdp1";
  s.summary = "PyTorch FSDP1 (Accelerate, Lightning, Composer): one FlatParameter per block, limit_all_gathers, "
              "gradients pre-divided and reduce-scattered every micro-batch into an fp32 shard, eager Hugging Face modules "
              "(LlamaRMSNorm as float32 ATen ops) with FlashAttention-2 and the loss on fp32 logits, foreach AdamW";
  s.fused_optimizer = false;
  s.optimizer_update_factor = 106.0 / 32.0;
  s.optimizer_overhead_bytes = 12;
  s.attention_kernel = AttentionImpl::kFlash2;
  s.dp = {.gathered_units = 2, .reduce_copy_bytes = 4, .sharded_grad_bytes = 4, .grad_op_units = true};
  s.reduce_dtype = Dtype::kBf16;
  // transformers' LlamaRMSNorm (models/llama/modeling_llama.py, 4.51.3 and 5.x alike): eight ATen
  // ops in float32. Measured on one H200 (bench/gpu/stacks-h200/deepspeed-kernels.csv and
  // accelerate-kernels.csv, a Hugging Face Llama): 146-154 ms of a 548 ms step in element-wise
  // kernels, with float32 multiplies, pow, means and sums per norm.
  s.unfused_rms_norm = true;
  // FSDP1 shards data only: Composer, Accelerate (its parallelism_config needs FSDP2) and
  // Lightning's FSDPStrategy have no tensor, context or pipeline parallelism with it.
  s.tensor_parallel = false;
  s.sequence_parallel_rearranges = false;
  s.context_parallel = false;
  s.pipeline_parallel = false;
  s.optimizer_only_sharding = false;  // ShardingStrategy: NO_SHARD (DDP), SHARD_GRAD_OP, FULL_SHARD, HYBRID_*
  // Full recompute as pytorch-eager's: Accelerate's, Lightning's and Composer's activation
  // checkpointing wrap each block in checkpoint_wrapper with CheckpointImpl.NO_REENTRANT
  // (torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py), torch's default early stop.
  s.source = "pytorch/pytorch v2.8.0 (a1cb3cc0) torch/distributed/fsdp/_flat_param.py, _runtime_utils.py, _limiter_utils.py, api.py; "
             "transformers 4.51.3 loss/loss_utils.py (ForCausalLMLoss), integrations/sdpa_attention.py; "
             "mosaicml/composer 64051888 utils/parallelism.py (FSDPConfig: limit_all_gathers)";
  return s;
}();

// FSDP1 as Composer runs MosaicML's MPT models (mosaicml's training code at 8c8dd48,
// models/mpt/modeling_mpt.py: model name mpt_causal_lm, ComposerMPTCausalLM, takes loss_fn "fused_crossentropy" by default, flash-attn's
// CrossEntropyLoss (flash_attn/losses/cross_entropy.py, inplace_backward False: the bf16 logits
// and their log-sum-exp kept, the gradient a new bf16 tensor, fp32 only in registers); its
// hf_causal_lm models (Llama and the rest, and MPT fine-tuning) return Hugging Face's own loss:
// fsdp1), attention through flash-attn 2 (attn_impl "flash"), and what its train yamls
// set (Composer's own defaults differ: reentrant checkpointing, DEFAULT mixed precision reducing in
// fp32): FSDP1 with PURE mixed precision (bf16 parameters, reduction and buffers) and
// non-reentrant activation checkpointing (activation_checkpointing_reentrant false). Its
// optimizer, Composer's DecoupledAdamW (composer/optim/decoupled_weight_decay.py), loops over the
// parameters in Python and reads each one's step count with .item(), a device sync per parameter
// tensor that is not priced here: the step is fsdp1's foreach AdamW.
constexpr StackSpec kComposer = [] {
  StackSpec s = kFsdp1;
  s.stack = Stack::kComposer;
  s.name = "composer";
  s.summary = "PyTorch FSDP1 as Composer runs MosaicML's MPT models: fsdp1's FlatParameters and limit_all_gathers, flash-attn's "
              "fused cross-entropy on the bf16 logits (no fp32 copy), FlashAttention-2";
  s.loss = LossKernel::kFused;
  // MPT's default norm (low_precision_layernorm) is F.layer_norm, one kernel; its rmsnorm option runs
  // unfused bf16 ops, not priced here (an MPT with RMSNorm is priced with the fused kernel).
  s.unfused_rms_norm = false;
  s.source = "MosaicML's MPT training code (8c8dd48) models/mpt/modeling_mpt.py (ComposerMPTCausalLM: loss_fn fused_crossentropy), "
             "scripts/train/yamls (fsdp_config); Dao-AILab/flash-attention flash_attn/losses/cross_entropy.py; as fsdp1 for FSDP1";
  return s;
}();

// DeepSpeed ZeRO (microsoft/DeepSpeed 38327e07, v0.16.5) on an eager PyTorch module:
// runtime/zero/config.py defaults (reduce_bucket_size 5e8, stage3_prefetch_bucket_size 5e7,
// stage3_max_reuse_distance 1e9, overlap_comm only for stage 3); a submodule's parameters
// are kept gathered when the trace reaches their next use within 1e9 fetched parameters
// (partitioned_param_coordinator.py __params_to_release); stage 3 fetches each submodule's own parameters and the
// prefetched ones in one coalesced all-gather, then copies each parameter out of the flat
// buffer (partitioned_param_coordinator.py fetch_sub_module, partition_parameters.py
// all_gather_coalesced), and reduce-scatters buckets of reduce_bucket_size after an interleaved
// copy and a pre-divide (runtime/comm/coalesced_collectives.py reduce_scatter_coalesced) into
// a gradient partition in the compute dtype (stage3.py); stages 1-2 keep ipg buckets of
// reduce_bucket_size elements, reduce them by all-reducing whole buckets
// (use_multi_rank_bucket_allreduce), stage 2 every micro-batch, stage 1 once per step
// (stage_1_and_2.py), not overlapped (overlap_comm off); FusedAdam (engine.py), the step on a
// transient fp32 copy of the gradient partition, then copied back into the bf16 partition.
// The module runs pytorch-eager's kernels, with FlashAttention-2; selective recompute is the
// attention core's.
constexpr StackSpec kDeepspeed = [] {
  StackSpec s = kPytorchEager;
  s.stack = Stack::kDeepspeed;
  s.name = "deepspeed";
  s.summary = "DeepSpeed v0.16.5 ZeRO-1/2/3 (for 2021's v0.3: deepspeed-v0.3): per-submodule coalesced all-gathers with a 5e7 prefetch bucket, 5e8-element gradient buckets "
              "(all-reduced under ZeRO-1/2, every micro-batch under ZeRO-2), gradients kept in bf16 (ZeRO-0 in bf16: BF16_Optimizer, states "
              "sharded as ZeRO-1 beside an fp32 gradient buffer), FusedAdam, eager Hugging Face modules "
              "(LlamaRMSNorm as float32 ATen ops) with FlashAttention-2 and fp32 logits for the loss";
  s.optimizer_kernels_per_tensor = 0.3;
  s.unfused_rms_norm = true;  // the Hugging Face module DeepSpeed is handed (its HF integration): LlamaRMSNorm, as fsdp1
  s.fp16_unscale = false;  // its fp16 optimizers' overflow check and unscale are not read here: not priced
  s.attention_kernel = AttentionImpl::kFlash2;
  s.op_level_selective = false;
  // Full recompute: DeepSpeed's activation checkpointing (runtime/activation_checkpointing/
  // checkpointing.py CheckpointFunction) or a Hugging Face model's gradient checkpointing, both
  // reentrant: the whole block again.
  s.full_recompute_replay = FullRecomputeReplay::kWhole;
  s.dp = {.gather_bucket_params = 5e7, .max_reuse_distance_params = 1e9, .gather_copy_bytes = 4, .reduce_copy_bytes = 8,
          .reduce_bucket_params = 5e8, .bucket_params = 5e8, .buckets = 1, .sharded_grad_bytes = 2, .zero12_all_reduce = true,
          .zero2_every_micro_batch = true, .zero12_overlap = false};
  // The loops over the ranks (partition_parameters.py _all_gather_dtype and
  // AllGatherCoalescedHandle.wait: a view of the flat buffer per rank per gather, a view of each
  // rank's slice per parameter and a torch.cat of them; coalesced_collectives.py
  // reduce_scatter_coalesced: a slice per rank per gradient, interleaved and concatenated), timed
  // by bench/deepspeed_host_loops.py on small CPU tensors (bench/results.md): 2.6 us per rank per
  // gathered tensor and 2.0 us per gather, 2.0 us per rank per reduced gradient. record_stream
  // on each gathered view (CUDA only) is not in them. Parameters under 1e5 elements (norms,
  // biases) persist whole (stage3_param_persistence_threshold) and are not gathered; every
  // gradient is reduced.
  s.dp.gather_host_seconds_per_rank_per_tensor = 2.6e-6;
  s.dp.gather_host_seconds_per_rank_per_call = 2.0e-6;
  s.dp.reduce_host_seconds_per_rank_per_tensor = 2.0e-6;
  s.dp.persistence_threshold_elements = 1e5;
  s.reduce_dtype = Dtype::kBf16;
  // AutoTP for tensor parallelism; its pipeline engine runs with ZeRO-1 at most
  // (runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism");
  // its sequence parallelism (Ulysses) is an all-to-all, not the ring attention modelled here.
  s.context_parallel = false;
  s.max_zero_with_pipeline = 1;
  // AutoTP asserts ZeRO-2 at most (runtime/engine.py _configure_tensor_parallel_states:
  // "the compatibility between 'autotp' and 'zero_stage = 3' has not been validated").
  s.max_zero_with_tensor_parallel = 2;
  // Its expert parallelism (deepspeed.moe layers, AutoEP) asserts ZeRO-2 at most (runtime/engine.py
  // _configure_zero_optimizer: "MoE not supported with Stage 3").
  s.max_zero_with_expert_parallel = 2;
  s.pure_16bit = false;  // its 16-bit optimizers keep fp32 partitions
  // ZeRO-3 allocates its gradient partitions once (stage3.py grad_partitions_flat_buffer) and
  // ZeRO-1/2 their bucket buffers; not freed between steps.
  s.grads_freed_each_step = false;
  // Its PipelineEngine (runtime/pipe/): TrainSchedule only, 1F1B with one chunk per stage
  // (schedule.py); the exchange after each pass a blocking p2p.send and p2p.recv in turn
  // (p2p.py: dist.send, dist.recv, each waited for; engine.py _exec_send_grads then
  // _exec_recv_activations in a forward step, _exec_recv_grads then _exec_send_activations in a
  // backward one); the activation and its gradient partitioned over the tensor-parallel group
  // and gathered again (pipe_partitioned, grad_partitioned: true by default, runtime/config.py).
  // The tensors' metadata goes once, before the first send of the run (engine.py
  // _exec_send_activations: first_output_send, unless the module's shapes are dynamic): no cost
  // per step.
  s.interleaved_pipeline = false;
  s.pipeline_send_recv_together = false;
  s.pipeline_send = PipelineSend::kPartitioned;
  // AutoTP (runtime/tensor_parallel, module_inject/auto_tp.py) shards the linear layers only:
  // no Megatron-style sequence parallelism, as the DeepSpeed export says.
  s.sequence_parallel = false;
  s.sequence_parallel_rearranges = false;
  s.bf16_optimizer_at_zero0 = true;
  s.offload_needs_zero = true;
  s.source = "microsoft/DeepSpeed 38327e07 (v0.16.5) deepspeed/runtime/zero/config.py, stage3.py, stage_1_and_2.py, "
             "partitioned_param_coordinator.py, partition_parameters.py, runtime/comm/coalesced_collectives.py, runtime/engine.py, "
             "runtime/bf16_optimizer.py, runtime/pipe/schedule.py, p2p.py, engine.py, runtime/config.py";
  return s;
}();

// DeepSpeed v0.3.16 (microsoft/DeepSpeed tag v0.3.16, April 2021: ZeRO-3 as ZeRO-Infinity
// released it, and as 2021's published ZeRO-3 runs ran it, with PyTorch 1.8). Its ZeRO-1/2 are
// priced with kDeepspeed's buckets and schedule and v0.3.16's copies around each reduction
// (below; stage2.py allreduce_bucket flattens, pre-divides and copies back likewise; its
// device syncs under overlap_comm are not modelled); under ZeRO-3 it differs in four ways
// (runtime/zero/):
//  - partition_parameters.py _allgather_param: each parameter over the persistence threshold
//    (1e5 elements, constants.py) is gathered by an all-gather of its own, its output a list of
//    per-rank views of a zeroed flat buffer made in a Python loop over the ranks (a narrow and a
//    get_rank(group) per rank: 3.5 us per rank, bench/deepspeed_host_loops.py `gather03`);
//  - torch.distributed.all_gather with that list: ProcessGroupNCCL copies each rank's chunk out
//    of its own flat output with a copy_ per rank on the NCCL stream (a recordStream and a
//    launch from C++ each: 5 us, the executor's C++ launches, kTrainplan's host_seconds_per_kernel);
//  - _allgather_param calls torch.cuda.synchronize() before each gather, and stage3.py
//    fetch_sub_module ends with _synchronize_communication (the comm stream, then the device):
//    the host issues each gather with nothing queued on the GPU;
//  - gradients: reduce_scatter defaults to false (constants.py ZERO_OPTIMIZATION_REDUCE_SCATTER_DEFAULT),
//    so stage3.py average_tensor (contiguous gradients) or buffered_reduce_fallback all-reduces
//    each 5e8-element bucket whole (gradient_reduction_w_predivide, allreduce_and_copy) on its
//    reduction stream (overlap_comm, on by default under stage 3).
// Prefetch (5e7 elements), max live parameters and reuse distance (1e9) are v0.16.5's defaults
// already.
constexpr StackSpec kDeepspeedV03 = [] {
  StackSpec s = kDeepspeed;
  s.stack = Stack::kDeepspeedV03;
  s.name = "deepspeed-v0.3";
  // 2021's published ZeRO-3 runs trained Megatron-DeepSpeed's GPT (apex's fused LayerNorm), not a
  // Hugging Face Llama: no LlamaRMSNorm here.
  s.unfused_rms_norm = false;
  s.summary = "DeepSpeed v0.3.16 (2021) with PyTorch 1.8: ZeRO-3 gathers each parameter on its own after a device sync, through "
              "list all-gathers that copy every rank's chunk with a kernel of its own, and all-reduces its gradient buckets; "
              "ZeRO-1/2 with deepspeed's buckets";
  // v0.3.16 has no bf16 mode (BF16_Optimizer came with v0.6.2, 56c52238): its ZeRO-0 is plain
  // data parallelism.
  s.bf16_optimizer_at_zero0 = false;
  s.dp.gather_per_tensor = true;
  s.dp.gather_host_seconds_per_rank_per_tensor = 3.5e-6;
  s.dp.gather_host_seconds_per_rank_per_call = 0;
  s.dp.reduce_host_seconds_per_rank_per_tensor = 0;
  s.dp.list_copy_host_seconds = 5e-6;
  s.dp.sync_before_gather = true;
  s.dp.zero3_all_reduce = true;
  // On the streams beside the collectives: torch.zeros of each gathered parameter's flat buffer (2
  // bytes per parameter; its copy-out is the list's copies above), and per reduced bucket the
  // flatten, the pre-divide and the copy back into the gradients (stage3.py and stage2.py
  // allreduce_bucket, allreduce_and_copy: 4 bytes each per 16-bit parameter), at every stage.
  s.dp.gather_copy_bytes = 2;
  s.dp.reduce_copy_bytes = 12;
  // MiCS, DeepSpeed's hybrid shard, came in 2023 (v0.9.2, runtime/zero/mics.py).
  s.hybrid_shard = false;
  // ZeRO-3 beside Megatron's tensor parallelism through its mpu (stage3.py: model_parallel_group,
  // _model_parallel_all_reduce); no MoE layers yet (deepspeed/moe came in v0.5.0).
  s.max_zero_with_tensor_parallel = 3;
  s.expert_parallel = false;
  // Its PipelineEngine as kDeepspeed's, but its gradients between stages sent whole (engine.py:
  // is_grad_partitioned = False until v0.5.4) and through a broadcast in a two-rank group
  // (p2p.py), a transfer all the same. No sequence parallelism (kDeepspeed's; Megatron's came in
  // 2022, after it).
  s.pipeline_send = PipelineSend::kPartitionedActivation;
  s.source = "microsoft/DeepSpeed v0.3.16 deepspeed/runtime/zero/partition_parameters.py (_allgather_param, _all_gather), stage3.py "
             "(fetch_sub_module, _synchronize_communication, average_tensor, buffered_reduce_fallback), constants.py, "
             "runtime/pipe/engine.py, p2p.py; "
             "pytorch v1.8.0 ProcessGroupNCCL.cpp (allgather: flattenForScatterGather, a copy_ per output tensor)";
  return s;
}();

// A Hugging Face module under PyTorch DDP with mixed precision as Accelerate runs it without FSDP
// or DeepSpeed (accelerate 1.15.0 accelerator.py prepare_model: with mixed_precision bf16 or fp16
// model.forward is wrapped in torch.autocast and its outputs converted to fp32; the parameters
// stay fp32), and as the Trainer runs it by default (it prepares the model through Accelerate):
// the module is fsdp1's (transformers' LlamaRMSNorm as float32 ATen ops, SDPA's FlashAttention-2,
// the loss on an fp32 copy of the logits) in fp32 under autocast (AutocastUse::kAlways: weights,
// gradients and AdamW states fp32, each weight and linear input cast at every use, an fp32
// residual stream); DDP with gradient_as_bucket_view=False (accelerate utils/dataclasses.py
// DistributedDataParallelKwargs), its gradients all-reduced in fp32, the gradients' dtype;
// torch's fused AdamW (the Trainer's default optim adamw_torch_fused from torch 2.8, transformers
// 4.57.1 training_args.py; the script an Accelerate export leaves takes AdamW(fused=True)), the
// gradient clipped with a foreach norm, zero_grad(set_to_none=True) each step; full recompute
// non-reentrant, as the Accelerate export asks the script to turn it on (transformers' own default,
// use_reentrant True in 4.57.1 modeling_utils.py gradient_checkpointing_enable, replays the whole
// block: one more down projection per layer, not priced here).
constexpr StackSpec kHfDdp = [] {
  StackSpec s = kFsdp1;
  s.stack = Stack::kHfDdp;
  s.name = "hf-ddp";
  s.summary = "a Hugging Face module in fp32 under torch.autocast with PyTorch DDP (Accelerate without FSDP or DeepSpeed, the Trainer's "
              "default): LlamaRMSNorm as float32 ATen ops, FlashAttention-2, fp32 logits for the loss, weights and inputs cast at every "
              "use, fp32 gradients all-reduced from DDP's buckets, fused AdamW";
  s.fused_optimizer = true;
  s.optimizer_update_factor = 1;
  s.optimizer_overhead_bytes = 12;  // clip_grad_norm_: the foreach norm (4) and the scale (8); no master copy
  s.autocast = AutocastUse::kAlways;
  s.max_zero = 0;
  s.dp = {.ddp_bucket_copies = true};
  s.reduce_dtype = Dtype::kFp32;
  s.full_recompute_replay = FullRecomputeReplay::kUntilLastSaved;
  s.pure_16bit = true;  // a model loaded in bf16 and trained without mixed precision: no autocast then
  s.hybrid_shard = false;
  s.expert_parallel = false;
  s.selective_recompute = false;  // transformers' gradient checkpointing recomputes whole layers
  s.source = "huggingface/accelerate 1.15.0 accelerator.py (prepare_model: autocast, convert_outputs_to_fp32), utils/dataclasses.py "
             "(DistributedDataParallelKwargs); transformers 4.57.1 modeling_utils.py (gradient_checkpointing_enable), training_args.py "
             "(adamw_torch_fused), models/llama/modeling_llama.py (LlamaRMSNorm); torch 2.11.0 torch/nn/parallel/distributed.py; as fsdp1 "
             "for the module";
  return s;
}();

// A Hugging Face module under FSDP2 as Accelerate runs it (fsdp_version 2: accelerate 1.15.0
// utils/fsdp_utils.py fsdp2_prepare_model, fully_shard per decoder layer with the plugin's
// MixedPrecisionPolicy, which set_mixed_precision gives the mixed-precision dtype for parameters and
// reduction alike): fsdp2's sharding, copies and collectives (the same fully_shard), fsdp1's
// module (transformers' LlamaRMSNorm as float32 ATen ops, keeping its float32 copy; SDPA's
// FlashAttention-2; the loss on fp32 logits); full recompute as fsdp_activation_checkpointing
// wraps each layer (non-reentrant), no selective policy; no tensor parallelism here (its
// parallelism_config tp_size applies the model's own tp_plan, not priced) and no fp8 all-gather.
constexpr StackSpec kHfFsdp2 = [] {
  StackSpec s = kFsdp2;
  s.stack = Stack::kHfFsdp2;
  s.name = "hf-fsdp2";
  s.summary = "a Hugging Face module under FSDP2 as Accelerate's fsdp_version 2 runs it: fsdp2's fully_shard per layer, copies and "
              "collectives, reduced in the mixed-precision dtype; LlamaRMSNorm as float32 ATen ops, FlashAttention-2, fp32 logits for the "
              "loss, fused AdamW";
  s.unfused_rms_norm = true;
  s.attention_kernel = AttentionImpl::kFlash2;
  s.reduce_dtype = Dtype::kBf16;
  s.autocast = AutocastUse::kNever;  // its parameters are FSDP's: the policy casts them
  s.selective_recompute = false;
  s.tensor_parallel = false;
  s.pipeline_parallel = false;
  s.expert_parallel = false;
  s.fp8_all_gather = false;
  s.source = "huggingface/accelerate 1.15.0 utils/fsdp_utils.py (fsdp2_prepare_model), utils/dataclasses.py "
             "(FullyShardedDataParallelPlugin.set_mixed_precision); as fsdp2 for FSDP2, as fsdp1 for the module";
  return s;
}();

constexpr StackSpec kSpecs[] = {
    // The fused paths (executor --kernels fused, the default). Norms: ATen's fused rms_norm
    // forward, recomputed in backward, and one CUDA kernel for the backward (NormLinearsFn);
    // rotary and SwiGLU: one CUDA kernel each way (cuda_kernels.cu); the residual adds go into
    // the norms' kernels (backward: both forks; forward: x + the attention branch), and the block's
    // output add stays an ATen add, a single kernel moving the same 3 bytes per element as a fused
    // add, so fused_elementwise holds for every element-wise op of the block. SwiGLU keeps gate and up only (2): silu(gate)
    // * up is recomputed in the backward kernel. Under ZeRO-0/1 without TP every gradient goes
    // straight into the fp32 buffer from the GEMM (or kernel) that computes it; the Q/K/V and
    // gate/up input gradients are summed by their GEMMs (beta = 1).
    {.stack = Stack::kTrainplan,
     .name = "trainplan",
     .summary = "trainplan executor (--kernels fused): fused rotary, SwiGLU and RMSNorm-backward kernels, norms recomputed in backward, "
                "residual adds in the norms, "
                "separate Q/K/V and gate/up GEMMs, chunked linear cross-entropy, gradients accumulated in fp32 by the GEMMs (ZeRO-0/1, "
                "no TP), fused AdamW, the loss read once per step",
     .fused_elementwise = true,
     .fused_qkv = false,
     .fused_gate_up = false,
     .loss = LossKernel::kChunkedFused,
     .grads = GradAccumulation::kFusedInGemmUnsharded,
     .fused_optimizer = true,
     .optimizer_update_factor = 1,
     .optimizer_overhead_bytes = 14,
     .optimizer_kernels_per_tensor = 1,
     .swiglu_saved = 2,
     .norm_recomputed = true,
     .gemm_sums_input_gradients = true,
     .residual_adds_in_norms = true,
     .host_sync_per_micro_batch = false,
     .host_seconds_per_kernel = 5e-6,
     .vocab_pad_multiple = 1,
     .context_attention = ContextAttention::kAllGatherKv,
     .sequence_parallel_keeps_gathered_input = false,
     .fp8 = kTrainplanFp8,
     .source = "executor/src/model/model.cpp (block_forward with Kernels::kFused: norm_linears, rotary_embedding, swiglu_down; head_loss: "
               "linear_cross_entropy), executor/src/model/fused_ops.cpp (NormLinearsFn, RotaryFn, SwigluDownFn, LinearCrossEntropyFn), "
               "executor/src/model/cuda_kernels.cu, executor/src/train/engine.cpp (grad_sums / fused_accumulation, else an fp32 gradient add per micro-batch; fused_optimizer_step: "
               "at::_fused_adamw_, gradient_norm: _foreach_norm, one .item() per step)"},
    // The plain path (executor --kernels reference): the executor as it was before its fused
    // paths, and the stack of the H100 runs in tests/data/h100-llama3.2-1b.
    {.stack = Stack::kTrainplanReference,
     .name = "trainplan-reference",
     .summary = "trainplan executor (--kernels reference, the executor before its fused paths): eager ATen kernels, separate Q/K/V and "
                "gate/up GEMMs, fp32 logits for the loss, unfused AdamW, fp32 gradient accumulation, one host sync per micro-batch",
     .fused_elementwise = false,
     .fused_qkv = false,
     .fused_gate_up = false,
     .loss = LossKernel::kFp32Copy,
     .grads = GradAccumulation::kFp32Buffer,
     .fused_optimizer = false,
     .optimizer_update_factor = 106.0 / 32.0,
     .optimizer_overhead_bytes = 16,
     .optimizer_kernels_per_tensor = 5,
     .swiglu_saved = 4,
     .norm_recomputed = false,
     .gemm_sums_input_gradients = false,
     .residual_adds_in_norms = false,
     .host_sync_per_micro_batch = true,
     .host_seconds_per_kernel = 5e-6,
     .vocab_pad_multiple = 1,
     .context_attention = ContextAttention::kAllGatherKv,
     .sequence_parallel_keeps_gathered_input = false,
     .fp8 = kTrainplanReferenceFp8,
     .source = "executor/src/model/model.cpp (block_forward with Kernels::kReference: at::rms_norm, three at::linear for q/k/v, rotate-half "
               "rotary, at::silu(gate) * up, head_loss: logits .to(kFloat) then at::cross_entropy_loss), executor/src/train/engine.cpp "
               "(fp32 gradient add per micro-batch, ATen AdamW), executor/src/train/engine.cpp forward_chunk (loss.item() per micro-batch)"},
    kPytorchEager,

    {.stack = Stack::kTorchCompile,
     .name = "torch-compile",
     .summary = "torch.compile (Inductor): element-wise work fused around the same GEMMs, fused cross-entropy, fused AdamW",
     .fused_elementwise = true,
     .fused_qkv = false,
     .fused_gate_up = false,
     .loss = LossKernel::kFused,
     .grads = GradAccumulation::kParamDtype,
     .fused_optimizer = true,
     .optimizer_update_factor = 1,
     .optimizer_overhead_bytes = 24,
     .optimizer_kernels_per_tensor = 0.5,
     .fp16_unscale = true,
     .swiglu_saved = 2,
     .norm_recomputed = false,
     .gemm_sums_input_gradients = false,
     .residual_adds_in_norms = false,
     .host_sync_per_micro_batch = false,
     .host_seconds_per_kernel = 4e-6,
     .vocab_pad_multiple = 1,
     .context_attention = ContextAttention::kRing,
     .sequence_parallel_keeps_gathered_input = true,
     .sequence_parallel_rearranges = true,
     .fp8 = kTorchaoCompiled,
     .full_recompute_replay = FullRecomputeReplay::kWhatBackwardNeeds,
     .op_level_selective = true,
     .dp = {.ddp_bucket_copies = true},  // ZeRO-0/1: torch DDP
     .pure_16bit = true,
     .grads_freed_each_step = true,  // bench/eager_reference.py under torch.compile: as pytorch-eager
     .source = "PyTorch 2 Inductor fuses pointwise and reduction ops and its min-cut partitioner recomputes cheap "
               "pointwise results in backward (Ansel et al. 2024, ASPLOS, Sec. 5); measured on H100: 66.7 K tokens/s and "
               "29.9 GiB peak for Llama 3.2 1B at micro-batch 4 against 54.1 K and 41.6 GiB eager (issue 12)"},
    {.stack = Stack::kMegatronTe,
     .name = "megatron-te",
     .summary = "Megatron-Core + Transformer Engine: fused norms, RoPE and SwiGLU, fused QKV and fc1 GEMMs, "
                "fp32 main grads accumulated in the wgrad GEMM, distributed fused Adam, vocab padded to 128 x tp",
     .fused_elementwise = true,
     .fused_qkv = true,
     .fused_gate_up = true,
     .loss = LossKernel::kMegatronFp32,
     .grads = GradAccumulation::kFusedInGemm,
     .fused_optimizer = true,
     .optimizer_update_factor = 1,
     .optimizer_overhead_bytes = 10,
     .optimizer_kernels_per_tensor = 0.3,
     .main_grad_buffer = true,
     .fp16_unscale = true,
     .swiglu_saved = 3,
     .norm_recomputed = false,
     .gemm_sums_input_gradients = false,
     .residual_adds_in_norms = false,
     .host_sync_per_micro_batch = false,
     .host_seconds_per_kernel = 9.2e-6,
     .vocab_pad_multiple = 128,
     .context_attention = ContextAttention::kRing,
     .sequence_parallel_keeps_gathered_input = false,
     .fp8 = kTransformerEngine,
     .fp8_recipe = Fp8Recipe::kDelayed,
     .fp8_other_recipe = &kTransformerEngineCurrent,
     // Megatron-LM's scatter-gather of the activation a stage sends without sequence parallelism,
     // as the published Megatron-LM runs of 2021-2022 (Narayanan, Korthikanti) ran it; Megatron-Core
     // since 2023 sends the whole tensor from each tensor-parallel rank there instead, t times
     // the bytes (PipelineSend): a megatron-te plan without sequence parallelism is priced as the
     // former. Under sequence parallelism (the default beside tp > 1) both send the shard.
     .ends_in_pipeline_split = true,
     .embedding_all_reduces_before_positions = true,
     .pipeline_send = PipelineSend::kScatterGather,
     .context_parallel_calls_kernel = true,
     .source = "Megatron-LM (NVIDIA/Megatron-LM: --make-vocab-size-divisible-by 128, gradient_accumulation_fusion, "
               "distributed optimizer, vocab_parallel_cross_entropy in fp32); Transformer Engine LayerNormLinear, "
               "fused RoPE and SwiGLU; Narayanan et al. 2021, Korthikanti et al. 2022"},
    kFsdp1,
    kComposer,
    kFsdp2,
    compiled(kFsdp2),
    kDeepspeed,
    kDeepspeedV03,
    kHfDdp,
    kHfFsdp2,
};

}  // namespace

const StackSpec& stack_spec(Stack stack) {
  for (const StackSpec& s : kSpecs) {
    if (s.stack == stack) return s;
  }
  return kSpecs[0];
}

const char* stack_name(Stack stack) { return stack_spec(stack).name; }

std::string unsupported_parallelism(Stack stack, int tp, int cp, int pp, int ep, int shard_group, bool sequence_parallel) {
  const StackSpec& s = stack_spec(stack);
  const std::string lacks = std::string(": the ") + s.name + " stack has no ";
  if (tp > 1 && !s.tensor_parallel) return "/parallel/tp" + lacks + "tensor parallelism";
  if (cp > 1 && !s.context_parallel) return "/parallel/cp" + lacks + "context parallelism (ring attention)";
  if (pp > 1 && !s.pipeline_parallel) return "/parallel/pp" + lacks + "pipeline parallelism";
  if (ep > 1 && !s.expert_parallel) return "/parallel/ep" + lacks + "expert parallelism";
  if (shard_group > 0 && !s.hybrid_shard) return "/parallel/shard_group" + lacks + "hybrid sharding (ZeRO-3 within groups): shard_group 0";
  if (sequence_parallel && !s.sequence_parallel) return "/parallel/sequence_parallel" + lacks + "sequence parallelism";
  return "";
}

std::string unsupported_schedule(Stack stack, bool gpipe, bool interleaved) {
  const StackSpec& s = stack_spec(stack);
  if ((gpipe || interleaved) && !s.interleaved_pipeline) {
    return std::string("/parallel/schedule: the ") + s.name + " stack's pipeline engine runs 1F1B with one chunk per stage: schedule 1f1b, virtual_stages 1";
  }
  return "";
}

PipelineSplit pipeline_split(PipelineSend send, bool sequence_parallel) {
  switch (send) {
    case PipelineSend::kAsHeld: return {};
    case PipelineSend::kScatterGather: return sequence_parallel ? PipelineSplit{} : PipelineSplit{true, true, 2};
    case PipelineSend::kPartitioned: return {true, true, 3};
    case PipelineSend::kPartitionedActivation: return {true, false, 2};
  }
  return {};
}

std::optional<Stack> stack_from_name(const std::string& name) {
  for (const StackSpec& s : kSpecs) {
    if (name == s.name) return s.stack;
  }
  return std::nullopt;
}

namespace {
struct LossName {
  LossKernel loss;
  const char* name;
};
constexpr LossName kLossNames[] = {{LossKernel::kFp32Copy, "fp32-logits"},
                                   {LossKernel::kFused, "fused"},
                                   {LossKernel::kChunkedFused, "chunked-linear"},
                                   {LossKernel::kMegatronFp32, "vocab-parallel-fp32"}};
}  // namespace

const char* loss_kernel_name(LossKernel loss) {
  for (const LossName& n : kLossNames) {
    if (n.loss == loss) return n.name;
  }
  return "fp32-logits";
}

std::optional<LossKernel> loss_kernel_from_name(const std::string& name) {
  for (const LossName& n : kLossNames) {
    if (name == n.name) return n.loss;
  }
  return std::nullopt;
}

const char* fp8_recipe_name(Fp8Recipe r) { return r == Fp8Recipe::kDelayed ? "delayed" : "current"; }

std::optional<Fp8Recipe> fp8_recipe_from_name(const std::string& name) {
  for (Fp8Recipe r : {Fp8Recipe::kDelayed, Fp8Recipe::kCurrent}) {
    if (name == fp8_recipe_name(r)) return r;
  }
  return std::nullopt;
}

const Fp8Casting* fp8_casting(const StackSpec& spec, std::optional<Fp8Recipe> recipe) {
  if (!recipe || *recipe == spec.fp8_recipe) return &spec.fp8;
  return spec.fp8_other_recipe;
}

const char* cp_comm_type_name(ContextAttention comm) {
  switch (comm) {
    case ContextAttention::kRing: return "p2p";
    case ContextAttention::kAllGatherKv: return "all_gather";
    case ContextAttention::kAllGatherRotate: return "allgather_rotate";
  }
  return "?";
}

std::optional<ContextAttention> cp_comm_type_from_name(const std::string& name) {
  for (ContextAttention c : {ContextAttention::kRing, ContextAttention::kAllGatherKv, ContextAttention::kAllGatherRotate}) {
    if (name == cp_comm_type_name(c)) return c;
  }
  return std::nullopt;
}

const char* loss_kernel_choices() { return "fp32-logits | fused | chunked-linear | vocab-parallel-fp32"; }

const char* stack_choices() {
  return "trainplan | trainplan-reference | pytorch-eager | torch-compile | megatron-te | fsdp1 | composer | fsdp2 | fsdp2-compile | deepspeed | "
         "deepspeed-v0.3 | hf-ddp | hf-fsdp2";
}

}  // namespace trainplan::costmodel
