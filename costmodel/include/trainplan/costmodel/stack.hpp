#pragma once
// The software stack a prediction is for. The same GEMMs and attention kernels run in every
// stack; stacks differ in which element-wise work is fused, which tensors autograd keeps, how
// the loss is computed, how gradients are accumulated and how the optimizer step runs. Every
// difference is stated here, once, with its source; the layer, memory and optimizer models read
// these fields and nothing else about the stack.

#include <optional>
#include <string>

#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/kernels.hpp"

namespace trainplan::costmodel {

enum class Stack {
  kTrainplan,     // this project's executor with its fused paths (--kernels fused, the default)
  kTrainplanReference,  // the executor's plain path (--kernels reference; the executor before its fused paths)
  kPytorchEager,  // a plain PyTorch module in eager mode (bench/eager_reference.py)
  kTorchCompile,  // the same module under torch.compile (Inductor)
  kMegatronTe,    // Megatron-LM / Megatron-Core with Transformer Engine
  kFsdp1,         // PyTorch FSDP1 (FlatParameter per wrapped block): Accelerate, Lightning, Composer
  kComposer,      // FSDP1 as Composer runs MosaicML's MPT models: flash-attn's fused cross-entropy
  kFsdp2,         // PyTorch FSDP2 (fully_shard, per-parameter DTensor): torchtitan, Accelerate FSDP2
  kFsdp2Compile,  // the same under torch.compile (torchtitan's --compile: each block and the loss compiled)
  kDeepspeed,     // DeepSpeed ZeRO-1/2/3 on a PyTorch module
  kDeepspeedV03,  // DeepSpeed v0.3.16 (2021) with the PyTorch of its time: ZeRO-3 parameter by parameter
  kHfDdp,         // a Hugging Face module in fp32 under torch.autocast with PyTorch DDP (Accelerate without FSDP, the HF Trainer)
  kHfFsdp2,       // a Hugging Face module under FSDP2 as Accelerate's fsdp_version 2 runs it
};
inline constexpr Stack kStacks[] = {Stack::kTrainplan, Stack::kTrainplanReference, Stack::kPytorchEager, Stack::kTorchCompile,
                                    Stack::kMegatronTe, Stack::kFsdp1, Stack::kComposer, Stack::kFsdp2, Stack::kFsdp2Compile,
                                    Stack::kDeepspeed, Stack::kDeepspeedV03, Stack::kHfDdp, Stack::kHfFsdp2};
// PyTorch FSDP1 (fsdp1, composer): FlatParameters, sharding strategies, Accelerate's fsdp_version 1.
[[nodiscard]] constexpr bool is_fsdp1(Stack stack) { return stack == Stack::kFsdp1 || stack == Stack::kComposer; }

// How the loss over the vocabulary is computed.
enum class LossKernel {
  kFp32Copy,    // logits.float() then log_softmax + nll: an fp32 copy and an fp32 log-softmax kept
  // One fused kernel on the 16-bit logits: fp32 only in registers, the gradient written over the
  // logits (Inductor's compiled F.cross_entropy; flash-attn's CrossEntropyLoss with
  // inplace_backward=True, Dao-AILab/flash-attention flash_attn/losses/cross_entropy.py).
  kFused,
  kMegatronFp32,  // Megatron's vocab-parallel cross-entropy: fp32 copy, fp32 softmax kept, gradient in place
  // Chunked linear cross-entropy (the executor's fused path; Liger-Kernel's
  // LigerFusedLinearCrossEntropyLoss does the same): per chunk of tokens the logits GEMM,
  // one kernel turning the 16-bit logits into their gradient in place, then the input- and
  // weight-gradient GEMMs, all in the forward; kept: the input's gradient and an fp32 weight
  // gradient. Never more than one chunk of logits.
  kChunkedFused,
};

// Where micro-batch gradients are summed.
enum class GradAccumulation {
  kFp32Buffer,     // autograd's 16-bit gradients added into an fp32 buffer per micro-batch (a pass)
  kParamDtype,     // autograd accumulates into param.grad in the compute dtype (a pass from the 2nd)
  kFusedInGemm,    // the weight-gradient GEMM accumulates into main_grad (no extra pass), in the reduce dtype
  // The executor's fused path (engine.cpp fused_accumulation): as kFusedInGemm where its fp32
  // buffer holds the whole step's gradient and TP is off (ZeRO-0/1, tp 1, and cp 1, which the
  // executor does not run yet), for the Llama-style blocks' weights (the norms' too), the
  // embedding's scatter and the loss's output weight; as kFp32Buffer elsewhere (ZeRO-2/3, TP,
  // LoRA, and GPT blocks, whose embedding and loss still add into the buffer themselves).
  kFusedInGemmUnsharded,
};

// How attention sees the whole sequence under context parallelism (cp > 1).
enum class ContextAttention {
  // Ring attention (Megatron-Core's default "p2p", torchtitan): K/V chunks passed round the cp
  // ranks, each step overlapping the next block's computation; the backward passes K/V and their
  // gradients round again. A causal kernel on each block, load-balanced chunks.
  kRing,
  // All-gather of K/V (Llama 3, Dubey et al. 2024 Sec. 3.3.2; Megatron-Core's "all_gather"), the
  // executor's (executor/src/parallel/context_parallel.hpp): K/V all-gathered before attention and their
  // gradients reduce-scattered after it, neither overlapped; the gathered K/V kept for backward.
  // Each of a rank's two query chunks attends the keys up to its own end through a masked
  // kernel: (2cp + 1) / 4cp of the seq/cp x seq rectangle, against 1/2 for a causal kernel.
  kAllGatherKv,
  // PyTorch's context parallelism with its default rotate method, "allgather" (torchtitan's
  // context_parallel_rotate_method default; PyTorch 2.11 torch/distributed/tensor/experimental/
  // _context_parallel/_attention.py: _ContextParallelOptions.rotate_method = ALL_GATHER,
  // _AllGatherRotater, _templated_ring_attention and _templated_ring_attention_backward).
  // Attention still runs block by block as the ring's does (a causal kernel on each block,
  // load-balanced chunks), but the K/V of every rank arrive in one all-gather, launched before
  // the first block and waited for after it: it overlaps that block only. Backward all-gathers
  // K/V again the same way, and passes the K/V gradients round the ranks in float32
  // (convert_to_f32; dkv_rotater is ALL_TO_ALL), each step overlapping the next block; the last
  // arrives after the loop, exposed. The gathered K/V live only during the layer's attention.
  kAllGatherRotate,
};

// How much of a block's forward full activation recompute runs again in backward.
enum class FullRecomputeReplay {
  // All of it: a reentrant checkpoint (Megatron's tensor_parallel.checkpoint, CheckpointFunction
  // in megatron/core/tensor_parallel/random.py; DeepSpeed's activation checkpointing; Hugging
  // Face's gradient_checkpointing_enable, use_reentrant=True by default), the executor's
  // RecomputedBlockFn (executor/src/train/engine.cpp), or a non-reentrant one with early_stop off
  // (torchtitan from 25413d224, 2025-08).
  kWhole,
  // Up to the last op that saves a tensor for backward: torch.utils.checkpoint without reentry
  // stops its replay as soon as every saved tensor is back (torch 2.11.0 torch/utils/checkpoint.py,
  // early_stop=True by default: _StopRecomputationError once recomp_counter reaches the forward's
  // saved tensors). An ATen op's autograd node saves its inputs before the kernel runs
  // (tools/autograd/gen_variable_type.py: the saves precede the redispatch), so in a dense block
  // whose last linear (w2, fc2) is followed by nothing that saves (no dropout, no LoRA adapter,
  // no custom autograd function such as torchao's fp8 matmul, which saves after its forward) that
  // GEMM, the tensor-parallel collective after it and the residual add are not run again.
  kUntilLastSaved,
  // What backward reads: under torch.compile the checkpointed block is traced and the min-cut
  // partitioner puts into the backward graph only the recomputed nodes the gradients need
  // (torch/_functorch/partitioners.py), so the last linear's output, which feeds only the residual
  // stream, and all after it are not recomputed, dropout or LoRA adapters or fp8 alike.
  kWhatBackwardNeeds,
};

// What a pipeline stage sends its neighbour under tensor parallelism, and the all-gathers over the
// tensor-parallel group that puts back together (exposed: the next pass takes the gathered tensor).
enum class PipelineSend {
  // The tensor as the rank holds it: its sequence shard under sequence parallelism, else the whole
  // tensor, each tensor-parallel rank sending the same one over its own link. Megatron-Core since
  // 3c92fa93 (2023-03, pipeline_parallel/p2p_communication.py), torch.distributed.pipelining, the
  // executor (executor/src/train/trainer.cpp activation_shape).
  kAsHeld,
  // Without sequence parallelism, split over the tensor-parallel group, each rank sending 1/t, and
  // all-gathered after the receive: the activation and its gradient, 2 gathers a micro-batch.
  // Megatron-LM's scatter_gather_tensors_in_pipeline, on by default from 72e4230b (2021-02) until
  // its move into Megatron-Core (megatron/p2p_communication.py _communicate:
  // split_tensor_into_1d_equal_chunks, gather_split_1d_tensor; off under sequence parallelism
  // from 739cb43d, 2022), as the published Megatron-LM runs of 2021-2022 ran. Under sequence
  // parallelism as kAsHeld.
  kScatterGather,
  // DeepSpeed's PipelineEngine (runtime/pipe/engine.py, pipe_partitioned and grad_partitioned
  // true by default: v0.5.4 on, in the config from v0.12.3): whatever the rank holds split into
  // 1/t (PartitionedTensor), sequence parallel or not, and 3 gathers a micro-batch on a stage:
  // the received activation (_exec_forward_pass), the stage's own output, kept split after it was
  // sent and put back before its backward (_exec_backward_pass), and the received gradient.
  kPartitioned,
  // DeepSpeed before v0.5.4 (is_grad_partitioned = False): the activation split so, its gradient
  // sent whole; 2 gathers (the received activation, and the stage's own output in
  // _exec_recv_grads).
  kPartitionedActivation,
};
// What `send` splits over the tensor-parallel group, with sequence parallelism or not: the
// activation, its gradient, and the all-gathers a stage runs per micro-batch (and model chunk)
// to put them back together (0 where nothing is split).
struct PipelineSplit {
  bool activation = false, gradient = false;
  int gathers = 0;
};
[[nodiscard]] PipelineSplit pipeline_split(PipelineSend send, bool sequence_parallel);


// What quantising a linear layer's GEMM operands to fp8 moves, in bytes per element beyond the
// bf16 path: its input (an amax pass where the scale is computed from the tensor itself, then the
// cast writing fp8 in both layouts, row-major for the forward GEMM and transposed for the weight
// gradient's), less where the op that produced it (a norm, the activation function) writes the
// fp8 copy itself or takes the amax pass into its own; the gradient of its output in backward
// (the same, the activation's backward for fc1's); its weight per micro-batch, forward and
// backward casts (0 where the fp8 weight is cast once per step and kept).
// How fp8 training scales a tensor before the cast: by an amax kept from earlier steps (delayed:
// Transformer Engine's DelayedScaling, Megatron's --fp8-recipe delayed), or by the tensor's own
// amax, taken first (current: TE's Float8CurrentScaling, Megatron's --fp8-recipe tensorwise;
// torchao's tensorwise float8 and the executor scale this way only).
enum class Fp8Recipe { kDelayed, kCurrent };
[[nodiscard]] const char* fp8_recipe_name(Fp8Recipe r);  // "delayed", "current"
[[nodiscard]] std::optional<Fp8Recipe> fp8_recipe_from_name(const std::string& name);

struct Fp8Casting {
  double input = 0, input_from_norm = 0, input_from_activation = 0;
  double grad_output = 0, grad_output_from_activation = 0;
  double weight_forward = 0, weight_backward = 0;
  // A linear layer's kept input (for its weight gradient) is its fp8 cast (Transformer Engine), not
  // the high-precision tensor (torchao's matmul_with_hp_or_float8_args, the executor).
  bool keeps_fp8_inputs = true;
  // Linears that share an input (separate Q/K/V or gate/up GEMMs) cast it once for all of them.
  bool shared_input_cast_once = false;
  // Bytes per trained weight element per micro-batch beyond the casts: the weight gradient's fp8
  // GEMM writes a float32 product that a separate pass adds into the float32 sum (read 4, read 4,
  // write 4), where the bf16 GEMM accumulates into the sum itself (beta = 1).
  double weight_gradient_add = 0;
  // The fraction of the stream rate (KernelRates::stream) the stack's cast kernels reach: amax
  // reductions, casts and transposing casts together; 1 where no measurement says otherwise.
  double rate = 1;
  // Kernels one cast launches: 1 where the amax is taken in the cast or in the kernel that wrote
  // the tensor; more where the amax and the scale are kernels of their own.
  int kernels_per_cast = 1;
  // Under PyTorch's tensor parallelism with sequence parallelism, the all-gathers move fp8
  // (torchao's Float8ColwiseParallel / PrepareFloat8ModuleInput gather the cast inputs, and
  // Float8RowwiseParallel's output gradients are cast before their backward all-gather).
  bool tp_gathers_fp8 = false;
};

// How a stack's data parallelism moves parameters and gradients under ZeRO / FSDP, beyond the
// collectives themselves (estimate.cpp). Zero where the stack does nothing of the kind.
struct DataParallelSpec {
  // ZeRO-3: parameters one all-gather carries. 0: an FSDP unit (a transformer block, or whole
  // blocks up to the plan's fsdp_wrap_min_params); > 0: DeepSpeed's fetch of one submodule (each
  // linear layer) coalesced with its prefetch bucket of this many parameters.
  double gather_bucket_params = 0;
  // Gathered units held at once under ZeRO-3 with prefetch: FSDP1's limit_all_gathers (the unit
  // running and one prefetched); FSDP2's forward keeps the previous unit's all-gather output
  // until the next unit's copy-out (3); 0: the plan's prefetch (2, else 1).
  double gathered_units = 0;
  // ZeRO-3: a gathered parameter is not released when the parameters fetched before its next use
  // number fewer than this (DeepSpeed's stage3_max_reuse_distance, 1e9: the last layers of the
  // forward, whose backward follows within that distance, stay gathered and are not gathered
  // again; a model under half of it keeps every layer); 0: released after each use.
  double max_reuse_distance_params = 0;
  // Bytes per gathered parameter the compute stream moves per gather (copy-in to the all-gather
  // buffer, copy-out into the parameters).
  double gather_copy_bytes = 0;
  // Bytes per parameter per micro-batch the compute stream moves on the 16-bit unsharded gradient
  // before its reduction (a copy into the reduce buffer, a pre-divide), beyond a cast to the
  // reduce dtype where that differs; `reduce_cast_fused`: the copy casts (FSDP2's chunk_cat), so
  // the cast costs only its wider write.
  double reduce_copy_bytes = 0;
  bool reduce_cast_fused = false;
  // Gradients reduced by one collective (elements): DeepSpeed's reduce_bucket_size; 0: a unit's.
  double reduce_bucket_params = 0;
  // Gradient bucket buffers kept for the reductions (elements each, in the gradient's dtype):
  // DeepSpeed's IPG buckets; 0: DDP's two 25 MiB buckets (ZeRO-0..2) and none under ZeRO-3.
  double bucket_params = 0;
  int buckets = 0;
  // Bytes per parameter of the sharded gradient kept between micro-batches under ZeRO-2/3: FSDP's
  // fp32 shard, DeepSpeed's partition in the compute dtype; 0: as `grads` says.
  double sharded_grad_bytes = 0;
  // ZeRO-2 is FSDP's SHARD_GRAD_OP: parameters gathered unit by unit before each micro-batch's
  // forward and kept to its backward, gradients reduce-scattered unit by unit each micro-batch.
  bool grad_op_units = false;
  // ZeRO-1/2 reduce by all-reducing whole buckets (DeepSpeed's use_multi_rank_bucket_allreduce),
  // ZeRO-2 every micro-batch, and overlap the backward only with overlap_comm (off below stage 3).
  bool zero12_all_reduce = false;
  bool zero2_every_micro_batch = false;
  bool zero12_overlap = true;
  // ZeRO-3: host seconds per rank of the shard group that the stack's Python loops over the ranks
  // take, on the thread that launches the model's kernels (DeepSpeed: a view per rank for each
  // gathered tensor and each coalesced gather, a slice per rank for each reduced gradient). The
  // host runs at most a couple of fetches ahead of the GPU, so beyond the GPU's time this is a
  // wait. 0: none (FSDP's copies are single ops over the flat buffer).
  double gather_host_seconds_per_rank_per_tensor = 0;
  double gather_host_seconds_per_rank_per_call = 0;
  double reduce_host_seconds_per_rank_per_tensor = 0;
  [[nodiscard]] bool loops_over_ranks() const {
    return gather_host_seconds_per_rank_per_tensor > 0 || gather_host_seconds_per_rank_per_call > 0 || reduce_host_seconds_per_rank_per_tensor > 0 ||
           list_copy_host_seconds > 0;
  }
  // ZeRO-3: tensors under this many elements stay whole on every rank and are never gathered
  // (DeepSpeed's stage3_param_persistence_threshold); 0: every tensor is sharded.
  double persistence_threshold_elements = 0;
  // ZeRO-3: each parameter tensor of at least persistence_threshold_elements is all-gathered by a
  // collective of its own (DeepSpeed v0.3.16 _allgather_param), not a submodule's coalesced.
  bool gather_per_tensor = false;
  // ZeRO-3: the all-gather takes a list of per-rank output tensors, which the ProcessGroupNCCL of
  // the time fills from a flat buffer with a copy per rank on the NCCL stream, each launched
  // from C++: this many host seconds per rank per gather, and a kernel per rank on the GPU's
  // communication stream. 0: one output buffer (no copies per rank).
  double list_copy_host_seconds = 0;
  // ZeRO-3: the host synchronizes the whole device before each gather it issues and after each
  // fetch (torch.cuda.synchronize): its loops run while the GPU has nothing queued, so they are
  // not hidden behind the GPU's work; each gather, queued after the Python loop, overlaps the
  // launches of its list's copies and the compute after them.
  bool sync_before_gather = false;
  // ZeRO-3: gradients all-reduced whole in the reduce buckets, each rank keeping its partition
  // (DeepSpeed v0.3.16's default, reduce_scatter false); false: reduce-scattered.
  bool zero3_all_reduce = false;
  // ZeRO-0/1 run PyTorch's DistributedDataParallel, whose buckets hold a copy of every gradient
  // beside param.grad: gradient_as_bucket_view=False,
  // its default (torch 2.11.0 torch/nn/parallel/distributed.py: True "can reduce peak memory
  // usage, where the saved memory size will be equal to the total gradients size"). Each
  // gradient is copied into its bucket when ready (divided by the ranks on the way) and the
  // averaged bucket copied back after the all-reduce (reducer.cpp mark_variable_ready_dense,
  // finalize_bucket_dense), a kernel per parameter tensor each way, once a step: gradient
  // accumulation runs under no_sync (Accelerate's accumulate, Lightning's, the Trainer's), which
  // skips the hooks. false: the stack reduces its own buffers (two 25 MiB buckets in flight).
  bool ddp_bucket_copies = false;
};

// Where a stack trains the fp32 module under torch.autocast (StackSpec::autocast).
enum class AutocastUse {
  kNever,
  // Without FSDP's sharding, tensor, context, pipeline or expert parallelism: on one GPU or under
  // plain data parallelism (torchtitan v0.2.2: DDP then, parallelize.py apply_ddp).
  kUnsharded,
  kAlways,  // in every 16-bit plan with master weights (a module under DDP: Accelerate, the HF Trainer)
};

struct StackSpec {
  Stack stack;
  const char* name;     // "trainplan", as on the command line and in documents
  const char* summary;  // one line for reports
  // Norms, rotary embedding, activation function and residual adds run as fused kernels that
  // move each tensor once (true), or as PyTorch's eager ATen ops at their measured rates.
  bool fused_elementwise;
  bool fused_qkv;        // Q, K and V projections as one GEMM
  bool fused_gate_up;    // SwiGLU gate and up projections as one GEMM
  LossKernel loss;
  GradAccumulation grads;
  // The optimizer's update: one fused kernel (32 bytes per parameter for mixed-precision AdamW,
  // at the measured fused-AdamW rate), or ATen ops moving `optimizer_update_factor` times that.
  bool fused_optimizer;
  double optimizer_update_factor;
  // Bytes per parameter the rest of the step moves: gradient norm, casts, the copy of the
  // masters into the 16-bit weights, zeroing.
  double optimizer_overhead_bytes;
  double optimizer_kernels_per_tensor;  // launches per parameter tensor in the whole optimizer step
  // Megatron's contiguous main-grad buffer, in the reduce dtype (fp32 with
  // accumulate_allreduce_grads_in_fp32, bf16 with --grad-reduce-in-bf16, the parameters' dtype
  // otherwise): zero_grad_buffer zeroes all of it at the start of every iteration (its shard under
  // Megatron FSDP), and where it is 16-bit the optimizer first copies its shard to fp32
  // (main_param.grad = main_grad.float(): 2 bytes read, 4 written). false: gradients freed
  // (zero_grad(set_to_none=True)) or zeroed within the optimizer's bytes.
  bool main_grad_buffer = false;
  // fp16 with loss scaling unscales the gradients the optimizer steps on and checks them for inf
  // first (torch._amp_foreach_non_finite_check_and_unscale_: each read and written once, 8 bytes
  // per fp32 gradient); false: the stack folds the scale into its norm and update (the executor
  // passes it to fused AdamW) or its fp16 path is not priced.
  bool fp16_unscale = false;
  // MLP tensors autograd keeps per token, in units of the MLP width: eager SwiGLU keeps the gate
  // and up outputs, silu(gate) and the product (4); a fused SwiGLU its two inputs and the down
  // projection's input (3); Inductor's partitioner recomputes the product (2). GELU MLPs keep the
  // fc1 output and the GELU output (2) in every stack.
  double swiglu_saved;
  // Norm outputs are not kept: each norm is recomputed in backward from its input (kept anyway as
  // the residual stream), its forward time added to the backward. Only without tensor
  // parallelism (the executor's fused norm path; under TP the norm output enters the TP region).
  bool norm_recomputed;
  // RMSNorm runs as Hugging Face transformers' LlamaRMSNorm (ElementwiseOp::kRmsNormUnfused): eight
  // ATen ops in float32 instead of one fused kernel, keeping for backward the float32 copy of its
  // input (pow's and the multiply's) and the normalised tensor before the weight (the weight's
  // multiply) rather than the input. The stacks whose modules are Hugging Face's (Accelerate,
  // DeepSpeed, Lightning on transformers models); LayerNorm blocks are unaffected (nn.LayerNorm).
  bool unfused_rms_norm = false;
  // Linears sharing an input (Q/K/V, gate/up) sum their input gradients in the GEMMs (cuBLAS beta
  // = 1: the running sum read once more per GEMM) rather than in separate adds. Only without TP,
  // like norm_recomputed (the executor's NormLinearsFn).
  bool gemm_sums_input_gradients;
  // The residual adds go into the norms' passes: each norm's backward adds the residual stream's
  // gradient to its own (no gradient sum where the stream forks), and the MLP norm's forward takes
  // x + the attention branch in its own pass (the block's output add stays). Only where
  // norm_recomputed holds, on RMSNorm blocks without LoRA dropout; the MLP side not on MoE layers
  // (the executor's norm_linears with `residual` and `branch`).
  bool residual_adds_in_norms;
  // Waits for the host once per micro-batch (the executor reads the loss with .item()).
  bool host_sync_per_micro_batch;
  // Host time to issue one kernel: the GPU idles when its kernels are shorter (small models).
  double host_seconds_per_kernel;
  // The output layer's rows are padded to a multiple of this times tp (Megatron's
  // --make-vocab-size-divisible-by 128); 1: the vocabulary as it is.
  int vocab_pad_multiple;
  ContextAttention context_attention;
  // Under sequence parallelism the column-parallel GEMMs take the all-gathered norm output: kept
  // as their saved input (true: autograd's linear, torchtitan's SequenceParallel), or the
  // sequence shard kept and gathered again in backward (false: Megatron-Core / Transformer
  // Engine, Korthikanti et al. 2022, Sec. 4.2.2; the executor's gathered_linears, whose gather
  // runs exposed (the backward GEMMs wait for it), except with LoRA dropout, whose copies take the gathered
  // input).
  bool sequence_parallel_keeps_gathered_input;
  // Under sequence parallelism the activations are [batch, seq, hidden], sharded on the sequence
  // (DTensor's Shard(1): PyTorch's parallelize_module with SequenceParallel, as torchtitan runs
  // it), while NCCL gathers and scatters along the first dimension. So each reduce-scatter first
  // concatenates its input's chunks (torch 2.11.0 torch/distributed/_functional_collectives.py
  // reduce_scatter_tensor, scatter_dim != 0: torch.cat(torch.chunk(self, group_size,
  // dim=scatter_dim))), and each all-gather of a micro-batch of more than one sequence
  // rearranges its output (all_gather_tensor, torch/_utils.py _maybe_view_chunk_cat: a view only
  // when the batch is 1, else torch.cat(torch.chunk(res, group_size, dim=0), dim=gather_dim)):
  // each a copy of the gathered tensor, after (or before) the collective and waited for like it.
  // false: Megatron's [seq, batch, hidden] layout gathers and scatters along the first dimension.
  bool sequence_parallel_rearranges = false;
  // Training in fp8 (precision fp8): what quantising the operands of a linear layer's three GEMMs
  // moves beyond the bf16 path, in bytes per element (Fp8Casting). The output layer, a router and
  // LoRA adapters stay in bf16 in every stack (Megatron's output layer is a plain column-parallel
  // linear and its router no Transformer Engine module; torchtitan's float8 configs leave the
  // output layer out of the conversion).
  Fp8Casting fp8;
  // The recipe `fp8` is (the stack's default), and the casts of its other recipe where the stack
  // offers both (Megatron-LM with Transformer Engine: delayed by default, current scaling too);
  // null: only its own (a plan asking for the other is refused).
  Fp8Recipe fp8_recipe = Fp8Recipe::kCurrent;
  const Fp8Casting* fp8_other_recipe = nullptr;
  // The fused attention kernel (kernels.hpp AttentionImpl).
  AttentionImpl attention_kernel = AttentionImpl::kProfile;
  // What full recompute runs again (FullRecomputeReplay).
  FullRecomputeReplay full_recompute_replay = FullRecomputeReplay::kWhole;
  // Selective recompute is PyTorch's op-level selective checkpointing (torchtitan's policy: the
  // outputs of SDPA and every other matmul kept, the rest recomputed); false: the attention core
  // recomputed (Megatron's, the executor's).
  bool op_level_selective = false;
  DataParallelSpec dp;
  // The dtype data parallelism reduces gradients in by default: fp32 (torchtitan's
  // mixed_precision_reduce, Megatron's fp32 main grads, the executor); the compute dtype where the
  // stack's default follows it (FSDP1's MixedPrecision with reduce_dtype None, DeepSpeed's
  // communication_data_type). `planner --stack` starts a request with it; a plan states its own.
  Dtype reduce_dtype = Dtype::kFp32;
  // The parallelisms the stack runs besides data parallelism (validate_plan refuses the others,
  // so the search never recommends them), and the highest ZeRO stage it runs with a pipeline.
  bool tensor_parallel = true, context_parallel = true, pipeline_parallel = true, expert_parallel = true;
  int max_zero_with_pipeline = 3;
  int max_zero_with_tensor_parallel = 3;  // likewise beside tensor parallelism
  int max_zero_with_expert_parallel = 3;  // likewise beside expert parallelism
  // The pipeline engine (pp > 1). Runs several model chunks per stage (Megatron's interleaved
  // 1F1B, torch.distributed.pipelining's Interleaved1F1B, the executor's); false: one chunk per
  // stage (DeepSpeed's PipelineEngine runs TrainSchedule, 1F1B: runtime/pipe/schedule.py).
  bool interleaved_pipeline = true;
  // A stage's exchange with a neighbour after a pass (its output sent, the neighbour's received)
  // runs both transfers at once (Megatron's batch_isend_irecv), or one after the other, each
  // waited for (DeepSpeed's PipelineEngine: p2p.send then p2p.recv, runtime/pipe/p2p.py, in the
  // order TrainSchedule lists them): 2 transfers' time.
  bool pipeline_send_recv_together = true;
  // Runs Megatron's sequence parallelism (Korthikanti et al. 2022): false where the stack predates
  // it (Megatron-DeepSpeed of 2021 under DeepSpeed v0.3).
  bool sequence_parallel = true;
  // Counts the embedding and the loss as a layer each of its pipeline split (ParallelConfig::
  // ends_in_split): Megatron-Core's --account-for-embedding-in-pipeline-split and
  // --account-for-loss-in-pipeline-split (megatron/core/transformer/transformer_block.py
  // get_num_layers_to_build at d98e8a64dd), which its --pipeline-model-parallel-layout expresses too.
  bool ends_in_pipeline_split = false;
  // Under sequence parallelism a model with learned positions all-reduces the vocab-parallel
  // embedding's output, adds the positions to the whole sequence and then splits it (and clones
  // the split: clone_scatter_output_in_embedding), where one without them reduce-scatters:
  // Megatron-Core's LanguageModelEmbedding (reduce_scatter_embeddings only without position
  // embeddings, megatron/core/models/common/embeddings/language_model_embedding.py at d98e8a64dd),
  // Megatron-LM's Embedding of 2022 (all-reduce in VocabParallelEmbedding, then
  // scatter_to_sequence_parallel_region). false: the reduce-scatter, then the add on the shard
  // (the executor's embedding).
  bool embedding_all_reduces_before_positions = false;
  PipelineSend pipeline_send = PipelineSend::kAsHeld;
  // Runs ZeRO-3 sharded within groups and replicated across them (FSDP's HYBRID_SHARD, DeepSpeed's
  // MiCS, plan key shard_group).
  bool hybrid_shard = true;
  // Runs ZeRO-1, optimizer states sharded with gradients and parameters whole: Megatron's
  // distributed optimizer, DeepSpeed's stage 1, PyTorch DDP with ZeroRedundancyOptimizer, the
  // executor. FSDP has no such mode: FSDP1's ShardingStrategy is NO_SHARD, SHARD_GRAD_OP,
  // FULL_SHARD or a hybrid of them (torch/distributed/fsdp/api.py), FSDP2's fully_shard shards
  // parameters, gradients and optimizer states together, resharding after forward or not.
  bool optimizer_only_sharding = true;
  // Runs pure 16-bit training (TrainingConfig::master_weights false): a module cast to bf16 under
  // PyTorch's own optimizers keeps no fp32 copy. Megatron's and DeepSpeed's 16-bit optimizers
  // always keep fp32 main parameters (Float16OptimizerWithFloat16Params; ZeRO's fp32 partitions),
  // and the executor trains with fp32 masters.
  bool pure_16bit = false;
  // Frees the gradients after each optimizer step (zero_grad(set_to_none=True), PyTorch's default
  // since 2.0: torch/optim/optimizer.py Optimizer.zero_grad; FSDP's sharded gradients alike) and
  // makes them again in the next backward: in a step of one micro-batch none is alive during the
  // forward, and in the backward a layer's gradients appear as its activations go. false: the
  // stack keeps gradient buffers through the step (Megatron's main_grad, DeepSpeed's partitions,
  // the executor's fp32 buffers).
  bool grads_freed_each_step = false;
  // Where the stack trains its fp32 module under torch.autocast rather than in its sharding's
  // mixed precision (AutocastUse; autocast_fp32_module in estimate.hpp): float32 weights,
  // gradients and optimizer states, each linear layer's weight and input cast to the 16-bit dtype
  // at every use, a float32 residual stream.
  AutocastUse autocast = AutocastUse::kNever;
  // The highest ZeRO stage the stack runs (PyTorch DDP: 0).
  int max_zero = 3;
  // Runs selective recompute (an op-level policy or the attention core's); false: only whole
  // blocks (Accelerate's fsdp_activation_checkpointing, transformers' gradient checkpointing).
  bool selective_recompute = true;
  // Runs fp8 all-gathers of the linear layers' weights (TrainingConfig::fp8_all_gather): torchao's
  // Float8LinearConfig enable_fsdp_float8_all_gather, which hooks FSDP2's fully_shard
  // (WeightWithDynamicFloat8CastTensor's fsdp_pre_all_gather / fsdp_post_all_gather), for its
  // tensorwise recipe only. FSDP1, DeepSpeed and Megatron gather their 16-bit parameters.
  bool fp8_all_gather = false;
  // ZeRO-0 in bf16 runs DeepSpeed's BF16_Optimizer (runtime/engine.py get_data_types: bf16
  // without ZeRO accumulates gradients in fp32, so _do_optimizer_sanity_check picks BFLOAT16;
  // runtime/bf16_optimizer.py): fp32 master weights and optimizer states partitioned over the
  // data-parallel ranks as under ZeRO-1; each backward's bf16 param.grad (freed only when the
  // next backward starts, clear_lp_grads) added into an unsharded fp32 gradient buffer
  // (update_hp_grads: a cast, then an add); after the last micro-batch that buffer all-reduced
  // whole in the reduce dtype (engine.py allreduce_bucket, communication_data_type: in bf16 a
  // bf16 copy of it alive during the all-reduce, the average and the copy back; in fp32 the
  // average in place), its norm taken and the whole buffer zeroed after the step
  // (get_grads_for_norm, clear_hp_grads), and its partition stepped with no cast; the bf16
  // parameters then all-gathered (update_lp_params). False: ZeRO-0 is plain data parallelism.
  bool bf16_optimizer_at_zero0 = false;
  // Offloads the optimizer only through ZeRO (DeepSpeed's ZeRO-Offload: zero_optimization's
  // offload_optimizer, runtime/zero/offload_config.py): a plan at ZeRO-0 with offload is refused.
  bool offload_needs_zero = false;
  // Its context parallelism calls the attention kernel the plan names on each chunk (Megatron-Core:
  // Transformer Engine's attention, FlashAttention-3 among its backends). False: it splits SDPA
  // calls (PyTorch's context_parallel, the executor), so FlashAttention-3 cannot run under it.
  bool context_parallel_calls_kernel = false;
  const char* source;
};

[[nodiscard]] const StackSpec& stack_spec(Stack stack);
// The first of tp, cp, pp and ep above 1, a hybrid shard group above 0 and sequence parallelism
// that `stack` does not run, as a plan error naming the field ("/parallel/cp: the fsdp1 stack
// has no context parallelism (ring attention)"); "" when it runs them all.
[[nodiscard]] std::string unsupported_parallelism(Stack stack, int tp, int cp, int pp, int ep, int shard_group, bool sequence_parallel);
// "/parallel/schedule: ..." where the stack's pipeline engine runs 1F1B only (interleaved_pipeline
// false: DeepSpeed's TrainSchedule) and the plan asks for another schedule (gpipe, interleaved,
// virtual_stages > 1); "" otherwise.
[[nodiscard]] std::string unsupported_schedule(Stack stack, bool gpipe, bool interleaved);
[[nodiscard]] const char* stack_name(Stack stack);
// The loss kernels by their document names: "fp32-logits", "fused", "chunked-linear",
// "vocab-parallel-fp32" (plan key training.loss, planner --loss).
[[nodiscard]] const char* loss_kernel_name(LossKernel loss);
// The casts a plan's fp8 recipe runs under `spec` (empty: the stack's own); null where the stack
// does not run that recipe.
[[nodiscard]] const Fp8Casting* fp8_casting(const StackSpec& spec, std::optional<Fp8Recipe> recipe);
[[nodiscard]] std::optional<LossKernel> loss_kernel_from_name(const std::string& name);
[[nodiscard]] const char* loss_kernel_choices();
// Context parallelism's K/V movement by Megatron-Core's --cp-comm-type names: "p2p" (the ring),
// "all_gather", "allgather_rotate" (plan key parallel.cp_comm_type, --fix cp_comm).
[[nodiscard]] const char* cp_comm_type_name(ContextAttention comm);
[[nodiscard]] std::optional<ContextAttention> cp_comm_type_from_name(const std::string& name);
// "trainplan", "trainplan-reference", "pytorch-eager", "torch-compile", "megatron-te", "fsdp1",
// "composer", "fsdp2", "fsdp2-compile", "deepspeed", "deepspeed-v0.3".
[[nodiscard]] std::optional<Stack> stack_from_name(const std::string& name);
// "trainplan | trainplan-reference | ... | deepspeed", for messages.
[[nodiscard]] const char* stack_choices();

}  // namespace trainplan::costmodel
