#include "trainplan/costmodel/compute.hpp"

#include <algorithm>
#include <cmath>

namespace trainplan::costmodel {

Dtype compute_dtype(Precision p) {
  switch (p) {
    case Precision::kFp32: return Dtype::kFp32;
    case Precision::kBf16: return Dtype::kBf16;
    case Precision::kFp16: return Dtype::kFp16;
    case Precision::kFp8: return Dtype::kFp8;
  }
  return Dtype::kBf16;
}

KernelModel::KernelModel(const GpuSpec& gpu, Dtype dtype) : gpu_(gpu), peak_(gpu.peak_for(dtype).value()) {}

double KernelModel::gemm_seconds(double m, double n, double k, double batch, double operand_bytes) const {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 0.0;
  constexpr double kTile = 128.0;  // output tile edge of the usual cuBLAS/CUTLASS kernels
  constexpr double kFill = 64.0;   // k at which pipeline fill costs half the efficiency
  const double flops = 2.0 * m * n * k * batch;
  const double tiles = std::ceil(m / kTile) * std::ceil(n / kTile) * batch;
  const double sms = gpu_.sm_count;
  const double waves = std::ceil(tiles / sms);
  const double wave_efficiency = tiles / (waves * sms);
  const double k_efficiency = k / (k + kFill);
  const double efficiency = gpu_.gemm_efficiency * wave_efficiency * k_efficiency;
  const double compute = flops / (peak_ * efficiency);
  const double bytes = batch * ((m * k + k * n) * operand_bytes + m * n * 2.0);
  const double memory = bytes / (gpu_.hbm_bandwidth.value() * gpu_.memory_efficiency);
  return std::max({compute, memory, gpu_.min_kernel_time.value()});
}

double KernelModel::memory_seconds(double bytes) const {
  if (bytes <= 0) return 0.0;
  return std::max(bytes / (gpu_.hbm_bandwidth.value() * gpu_.memory_efficiency), gpu_.min_kernel_time.value());
}

double KernelModel::attention_seconds(double flops, bool backward) const {
  if (flops <= 0) return 0.0;
  const double efficiency = gpu_.attention_efficiency * (backward ? 0.8 : 1.0);
  return std::max(flops / (peak_ * efficiency), gpu_.min_kernel_time.value());
}

namespace {

bool has_target(const LoraConfig& lora, const char* name) {
  return std::find(lora.targets.begin(), lora.targets.end(), name) != lora.targets.end();
}

// Accumulates forward/backward time of the ops of one layer.
struct Pass {
  const KernelModel& gemm_model;  // linear layers (fp8 when training in fp8)
  const KernelModel& model;       // everything else
  double operand_bytes;
  double forward = 0, backward = 0;

  void memory(double bytes) {
    forward += model.memory_seconds(bytes);
    backward += model.memory_seconds(2.0 * bytes);  // read saved input and incoming grad, write grad
  }
  // y[m,n] = x[m,k] W[k,n]; backward computes dX and, unless frozen, dW.
  void linear(double m, double n, double k, bool frozen) {
    forward += gemm_model.gemm_seconds(m, n, k, 1, operand_bytes);
    backward += gemm_model.gemm_seconds(m, k, n, 1, operand_bytes);
    if (!frozen) backward += gemm_model.gemm_seconds(k, n, m, 1, operand_bytes);
  }
  // LoRA adapter x A B on a linear from `in` to `out` features, rank r (A, B trainable).
  void adapter(double tokens, double in, double out, double r) {
    linear(tokens, r, in, false);
    linear(tokens, out, r, false);
  }
};

}  // namespace

LayerCost transformer_layer_cost(const ModelSpec& mdl, const HardwareProfile& hw, const LayerSetting& s) {
  const bool gpt = mdl.architecture == Architecture::kGpt;
  const bool fp32 = s.precision == Precision::kFp32;
  const bool fp8 = s.precision == Precision::kFp8;
  const Dtype act_dtype = fp32 ? Dtype::kFp32 : (s.precision == Precision::kFp16 ? Dtype::kFp16 : Dtype::kBf16);
  const KernelModel model(hw.gpu, act_dtype);
  const KernelModel gemm_model(hw.gpu, compute_dtype(s.precision));

  const double t = s.tp;
  const double e = fp32 ? 4.0 : 2.0;     // bytes per activation element
  const double lin_in = fp8 ? 1.0 : e;   // bytes per stored linear-layer input
  const double s_q = s.seq_len / s.cp;   // local query length
  const double s_k = s.seq_len;          // keys attended to (ring attention visits all chunks)
  const double T = s.micro_batch * s_q;  // local tokens
  const double Tn = s.sequence_parallel ? T / t : T;  // tokens seen by norms/dropout/residual
  const double h = static_cast<double>(mdl.hidden);
  const double d = static_cast<double>(mdl.head_dim());
  const double a_local = mdl.heads / t;
  const double q_local = h / t;
  const double kv_local = mdl.kv_heads >= s.tp ? static_cast<double>(mdl.kv_dim()) / t : d;  // replicated kv heads
  const bool lora = s.mode == TrainingMode::kLora || s.mode == TrainingMode::kQlora;
  const bool frozen = lora;
  const double r = s.lora.rank;
  const double scores = s.micro_batch * a_local * s_q * s_k;  // attention score elements

  // Unfused (PyTorch eager) element-wise ops move more bytes: RMSNorm with its fp32 upcast,
  // pow, mean, rsqrt and two multiplies ~36 B/element instead of 4; rotate-half RoPE ~22
  // instead of 4; SiLU then multiply 10 instead of 6. LayerNorm and GELU are single kernels.
  const bool eager = !s.fused_kernels;
  const double norm_factor = eager && !gpt ? 9.0 : 1.0;
  const double rope_factor = eager ? 5.5 : 1.0;
  const double act_factor = eager && !gpt ? 10.0 / 6.0 : 1.0;

  LayerCost c;
  Pass p{gemm_model, model, lin_in};
  double recompute_memory_ops = 0;  // forward time of cheap ops re-run by selective recompute (flash)

  // --- attention block ---
  const double norm_fwd = model.memory_seconds(norm_factor * 2.0 * Tn * h * e);
  p.memory(norm_factor * 2.0 * Tn * h * e);  // norm 1
  recompute_memory_ops += norm_fwd;
  p.linear(T, q_local + 2.0 * kv_local, h, frozen);  // fused QKV projection
  if (lora) {
    if (has_target(s.lora, "q")) p.adapter(T, h, q_local, r);
    if (has_target(s.lora, "k")) p.adapter(T, h, kv_local, r);
    if (has_target(s.lora, "v")) p.adapter(T, h, kv_local, r);
  }
  if (!gpt) p.memory(rope_factor * 2.0 * T * (q_local + kv_local) * e);  // rotary embedding on q and k

  double core_forward = 0;  // attention core, for selective recompute and CP overlap
  double core_backward = 0;
  if (s.attention == AttentionKernel::kFlash) {
    const double flops = 4.0 * s.micro_batch * a_local * s_q * s_k * d * 0.5;  // causal: half the blocks
    core_forward = model.attention_seconds(flops, false);
    core_backward = model.attention_seconds(2.5 * flops, true);
  } else {
    const double batch = s.micro_batch * a_local;
    core_forward += model.gemm_seconds(s_q, s_k, d, batch);          // Q K^T
    core_forward += model.memory_seconds(scores * 2.0 * e);          // scale, mask, softmax (fused)
    if (s.dropout) core_forward += model.memory_seconds(scores * (2.0 * e + 1.0));
    core_forward += model.gemm_seconds(s_q, d, s_k, batch);          // P V
    core_backward += model.gemm_seconds(s_q, s_k, d, batch) + model.gemm_seconds(s_k, d, s_q, batch);  // dP, dV
    core_backward += model.gemm_seconds(s_q, d, s_k, batch) + model.gemm_seconds(s_k, d, s_q, batch);  // dQ, dK
    core_backward += model.memory_seconds(scores * 3.0 * e);
    if (s.dropout) core_backward += model.memory_seconds(scores * (2.0 * e + 1.0));
  }
  p.forward += core_forward;
  p.backward += core_backward;

  p.linear(T, h, q_local, frozen);  // output projection
  if (lora && has_target(s.lora, "o")) p.adapter(T, q_local, h, r);
  p.memory(Tn * h * (3.0 * e + (s.dropout ? 1.0 : 0.0)));  // (bias,) dropout, residual add

  // --- MLP block ---
  p.memory(norm_factor * 2.0 * Tn * h * e);  // norm 2
  recompute_memory_ops += norm_fwd;
  double tokens_mlp = T;
  double ffn_local = static_cast<double>(mdl.ffn_hidden) / t;
  double experts_local = 1;
  if (mdl.moe) {
    p.linear(T, mdl.moe->experts, h, frozen);  // router
    tokens_mlp = T * mdl.moe->top_k;
    ffn_local = static_cast<double>(mdl.moe->expert_ffn_hidden) / t;
    experts_local = static_cast<double>(mdl.moe->experts) / s.ep;
  }
  const double tokens_per_expert = tokens_mlp / experts_local;
  const double up_width = gpt ? ffn_local : 2.0 * ffn_local;
  for (double i = 0; i < experts_local; i += 1) {
    p.linear(tokens_per_expert, up_width, h, frozen);
    p.linear(tokens_per_expert, h, ffn_local, frozen);
  }
  if (lora) {
    if (!gpt && has_target(s.lora, "gate")) p.adapter(tokens_mlp, h, ffn_local, r);
    if (has_target(s.lora, "up")) p.adapter(tokens_mlp, h, ffn_local, r);
    if (has_target(s.lora, "down")) p.adapter(tokens_mlp, ffn_local, h, r);
  }
  const double act_bytes = act_factor * tokens_mlp * ffn_local * e * (gpt ? 2.0 : 3.0);  // GELU, or SiLU(gate)*up
  p.memory(act_bytes);
  recompute_memory_ops += model.memory_seconds(act_bytes);
  p.memory(Tn * h * (3.0 * e + (s.dropout ? 1.0 : 0.0)));  // (bias,) dropout, residual add
  if (s.mode == TrainingMode::kQlora) {
    // Frozen weights are dequantized to bf16 for the forward and again for the backward.
    const double weights = (2 * h * h + 2 * h * static_cast<double>(mdl.kv_dim())) / t +
                           (gpt ? 2.0 : 3.0) * h * ffn_local * experts_local;
    const double q_bytes = s.lora.base_format == QuantFormat::kNf4 ? 0.5 : 1.0;
    p.forward += model.memory_seconds(weights * (q_bytes + 2.0));
    p.backward += model.memory_seconds(weights * (q_bytes + 2.0));
  }

  c.forward = p.forward;
  c.backward = p.backward;

  // --- communication ---
  if (s.tp > 1) {
    const Bytes block(T * h * e);
    const double one = s.sequence_parallel
                           ? (collective_time(hw, Collective::kAllGather, block, s.tp_group) +
                              collective_time(hw, Collective::kReduceScatter, block, s.tp_group)).value()
                           : collective_time(hw, Collective::kAllReduce, block, s.tp_group).value();
    c.tp_comm_forward = 2.0 * one;   // after attention and after the MLP (or gather before each)
    c.tp_comm_backward = 2.0 * one;  // the conjugate operators
  }
  if (s.cp > 1) {
    const bool across = s.cp_group.per_node < s.cp_group.size;
    const double kv_chunk = 2.0 * T * kv_local * e;
    const double step_fwd = send_recv_time(hw, Bytes(kv_chunk), across).value();
    const double step_bwd = send_recv_time(hw, Bytes(2.0 * kv_chunk), across).value();
    c.cp_comm = (s.cp - 1) * (std::max(0.0, step_fwd - core_forward / s.cp) + std::max(0.0, step_bwd - core_backward / s.cp));
  }
  double ep_forward = 0;
  if (mdl.moe && s.ep > 1) {
    const Bytes routed(tokens_mlp * h * e);
    ep_forward = 2.0 * collective_time(hw, Collective::kAllToAll, routed, s.ep_group).value();  // dispatch + combine
    c.ep_comm = 2.0 * ep_forward;  // forward and backward
  }

  // --- activations kept for backward (bytes) ---
  const double norm_inputs = 2.0 * Tn * h * e;
  const double norm_outputs = 2.0 * Tn * h * lin_in;  // QKV input and MLP input
  const double qkv = T * (q_local + 2.0 * kv_local) * e;
  const double score_bytes = s.attention == AttentionKernel::kStandard ? scores * (e + (s.dropout ? 1.0 + e : 0.0))
                                                                        : 4.0 * s.micro_batch * a_local * s_q;  // softmax stats
  const double proj_input = T * q_local * lin_in;
  const double masks = s.dropout ? 2.0 * Tn * h : 0.0;
  const double mlp_saved = tokens_mlp * ffn_local * (gpt ? e : 2.0 * e);  // fc1 out, or gate and up outputs
  const double mlp_act_out = tokens_mlp * ffn_local * lin_in;             // input of fc2 / down
  const double routed_input = mdl.moe ? tokens_mlp * h * lin_in : 0.0;
  double adapters = 0;
  if (lora) adapters = static_cast<double>(s.lora.targets.size()) * T * r * e;
  c.full_activation_bytes = norm_inputs + norm_outputs + qkv + score_bytes + proj_input + masks + mlp_saved +
                            mlp_act_out + routed_input + adapters;
  switch (s.recompute) {
    case Recompute::kNone:
      c.activation_bytes = c.full_activation_bytes;
      break;
    case Recompute::kSelective:
      if (s.attention == AttentionKernel::kStandard) {
        c.activation_bytes = c.full_activation_bytes - score_bytes;  // Megatron: recompute core attention
        c.recompute = core_forward;
      } else {
        // Flash already keeps no scores: recompute the cheap memory-bound ops instead (norms,
        // activation function) and keep only their inputs.
        c.activation_bytes = c.full_activation_bytes - norm_outputs - mlp_act_out;
        c.recompute = recompute_memory_ops;
      }
      break;
    case Recompute::kFull:
      c.activation_bytes = Tn * h * e;  // the layer input only
      c.recompute = c.forward;
      c.tp_comm_recompute = c.tp_comm_forward;
      c.ep_comm += ep_forward;
      break;
  }

  // --- FLOPs (per GPU) ---
  const double attn_matmul = (2 * h * h + 2 * h * static_cast<double>(mdl.kv_dim())) / t;
  const double mlp_matmul = (gpt ? 2.0 : 3.0) * h * (mdl.moe ? static_cast<double>(mdl.moe->expert_ffn_hidden) * mdl.moe->top_k
                                                             : static_cast<double>(mdl.ffn_hidden)) / t;
  const double attention_flops_fwd = 4.0 * s_k * h / t * T;  // QK^T and PV, non-causal convention
  double adapter_params = 0;
  if (lora) {
    for (const auto& name : s.lora.targets) {
      if (name == "q" || name == "o") adapter_params += r * (h + q_local);
      else if (name == "k" || name == "v") adapter_params += r * (h + kv_local);
      else if (name == "gate" && !gpt) adapter_params += r * (h + ffn_local) * mdl.moe.value_or(MoeSpec{1, 1, 0}).top_k;
      else if (name == "up" || name == "down") adapter_params += r * (h + ffn_local) * mdl.moe.value_or(MoeSpec{1, 1, 0}).top_k;
    }
  }
  const double base_factor = frozen ? 4.0 : 6.0;  // frozen weights need no weight gradient
  c.model_flops = base_factor * (attn_matmul + mlp_matmul) * T + 6.0 * adapter_params * T + 3.0 * attention_flops_fwd;
  c.hardware_flops = c.model_flops;
  if (s.recompute == Recompute::kFull) {
    c.hardware_flops += 2.0 * (attn_matmul + mlp_matmul + adapter_params) * T + attention_flops_fwd;
  } else if (s.recompute == Recompute::kSelective && s.attention == AttentionKernel::kStandard) {
    c.hardware_flops += attention_flops_fwd;
  }
  return c;
}

LayerCost blend(const LayerCost& a, const LayerCost& b, double f) {
  const auto mix = [f](double x, double y) { return (1 - f) * x + f * y; };
  LayerCost c;
  c.forward = mix(a.forward, b.forward);
  c.backward = mix(a.backward, b.backward);
  c.recompute = mix(a.recompute, b.recompute);
  c.tp_comm_forward = mix(a.tp_comm_forward, b.tp_comm_forward);
  c.tp_comm_backward = mix(a.tp_comm_backward, b.tp_comm_backward);
  c.tp_comm_recompute = mix(a.tp_comm_recompute, b.tp_comm_recompute);
  c.cp_comm = mix(a.cp_comm, b.cp_comm);
  c.ep_comm = mix(a.ep_comm, b.ep_comm);
  c.model_flops = mix(a.model_flops, b.model_flops);
  c.hardware_flops = mix(a.hardware_flops, b.hardware_flops);
  c.activation_bytes = mix(a.activation_bytes, b.activation_bytes);
  c.full_activation_bytes = mix(a.full_activation_bytes, b.full_activation_bytes);
  return c;
}

EndsCost ends_cost(const ModelSpec& mdl, const HardwareProfile& hw, const LayerSetting& s) {
  const bool fp32 = s.precision == Precision::kFp32;
  const Dtype act_dtype = fp32 ? Dtype::kFp32 : (s.precision == Precision::kFp16 ? Dtype::kFp16 : Dtype::kBf16);
  const KernelModel model(hw.gpu, act_dtype);
  const double e = fp32 ? 4.0 : 2.0;
  const double t = s.tp;
  const double T = s.micro_batch * s.seq_len / s.cp;
  const double Tn = s.sequence_parallel ? T / t : T;
  const double h = static_cast<double>(mdl.hidden);
  const double v_local = std::ceil(static_cast<double>(mdl.vocab) / t);
  const bool frozen = s.mode == TrainingMode::kLora || s.mode == TrainingMode::kQlora;

  EndsCost c;
  double tp_reduce = 0;  // vocab-parallel embedding sums partial lookups across the TP group
  if (s.tp > 1) {
    const Bytes block(T * h * e);
    tp_reduce = s.sequence_parallel ? collective_time(hw, Collective::kReduceScatter, block, s.tp_group).value()
                                    : collective_time(hw, Collective::kAllReduce, block, s.tp_group).value();
  }
  c.embedding_forward = model.memory_seconds(2.0 * T * h * e) + tp_reduce;
  c.embedding_backward = model.memory_seconds(3.0 * T * h * e) + (frozen ? 0.0 : tp_reduce);
  c.embedding_activation_bytes = Tn * h * e + (s.dropout ? Tn * h : 0.0);

  Pass p{model, model, e};
  p.memory((s.fused_kernels || mdl.architecture == Architecture::kGpt ? 1.0 : 9.0) * 2.0 * Tn * h * e);  // final norm
  p.linear(T, v_local, h, frozen);            // output projection (vocab-parallel)
  p.forward += model.memory_seconds(T * v_local * (e + 4.0 + 4.0));  // upcast, softmax, loss in fp32
  p.backward += model.memory_seconds(T * v_local * (4.0 + e));
  c.head_forward = p.forward;
  c.head_backward = p.backward;
  c.head_model_flops = (frozen ? 4.0 : 6.0) * static_cast<double>(mdl.vocab) / t * h * T;
  c.head_activation_bytes = Tn * h * e + T * h * e + T * v_local * (e + 4.0);
  return c;
}

}  // namespace trainplan::costmodel
