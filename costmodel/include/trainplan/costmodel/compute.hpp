#pragma once
// Per-GPU cost of one transformer layer, the embedding and the output layer for one micro-batch:
// time (GEMMs with a shape-dependent efficiency, memory-bound kernels at HBM bandwidth, fused or
// standard attention, tensor/context/expert-parallel communication), FLOPs, and the activation
// bytes kept for the backward pass (Korthikanti et al. 2022, Table 2, generalised to Llama-style
// blocks, GQA, MoE, flash attention and fp8).

#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/model.hpp"
#include "trainplan/costmodel/network.hpp"
#include "trainplan/costmodel/plan.hpp"

namespace trainplan::costmodel {

// Kernel timing on one GPU.
class KernelModel {
 public:
  KernelModel(const GpuSpec& gpu, Dtype compute_dtype);
  // C[m,n] = A[m,k] B[k,n], `batch` independent products. Efficiency falls with wave quantization
  // over the SMs (128x128 output tiles) and with a short k (pipeline fill); the kernel takes at
  // least the time to stream its operands through HBM and at least min_kernel_time.
  [[nodiscard]] double gemm_seconds(double m, double n, double k, double batch = 1, double operand_bytes = 2) const;
  // A bandwidth-bound kernel moving `bytes` through HBM.
  [[nodiscard]] double memory_seconds(double bytes) const;
  // A fused (flash) attention kernel doing `flops`; backward runs at 80% of forward efficiency.
  [[nodiscard]] double attention_seconds(double flops, bool backward) const;
  [[nodiscard]] double peak_flops() const { return peak_; }

 private:
  const GpuSpec& gpu_;
  double peak_;
};

struct LayerSetting {
  double micro_batch = 1;   // sequences
  double seq_len = 0;       // full sequence length (tokens)
  int tp = 1, cp = 1, ep = 1;
  bool sequence_parallel = false;
  Precision precision = Precision::kBf16;
  bool dropout = false;
  AttentionKernel attention = AttentionKernel::kFlash;
  bool fused_kernels = true;
  Recompute recompute = Recompute::kNone;
  TrainingMode mode = TrainingMode::kPretrain;
  LoraConfig lora;
  CollectiveGroup tp_group, cp_group, ep_group;
};

// One transformer layer, one micro-batch, one GPU. Times in seconds, FLOPs per GPU, bytes.
struct LayerCost {
  double forward = 0;          // forward compute (no communication)
  double backward = 0;         // backward compute
  double recompute = 0;        // extra forward compute in backward (selective or full)
  double tp_comm_forward = 0;  // exposed tensor-parallel collectives
  double tp_comm_backward = 0;
  double tp_comm_recompute = 0;
  double cp_comm = 0;          // exposed context-parallel (ring attention) traffic, fwd + bwd
  double ep_comm = 0;          // expert-parallel all-to-all, fwd + bwd (+ recompute)
  double model_flops = 0;      // forward + backward FLOPs of the model convention (no recompute)
  double hardware_flops = 0;   // FLOPs executed, recompute included
  double activation_bytes = 0;       // kept for backward with the chosen recompute
  double full_activation_bytes = 0;  // kept without recompute (live while one layer is recomputed)

  [[nodiscard]] double forward_total() const { return forward + tp_comm_forward; }
  [[nodiscard]] double backward_total() const {
    return backward + recompute + tp_comm_backward + tp_comm_recompute + cp_comm + ep_comm;
  }
};

// Embedding (first stage) and output layer with the loss (last stage).
struct EndsCost {
  double embedding_forward = 0, embedding_backward = 0;
  double head_forward = 0, head_backward = 0;  // final norm, output GEMM, cross-entropy
  double head_model_flops = 0;
  double embedding_activation_bytes = 0;
  double head_activation_bytes = 0;  // final-norm input, logits and fp32 loss buffers
};

// Mixes two layer costs: (1 - f) * a + f * b, for recomputing a fraction f of the layers.
[[nodiscard]] LayerCost blend(const LayerCost& a, const LayerCost& b, double f);

[[nodiscard]] LayerCost transformer_layer_cost(const ModelSpec& model, const HardwareProfile& hw, const LayerSetting& s);
[[nodiscard]] EndsCost ends_cost(const ModelSpec& model, const HardwareProfile& hw, const LayerSetting& s);

[[nodiscard]] Dtype compute_dtype(Precision p);

}  // namespace trainplan::costmodel
