#pragma once
// Per-GPU cost of one transformer layer, the embedding and the output layer for one micro-batch,
// kernel by kernel for the plan's software stack (stack.hpp): every GEMM of the layer timed from
// its shape (kernels.hpp: measured tables or the analytic model), fused or standard attention,
// the memory-bound work (norms, rotary, activation function, residual adds, dropout, casts, the
// cross-entropy over the vocabulary), each kernel's latency, tensor/context/expert-parallel
// communication; FLOPs; and the bytes autograd keeps for the backward pass (Korthikanti et al.
// 2022, Table 2, generalised to Llama-style blocks, GQA, MoE, flash attention, fp8 and the
// tensors each stack keeps), plus the transient bytes the allocator sees.

#include <optional>

#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/kernels.hpp"
#include "trainplan/costmodel/model.hpp"
#include "trainplan/costmodel/network.hpp"
#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/stack.hpp"

namespace trainplan::costmodel {

struct LayerSetting {
  double micro_batch = 1;   // sequences
  double seq_len = 0;       // full sequence length (tokens)
  int tp = 1, cp = 1, ep = 1;
  bool sequence_parallel = false;
  Precision precision = Precision::kBf16;
  bool dropout = false;
  // ZeRO-2/3 shard the gradients; ZeRO-0/1 keep each whole through the step, which lets a stack
  // add it into the fp32 gradient in the GEMM or the loss (fused accumulation). All the layer sees of ZeRO.
  bool sharded_gradients = false;
  AttentionKernel attention = AttentionKernel::kFlash;
  AttentionMask attention_mask = AttentionMask::kCausal;
  std::optional<LossKernel> loss;  // empty: the stack's
  std::optional<AttentionImpl> attention_kernel;  // empty: the stack's
  std::optional<Fp8Recipe> fp8_recipe;  // empty: the stack's
  // fp8: the linear layers' weights arrive from FSDP2's all-gather already in fp8, with scales
  // computed once a step (TrainingConfig::fp8_all_gather under sharded parameters): no weight
  // cast in forward, a transposing copy of the fp8 weight in backward.
  bool fp8_gathered_weights = false;
  // The fp32 module runs under torch.autocast (autocast_fp32_module, estimate.hpp): each linear
  // layer's weight and input cast to the 16-bit dtype at every use, a float32 residual stream.
  bool autocast = false;
  std::optional<ContextAttention> cp_comm;  // empty: the stack's
  Stack stack = Stack::kTrainplan;
  Recompute recompute = Recompute::kNone;
  TrainingMode mode = TrainingMode::kPretrain;
  LoraConfig lora;
  CollectiveGroup tp_group, cp_group, ep_group;
};

// One transformer layer, one micro-batch, one GPU. Times in seconds, FLOPs per GPU, bytes.
struct LayerCost {
  double forward = 0;          // forward compute (no communication), kernel latencies included
  double backward = 0;         // backward compute, with the micro-batch's gradient accumulation pass
  double recompute = 0;        // extra forward compute in backward (selective or full)
  double tp_comm_forward = 0;  // exposed tensor-parallel collectives
  double tp_comm_backward = 0;
  double tp_comm_recompute = 0;
  // Of those three: the copies DTensor's sequence-parallel collectives make of the gathered
  // tensor (StackSpec::sequence_parallel_rearranges), on the compute stream, waited for like them.
  double tp_copies = 0;
  // Of forward, backward and recompute: torch.autocast's dtype casts (LayerSetting::autocast):
  // the weights' and their gradients', and eager's of the linear layers' inputs and gradients.
  double autocast_casts = 0;
  // Eager autocast: the bf16 copies of the layer's weights that only autocast's cache holds after
  // its forward (the layer recomputes its casts, so autograd keeps none): alive to the forward's end.
  double autocast_cache_bytes = 0;
  double cp_comm = 0;          // exposed context-parallel traffic (stack.hpp ContextAttention), fwd + bwd (+ recompute)
  // Bytes this rank sends for context parallelism, fwd + bwd (+ recompute), as the ring
  // algorithms move them (a (cp-1)/cp share of each all-gather's output and reduce-scatter's input).
  double cp_bytes = 0;
  double ep_comm = 0;          // expert-parallel all-to-all, fwd + bwd (+ recompute)
  // Bytes this rank sends for expert parallelism, fwd + bwd (+ recompute): the all-to-all dispatch
  // and combine move the routed token copies held by other ranks' experts, (ep-1)/ep of them
  // with balanced routing, in both directions and again for their gradients; each dispatch is
  // preceded by the counts per expert (int64).
  double ep_bytes = 0;
  double model_flops = 0;      // forward + backward FLOPs of the model convention (no recompute)
  double hardware_flops = 0;   // FLOPs executed, recompute included
  double kernels = 0;          // kernel launches of forward + backward (+ recompute)
  double activation_bytes = 0;       // kept for backward with the chosen recompute
  double full_activation_bytes = 0;  // kept without recompute (live while one layer is recomputed)
  // Freed during one layer's forward but held by the caching allocator for reuse: the largest
  // set of temporaries alive at once (with full recompute: the whole layer forward run without
  // a graph). Allocator slack at the backward peak.
  double forward_transient_bytes = 0;
  // Extra bytes alive at the peak of one layer's backward (activation and weight gradients).
  double backward_transient_bytes = 0;
  // The smallest tensor autograd keeps per layer (the caching allocator gives tensors under
  // 10 MiB no segment of their own).
  double smallest_saved_tensor_bytes = 0;
  // Every parameter's gradient of the layer is added into the fp32 gradient by the kernels that
  // compute it (GradAccumulation::kFusedInGemmUnsharded where it applies): no accumulation pass.
  bool gradients_in_gemm = false;

  [[nodiscard]] double forward_total() const { return forward + tp_comm_forward; }
  [[nodiscard]] double backward_total() const {
    return backward + recompute + tp_comm_backward + tp_comm_recompute + cp_comm + ep_comm;
  }
};

// Embedding (first stage) and output layer with the loss (last stage).
struct EndsCost {
  double embedding_forward = 0, embedding_backward = 0;
  double head_forward = 0, head_backward = 0;  // final norm, output GEMM, cross-entropy
  // Of the head's: torch.autocast's casts (the output layer's weight and input, as LayerCost's).
  double head_autocast_casts = 0;
  double head_model_flops = 0;
  double kernels = 0;
  double embedding_activation_bytes = 0;
  double head_activation_bytes = 0;        // kept from the loss forward to its backward
  double head_forward_transient_bytes = 0; // extra alive while the loss is computed (logits, fp32 copy)
  double head_backward_transient_bytes = 0;// extra alive at the loss backward's peak (gradients of the logits)
  // A block freed before the loss backward's peak that its requests cannot reuse (the 16-bit
  // logits' block when the gradients are fp32): allocator slack at that peak.
  double head_idle_bytes = 0;
  double largest_head_block_bytes = 0;     // the largest tensor of the loss (allocator segment size)
  double padded_vocab = 0;                 // the output layer's rows (the stack's vocabulary padding)
  // Parameters whose gradient the loss adds into the fp32 gradient itself (trainplan's chunked
  // loss under ZeRO-0/1): the micro-batch's gradient-accumulation pass skips them.
  double fused_accumulation_params = 0;
  // The same for the token table, scattered into the fp32 gradient by the embedding's backward.
  double fused_embedding_params = 0;
};

// Mixes two layer costs: (1 - f) * a + f * b, for recomputing a fraction f of the layers.
[[nodiscard]] LayerCost blend(const LayerCost& a, const LayerCost& b, double f);

[[nodiscard]] LayerCost transformer_layer_cost(const ModelSpec& model, const HardwareProfile& hw, const LayerSetting& s);
[[nodiscard]] EndsCost ends_cost(const ModelSpec& model, const HardwareProfile& hw, const LayerSetting& s);

// Whether two settings are the same in every field (they price the same layer and ends).
[[nodiscard]] bool same_setting(const LayerSetting& a, const LayerSetting& b);

[[nodiscard]] Dtype compute_dtype(Precision p);

}  // namespace trainplan::costmodel
