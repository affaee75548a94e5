#include "trainplan/costmodel/compute.hpp"

#include <algorithm>
#include <cmath>

#include "compute_pass.hpp"

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

using namespace compute_detail;

namespace {

// The local width of one attention projection under tensor parallelism.
double local_out(const LinearShape& l, double t) { return l.split == TpSplit::kColumn ? l.out / t : l.out; }
double local_in(const LinearShape& l, double t) { return l.split == TpSplit::kRow ? l.in / t : l.in; }

// Attention matmul weights one rank multiplies with: the split projections' share plus the
// replicated ones (MLA's down projections) whole.
double local_attention_matmul(const ModelSpec& mdl, double t) {
  double split = 0, replicated = 0;
  for (const LinearShape& l : attention_linears(mdl)) (l.split == TpSplit::kReplicated ? replicated : split) += l.in * l.out;
  return split / t + replicated;
}

LayerCost uniform_layer_cost(const ModelSpec& mdl, const HardwareProfile& hw, const LayerSetting& s);

}  // namespace

LayerCost transformer_layer_cost(const ModelSpec& mdl, const HardwareProfile& hw, const LayerSetting& s) {
  if (mdl.moe && mdl.moe->dense_layers > 0) {
    // Leading dense layers (DeepSeek's first_k_dense_replace): the average of a dense and a
    // mixture-of-experts layer, weighted by their counts; memory extremes from the worse.
    ModelSpec dense = mdl;
    dense.moe.reset();
    ModelSpec sparse = mdl;
    sparse.moe->dense_layers = 0;
    return blend(uniform_layer_cost(dense, hw, s), uniform_layer_cost(sparse, hw, s),
                 static_cast<double>(mdl.moe_layers()) / mdl.layers);
  }
  return uniform_layer_cost(mdl, hw, s);
}

namespace {

LayerCost uniform_layer_cost(const ModelSpec& mdl, const HardwareProfile& hw, const LayerSetting& s) {
  // The executor's fused paths are for Llama-style blocks: GPT blocks run the plain path.
  const StackSpec& spec = stack_spec(s.stack == Stack::kTrainplan && mdl.architecture == Architecture::kGpt
                                         ? Stack::kTrainplanReference : s.stack);
  // fp8's casts under the plan's recipe (validate_plan refuses one the stack does not run).
  StackSpec stack = spec;
  if (const Fp8Casting* casts = fp8_casting(spec, s.fp8_recipe)) stack.fp8 = *casts;
  if (s.fp8_gathered_weights) {
    // Weights gathered in fp8 with the step's precomputed scale (LayerSetting::fp8_gathered_weights):
    // forward takes them as they are; backward's GEMM wants the weight's other layout, a copy of
    // the fp8 tensor (torchao float8/float8_ops.py preprocess_addmm: b_data.t().contiguous().t()),
    // reading 1 byte and writing 1.
    stack.fp8.weight_forward = 0;
    stack.fp8.weight_backward = 2;
  }
  if (s.attention_kernel) stack.attention_kernel = *s.attention_kernel;  // the plan's own (training.attention_kernel)
  const ModelFeatures feat = mdl.features();
  const bool fp8 = s.precision == Precision::kFp8;
  const Dtype act_dtype = activation_dtype(s.precision);
  const KernelRates rates(hw.gpu, act_dtype, stack.attention_kernel);
  const KernelRates gemm_rates(hw.gpu, compute_dtype(s.precision));

  const double t = s.tp;
  const double e = dtype_bytes(act_dtype);  // bytes per activation element
  const double lin_in = fp8 ? 1.0 : e;      // bytes per element of a linear layer's GEMM operands
  // Bytes per kept linear-layer input: fp8 where the stack keeps the cast (Transformer Engine),
  // else the activation dtype (torchao's and the executor's linears keep the high-precision input).
  const double kept_lin_in = fp8 && stack.fp8.keeps_fp8_inputs ? 1.0 : e;
  const double s_q = s.seq_len / s.cp;      // local query length
  const double s_k = mdl.attended_keys(s.seq_len);  // keys attended to (ring attention visits all chunks; a sliding window caps them)
  const double T = s.micro_batch * s_q;     // local tokens
  const double Tn = s.sequence_parallel ? T / t : T;  // tokens seen by norms/dropout/residual
  const double h = static_cast<double>(mdl.hidden);
  const double d = static_cast<double>(mdl.head_dim());
  const double a_local = mdl.heads / t;
  const double kv_local = mdl.kv_heads >= s.tp ? static_cast<double>(mdl.kv_dim()) / t : d;  // replicated kv heads
  // Per-head sizes of Q and K, and of V; the local widths of Q, K and V and of the output
  // projection's input. MLA: heads*(nope+rope) for Q and K, heads*v_head_dim for V.
  const MlaSpec* mla = mdl.mla ? &*mdl.mla : nullptr;
  const double d_qk = mla ? static_cast<double>(mla->qk_head_dim()) : d;
  const double d_v = mla ? static_cast<double>(mla->v_head_dim) : d;
  const double q_local = mla ? a_local * d_qk : static_cast<double>(mdl.q_dim()) / t;
  const double k_local = mla ? a_local * d_qk : kv_local;
  const double v_local = mla ? a_local * d_v : kv_local;
  const double o_in_local = mla ? a_local * d_v : q_local;
  const double mlp_matrices = feat.gated_mlp ? 3.0 : 2.0;
  const bool lora = s.mode == TrainingMode::kLora || s.mode == TrainingMode::kQlora;
  const bool frozen = lora;
  const double r = s.lora.rank;
  // LoRA's frozen GEMMs keep no input: a group's input (Q/K/V, gate/up) is kept by its adapters'
  // A matrices alone, and with LoRA dropout not even by them (each keeps its dropped copy).
  const bool kept_by_adapters = !lora || s.lora.dropout <= 0;
  const bool attention_input_kept = !lora || mla || (kept_by_adapters && (s.lora.targets_include("q") || s.lora.targets_include("k") || s.lora.targets_include("v")));
  const bool mlp_input_kept = !lora || mla || (kept_by_adapters && (s.lora.targets_include("gate") || s.lora.targets_include("up")));
  const double scores = s.micro_batch * a_local * s_q * s_k;  // attention score elements
  // Context parallelism with K/V all-gathered (stack.hpp): the rank's two query chunks each attend
  // the keys up to their own end through a masked kernel, (2cp + 1) / 4cp of the s_q x s_k
  // rectangle, no causal skipping; ring attention runs a causal kernel on each block (1/2).
  const ContextAttention cp_mode = s.cp_comm.value_or(stack.context_attention);
  const bool gathered_kv = s.cp > 1 && cp_mode == ContextAttention::kAllGatherKv;
  // An explicit mask tensor: the kernel visits the whole seq x seq rectangle (SDPA with attn_mask
  // cannot take its flash backend and runs the masked one over every key block; flash-attn's
  // causal skipping needs causal=True), so no causal halving.
  const bool causal_kernel = !gathered_kv && s.attention_mask == AttentionMask::kCausal;
  const double attended_keys = gathered_kv ? s_k * (2.0 * s.cp + 1.0) / (4.0 * s.cp) : s_k;

  // torch.autocast on the fp32 module (LayerSetting::autocast): the residual stream, the norms and
  // the residual adds in float32 (a 16-bit branch added to a float32 stream gives float32: type
  // promotion; nn.RMSNorm of a float32 input is float32), each linear layer's weight and input
  // cast on the way in (Pass::autocast_*).
  const double es = s.autocast ? 4.0 : e;  // bytes per element of the residual stream
  // Eager autocast keeps each linear's own cast of its input (Q, K and V three copies of the
  // norm's output, gate and up two); Inductor's common-subexpression pass makes one of each.
  const bool eager_casts = s.autocast && !stack.fused_elementwise;
  const double attention_input_copies = eager_casts && !mla && !stack.fused_qkv ? 3.0 : 1.0;
  const double mlp_input_copies = eager_casts && !mdl.moe && feat.gated_mlp && !stack.fused_gate_up ? 2.0 : 1.0;

  LayerCost c;
  Pass p{gemm_rates, rates, stack, lin_in, e, fp8};
  p.autocast = s.autocast;
  double recompute_pointwise = 0;  // forward time of the cheap ops selective recompute re-runs (flash, fusing stacks)
  const auto timed = [&](auto&& run) {  // forward time of what `run` adds to the pass
    const double before = p.forward;
    run();
    return p.forward - before;
  };
  const ElementwiseOp norm_op = compute_detail::norm_op(feat, stack);
  // Norm outputs recomputed in backward (stack.hpp): only without TP, where the executor's fused
  // norm path runs; under TP it keeps them (the norm's output enters the TP region).
  const bool norm_recomputed = stack.norm_recomputed && s.tp == 1;
  const bool gemm_sums = stack.gemm_sums_input_gradients && s.tp == 1;  // the same path's input-gradient sums
  // The same path's residual adds in the norms (stack.hpp): where the executor's fused norms run
  // (RMSNorm blocks, no LoRA dropout); the MLP norm's side not on MoE layers.
  const bool adds_in_norms = stack.residual_adds_in_norms && norm_recomputed && !feat.layer_norm && kept_by_adapters;
  const bool adds_in_mlp_norm = adds_in_norms && !mdl.moe;
  double norm_forward = 0;  // forward time of the block's norms, run again in backward when recomputed

  // --- attention block ---
  // Fused norms read the stream and write the 16-bit output (under autocast Inductor fuses the
  // cast in); backward reads the output's gradient and the input, writes the input's gradient.
  const NormWidths nw = norm_widths(feat, stack, e, es);
  norm_forward += timed([&] { p.elementwise(norm_op, Tn * h, es + e, e + 2 * es, true, nw.forward, nw.backward); });  // norm 1
  double mla_latents = 0;  // MLA: widths of the low-rank latents (inputs of q_b and kv_b), per token
  if (mla) {
    // Down projections (replicated under TP), their RMSNorms, then the up projections.
    const double q_rank = static_cast<double>(mla->q_lora_rank);
    const double kv_rank = static_cast<double>(mla->kv_lora_rank);
    // fp8: the down projections (and Q's projection without a latent) take the block norm's
    // output through plain linear modules (Megatron-Core's MLA spec: a standalone norm), the up
    // projections their latent's norm fused in (TE's LayerNormColumnParallelLinear).
    const Fp8Cast normed = Fp8Cast::kFromNorm;
    if (q_rank > 0) {
      p.linear(T, q_rank, h, frozen);
      p.elementwise(ElementwiseOp::kRmsNorm, T * q_rank, 2 * e, 3 * e);
      p.linear(T, q_local, q_rank, frozen, true, normed);
    } else {
      p.linear(T, q_local, h, frozen);
    }
    p.linear(T, kv_rank + static_cast<double>(mla->qk_rope_head_dim), h, frozen);
    p.elementwise(ElementwiseOp::kRmsNorm, T * kv_rank, 2 * e, 3 * e);
    p.linear(T, a_local * static_cast<double>(mla->qk_nope_head_dim + mla->v_head_dim), kv_rank, frozen, true, normed);
    p.gradient_sum(T * h);  // the Q and KV paths' input gradients summed
    mla_latents = q_rank + kv_rank + static_cast<double>(mla->qk_rope_head_dim);
  } else if (stack.fused_qkv) {
    p.linear(T, q_local + 2.0 * kv_local, h, frozen, true, Fp8Cast::kFromNorm);  // the norm's output
  } else {
    p.linear(T, q_local, h, frozen, true, Fp8Cast::kFromNorm);
    p.linear(T, kv_local, h, frozen, true, Fp8Cast::kShared);
    p.linear(T, kv_local, h, frozen, true, Fp8Cast::kShared);
    if (gemm_sums) p.backward += rates.stream(2.0 * e * T * h);  // K's and V's GEMMs read the running sum
    else p.gradient_sum(2.0 * T * h, es);  // three input gradients summed (under autocast in float32)
  }
  if (!mla) p.autocast_inputs(attention_input_copies, T * h);
  if (feat.qkv_bias) p.backward += rates.stream(e * T * (q_local + (k_local + v_local)));  // bias gradients (a reduction over tokens)
  if (lora && mla) {
    for (const LinearShape& l : attention_linears(mdl)) {
      if (std::string(l.name) != "o" && s.lora.targets_include(lora_target_of(l.name))) p.adapter(T, local_in(l, t), local_out(l, t), r);
    }
  } else if (lora) {
    if (s.lora.targets_include("q")) p.adapter(T, h, q_local, r);
    if (s.lora.targets_include("k")) p.adapter(T, h, kv_local, r);
    if (s.lora.targets_include("v")) p.adapter(T, h, kv_local, r);
  }
  double rotary_forward = 0;  // for op-level selective recompute
  if (mla) {
    // Rotary on the rope part of Q's heads and on the key's shared rope part.
    rotary_forward = timed([&] {
      p.elementwise(ElementwiseOp::kRotaryEager, T * a_local * static_cast<double>(mla->qk_rope_head_dim), 2 * e, 2 * e);
      p.elementwise(ElementwiseOp::kRotaryEager, T * static_cast<double>(mla->qk_rope_head_dim), 2 * e, 2 * e);
    });
  } else if (!feat.learned_positions && !feat.alibi) {
    // Rotary embedding on q and k; eager: rotate-half (5 kernels each) plus the cos/sin casts.
    rotary_forward = timed([&] {
      p.elementwise(ElementwiseOp::kRotaryEager, T * q_local, 2 * e, 2 * e);
      p.elementwise(ElementwiseOp::kRotaryEager, T * kv_local, 2 * e, 2 * e);
      if (!stack.fused_elementwise) {
        p.forward += 4 * rates.latency();
        p.kernels += 4;
      }
    });
  }

  double core_forward = 0;  // attention core, for selective recompute and CP overlap
  double core_backward = 0;
  if (s.attention == AttentionKernel::kFlash) {
    const double batch_heads = s.micro_batch * a_local;
    const double d_mean = (d_qk + d_v) / 2.0;  // MLA's Q.K and P.V head sizes differ; the FLOPs are those of their mean
    core_forward = rates.attention_forward(batch_heads, s_q, attended_keys, d_mean, causal_kernel);
    core_backward = rates.attention_backward(batch_heads, s_q, attended_keys, d_mean, causal_kernel);
    p.kernels += gathered_kv ? 6 : 3;  // one kernel per query chunk
  } else {
    const double batch = s.micro_batch * a_local;
    core_forward += rates.gemm(s_q, s_k, d_qk, batch);              // Q K^T
    core_forward += rates.stream(scores * 2.0 * e);                 // scale, mask, softmax (fused)
    if (s.dropout) core_forward += rates.stream(scores * (2.0 * e + 1.0));
    core_forward += rates.gemm(s_q, d_v, s_k, batch);               // P V
    core_backward += rates.gemm(s_q, s_k, d_v, batch) + rates.gemm(s_k, d_v, s_q, batch);  // dP, dV
    core_backward += rates.gemm(s_q, d_qk, s_k, batch) + rates.gemm(s_k, d_qk, s_q, batch);  // dQ, dK
    core_backward += rates.stream(scores * 3.0 * e);
    if (s.dropout) core_backward += rates.stream(scores * (2.0 * e + 1.0));
    p.kernels += s.dropout ? 10 : 8;
  }
  p.forward += core_forward;
  p.backward += core_backward;

  p.linear(T, h, o_in_local, frozen);  // output projection
  if (lora && s.lora.targets_include("o")) p.adapter(T, o_in_local, h, r);
  if (s.dropout) p.elementwise(ElementwiseOp::kDropout, Tn * h, 0, 2 * e + 1);
  // The residual add reads the stream and the branch and writes the stream.
  const double add_bytes = 2 * es + e;
  if (adds_in_mlp_norm) p.forward += rates.stream((2 * e + (s.dropout ? 1.0 : 0.0)) * Tn * h);  // norm 2 reads the branch, writes the sum
  else p.elementwise(ElementwiseOp::kResidualAdd, Tn * h, add_bytes + (s.dropout ? 1.0 : 0.0), 0, false, add_bytes / 3.0);  // (bias,) dropout, residual add
  p.autocast_branch(Tn * h);
  if (adds_in_norms) p.backward += rates.stream(e * Tn * h);  // norm 1's backward reads the stream's gradient
  else p.gradient_sum(Tn * h, es);  // the residual stream feeds norm 1 and the add

  // --- MLP block ---
  norm_forward += timed([&] { p.elementwise(norm_op, Tn * h, es + e, e + 2 * es, true, nw.forward, nw.backward); });  // norm 2
  recompute_pointwise += norm_forward;
  if (norm_recomputed) p.backward += norm_forward;  // each norm's forward again before its backward
  double tokens_mlp = T;
  double ffn_local = static_cast<double>(mdl.ffn_hidden) / t;
  double experts_local = 1;
  if (mdl.moe) {
    p.linear_unquantised(T, mdl.moe->experts, h, frozen);  // router
    // With a capacity factor below 1 no expert takes more than capacity_factor of its balanced
    // share (the rest is dropped), so the experts multiply at most that many tokens.
    const double cf = mdl.moe->capacity_factor;
    tokens_mlp = T * mdl.moe->top_k * (cf > 0 ? std::min(1.0, cf) : 1.0);
    ffn_local = static_cast<double>(mdl.moe->expert_ffn_hidden) / t;
    experts_local = static_cast<double>(mdl.moe->experts) / s.ep;
  }
  // Shared experts (DeepSeek, Qwen2-MoE): one dense MLP every token passes through.
  const double shared_local = mdl.moe ? static_cast<double>(mdl.moe->shared_ffn_hidden) / t : 0.0;
  const double tokens_per_expert = tokens_mlp / experts_local;
  // fp8: the first GEMM's input is the norm's output (fused in the dense MLP's first module in
  // Megatron-Core; an expert's input is its dispatched tokens, a shared expert's a plain linear's)
  // and its output's gradient the activation's backward; the second's input the activation's
  // output.
  double last_linear_forward = 0;  // the MLP's last GEMM (w2, fc2), which full recompute may not replay
  const auto mlp_linears = [&](double tokens, double width, Fp8Cast input) {
    const Fp8Cast act = Fp8Cast::kFromActivation;
    if (!feat.gated_mlp || stack.fused_gate_up) {
      p.linear(tokens, feat.gated_mlp ? 2.0 * width : width, h, frozen, true, input, act);
    } else {
      p.linear(tokens, width, h, frozen, true, input, act);  // gate
      p.linear(tokens, width, h, frozen, true, input == Fp8Cast::kFromNorm ? Fp8Cast::kShared : input, act);  // up
      if (gemm_sums) p.backward += rates.stream(e * tokens * h);  // up's GEMM reads the running sum
      else p.gradient_sum(tokens * h, input == Fp8Cast::kFromNorm ? es : e);
    }
    if (input == Fp8Cast::kFromNorm) p.autocast_inputs(mlp_input_copies, tokens * h);  // the dense MLP's norm output
    p.linear(tokens, h, width, frozen, true, act);
    last_linear_forward = p.last_gemm_forward;  // its fp8 casts (Inductor) are still counted as replayed
  };
  for (double i = 0; i < experts_local; i += 1) mlp_linears(tokens_per_expert, ffn_local, mdl.moe ? Fp8Cast::kOwn : Fp8Cast::kFromNorm);
  if (shared_local > 0) {
    mlp_linears(T, shared_local, Fp8Cast::kOwn);
    p.gradient_sum(T * h);  // the routed and the shared experts' input gradients summed
  }
  if (feat.mlp_bias) p.backward += rates.stream(e * T * (ffn_local + h));  // bias gradients
  if (lora) {
    if (feat.gated_mlp && s.lora.targets_include("gate")) p.adapter(tokens_mlp, h, ffn_local, r);
    if (s.lora.targets_include("up")) p.adapter(tokens_mlp, h, ffn_local, r);
    if (s.lora.targets_include("down")) p.adapter(tokens_mlp, ffn_local, h, r);
  }
  const double mlp_width_elements = tokens_mlp * ffn_local + T * shared_local;  // activation-function elements
  recompute_pointwise += timed([&] {
    if (!feat.gated_mlp) p.elementwise(ElementwiseOp::kGelu, mlp_width_elements, 2 * e, 3 * e);
    // Fused backward: reads the output's gradient, gate and up, writes their gradients and, where
    // the product is not kept (swiglu_saved < 3), the recomputed product for the down projection.
    else p.elementwise(ElementwiseOp::kSwiglu, mlp_width_elements, 3 * e, (stack.swiglu_saved < 3 ? 6 : 5) * e);
  });
  if (s.dropout) p.elementwise(ElementwiseOp::kDropout, Tn * h, 0, 2 * e + 1);
  const double output_add_forward =
      timed([&] { p.elementwise(ElementwiseOp::kResidualAdd, Tn * h, add_bytes + (s.dropout ? 1.0 : 0.0), 0, false, add_bytes / 3.0); });
  p.autocast_branch(Tn * h);
  if (adds_in_mlp_norm) p.backward += rates.stream(e * Tn * h);  // norm 2's backward reads the stream's gradient
  else p.gradient_sum(Tn * h, es);  // the stream after attention feeds norm 2 and the block's output add
  if (s.mode == TrainingMode::kQlora) {
    // Frozen weights are dequantized to bf16 for the forward and again for the backward.
    const double weights = local_attention_matmul(mdl, t) + mlp_matrices * h * (ffn_local * experts_local + shared_local);
    const double q_bytes = s.lora.base_format == QuantFormat::kNf4 ? 0.5 : 1.0;
    p.forward += rates.stream(weights * (q_bytes + 2.0));
    p.backward += rates.stream(weights * (q_bytes + 2.0));
  }

  c.forward = p.forward;
  c.backward = p.backward;
  c.autocast_casts = p.autocast_seconds;

  // --- communication ---
  // DTensor's sequence-parallel copies (StackSpec::sequence_parallel_rearranges), per collective:
  // a reduce-scatter's input (always) and an all-gather's output (a micro-batch of more than one
  // sequence), each read and written. torchao's float8 tensor parallelism (torchtitan's
  // enable_float8_tensorwise_tp, 820504e parallelize_llama.py: Float8ColwiseParallel,
  // PrepareFloat8ModuleInput, Float8RowwiseParallel) all-gathers the column-parallel inputs in
  // fp8, and in backward the row-parallel outputs' gradients: every all-gather of the layer moves 1
  // byte an element, every reduce-scatter the activation dtype.
  const bool dtensor_sp = s.tp > 1 && s.sequence_parallel && stack.sequence_parallel_rearranges;
  const double gather_bytes = dtensor_sp && fp8 && stack.fp8.tp_gathers_fp8 ? 1.0 : e;
  const double rs_copy = dtensor_sp ? rates.stream(2.0 * T * h * e) : 0.0;
  const double ag_copy = dtensor_sp && s.micro_batch > 1 ? rates.stream(2.0 * T * h * gather_bytes) : 0.0;
  // Under Inductor the backward's reduce-scatter input copy is fused into the sum of the input
  // gradients that produces it (its cat lowering: fused_add_cat kernels), which is priced already.
  const bool inductor = stack.fused_elementwise;
  double tp_gather = 0, tp_reduce_scatter = 0;
  double tp_mlp_output = 0;  // the collective after the MLP's last linear (an all-reduce, or a reduce-scatter and its copy)
  if (s.tp > 1) {
    const Bytes block(T * h * e);
    if (s.sequence_parallel) {
      tp_gather = collective_time(hw, Collective::kAllGather, Bytes(T * h * gather_bytes), s.tp_group).value();
      tp_reduce_scatter = collective_time(hw, Collective::kReduceScatter, block, s.tp_group).value();
    }
    const double one = s.sequence_parallel ? tp_gather + tp_reduce_scatter
                                           : collective_time(hw, Collective::kAllReduce, block, s.tp_group).value();
    tp_mlp_output = s.sequence_parallel ? tp_reduce_scatter + rs_copy : one;
    c.tp_comm_forward = 2.0 * one;   // after attention and after the MLP (or gather before each)
    c.tp_comm_backward = 2.0 * one;  // the conjugate operators
    if (dtensor_sp) {
      // Forward: 2 reduce-scatters, 2 all-gathers. Backward: their conjugates (an all-gather's is a
      // reduce-scatter on the same dimension, and the reverse).
      const double forward = 2.0 * (rs_copy + ag_copy);
      const double backward = 2.0 * ag_copy + (inductor ? 0.0 : 2.0 * rs_copy);
      c.tp_comm_forward += forward;
      c.tp_comm_backward += backward;
      c.tp_copies = forward + backward;
      p.kernels += (rs_copy > 0 ? 2 + (inductor ? 0 : 2) : 0) + (ag_copy > 0 ? 4 : 0);
    }
    // The executor gathers the column-parallel GEMMs' input again in backward (stack.hpp), and
    // its GEMMs wait for it; Megatron-Core overlaps that gather with the input-gradient GEMM.
    // Not for a group whose input nothing keeps (LoRA: no undropped adapter on it).
    if (s.sequence_parallel && !stack.sequence_parallel_keeps_gathered_input && is_trainplan(s.stack)) {
      const double regathers = (attention_input_kept ? 1.0 : 0.0) + (mlp_input_kept ? 1.0 : 0.0);
      c.tp_comm_backward += regathers * collective_time(hw, Collective::kAllGather, block, s.tp_group).value();
    }
  }
  double cp_gather = 0;  // all-gathered K/V: the forward's exposed all-gather (run again by full recompute)
  double cp_forward_transient = 0, cp_backward_transient = 0;
  if (s.cp > 1) {
    // K and V of this rank's tokens; each pass of them round the cp ranks sends (cp - 1) of them.
    const double kv_chunk = T * (k_local + v_local) * e;
    if (cp_mode == ContextAttention::kAllGatherRotate) {
      // PyTorch's "allgather" rotation (stack.hpp): one all-gather of K/V in forward and one in
      // backward, each hidden behind the first block only; the K/V gradients in float32 passed
      // round cp times in backward, each step behind the next block, the last one exposed.
      const bool across = s.cp_group.per_node < s.cp_group.size;
      const double gather = collective_time(hw, Collective::kAllGather, Bytes(s.cp * kv_chunk), s.cp_group).value();
      const double grad_chunk = T * (k_local + v_local) * 4.0;
      const double step_grad = send_recv_time(hw, Bytes(grad_chunk), across).value();
      const double forward_exposed = std::max(0.0, gather - core_forward / s.cp);
      c.cp_comm = forward_exposed + std::max(0.0, gather - core_backward / s.cp) + (s.cp - 1) * std::max(0.0, step_grad - core_backward / s.cp) +
                  step_grad;
      cp_gather = forward_exposed;
      c.cp_bytes = 2.0 * (s.cp - 1) * kv_chunk + s.cp * grad_chunk;  // two all-gathers; the gradients round the ranks
      // Alive during the layer's attention only: the gathered K/V, and in backward the float32
      // gradients of Q, K and V being summed (zeros_like(..., dtype=float32)) and the K/V gradient
      // chunk sent and the one received.
      cp_forward_transient = s.cp * kv_chunk;
      cp_backward_transient = s.cp * kv_chunk + T * (q_local + k_local + v_local) * 4.0 + 2.0 * grad_chunk;
    } else if (gathered_kv) {
      const Bytes whole(s.cp * kv_chunk);  // the gathered K/V, and the input of their gradients' reduce-scatter
      cp_gather = collective_time(hw, Collective::kAllGather, whole, s.cp_group).value();
      c.cp_comm = cp_gather + collective_time(hw, Collective::kReduceScatter, whole, s.cp_group).value();
      c.cp_bytes = 2.0 * (s.cp - 1) * kv_chunk;  // forward all-gather, backward reduce-scatter
    } else {
      const bool across = s.cp_group.per_node < s.cp_group.size;
      const double step_fwd = send_recv_time(hw, Bytes(kv_chunk), across).value();
      const double step_bwd = send_recv_time(hw, Bytes(2.0 * kv_chunk), across).value();
      c.cp_comm = (s.cp - 1) * (std::max(0.0, step_fwd - core_forward / s.cp) + std::max(0.0, step_bwd - core_backward / s.cp));
      c.cp_bytes = 3.0 * (s.cp - 1) * kv_chunk;  // K/V round the ring forward; K/V and their gradients backward
    }
  }
  // Mixture of experts under CP: the load-balancing loss's counts per expert (float32) summed over
  // the CP group, an all-reduce per layer and forward (executor/src/parallel/moe.cpp).
  const double moe_counts_bytes = mdl.moe && s.cp > 1 ? 2.0 * (s.cp - 1) / s.cp * 4.0 * mdl.moe->experts : 0.0;
  c.cp_bytes += moe_counts_bytes;
  double ep_forward = 0, ep_forward_bytes = 0;
  if (mdl.moe && s.ep > 1) {
    const Bytes routed(tokens_mlp * h * e);
    ep_forward = 2.0 * collective_time(hw, Collective::kAllToAll, routed, s.ep_group).value();  // dispatch + combine
    c.ep_comm = 2.0 * ep_forward;  // forward and backward
    // Token copies out and back, and first each rank's count of them per expert of every other
    // rank (int64; executor/src/parallel/moe.cpp, Megatron-Core's all-to-all dispatcher likewise).
    const double counts = 8.0 * mdl.moe->experts * (s.ep - 1) / s.ep;
    const double tokens = 2.0 * routed.value() * (s.ep - 1) / s.ep;
    ep_forward_bytes = counts + tokens;
    c.ep_bytes = counts + 2.0 * tokens;  // the backward sends the gradients the same ways
  }

  // --- activations kept for backward (bytes) ---
  // Each norm's input; LlamaRMSNorm keeps instead its float32 copy and the normalised tensor (4 + e).
  // Under autocast the input is the float32 stream.
  const double norm_inputs = 2.0 * Tn * h * norm_saved_bytes(feat, stack, es);
  // The norms' float32 statistics, a token each, kept where a norm's output is not recomputed:
  // 1/RMS, and LayerNorm's mean too (executor/src/model/fused_ops.hpp rms_norm, ATen's layer_norm);
  // before a router the MLP norm is a plain one even where the others are recomputed.
  const double norm_stats = (norm_recomputed ? (mdl.moe ? 1.0 : 0.0) : 2.0) * Tn * 4.0 * (feat.layer_norm ? 2.0 : 1.0);
  // The QKV and MLP inputs: the norms' outputs, under sequence parallelism all-gathered first,
  // which the stack keeps gathered or as the shard (stack.hpp).
  const double gemm_input_tokens = s.sequence_parallel && stack.sequence_parallel_keeps_gathered_input ? T : Tn;
  const double norm_outputs =
      norm_recomputed ? 0.0
                      : ((attention_input_kept ? attention_input_copies : 0.0) + (mlp_input_kept ? mlp_input_copies : 0.0)) * gemm_input_tokens * h *
                            (lora ? e : kept_lin_in);
  // Q, K and V (all-gathered K/V: every rank's, s.cp times the local ones). MLA: latents and their norms' inputs.
  const double qkv = T * (q_local + (gathered_kv ? s.cp : 1.0) * (k_local + v_local)) * e + 2.0 * T * mla_latents * e;
  const double score_bytes = s.attention == AttentionKernel::kStandard ? scores * (e + (s.dropout ? 1.0 + e : 0.0))
                                                                        : 4.0 * s.micro_batch * a_local * s_q;  // softmax stats
  // The output projection's input. All-gathered K/V without recompute: the two query chunks'
  // attention outputs are kept by their kernels and joined into a new tensor for the projection,
  // so one more copy of the attention output stays (executor/src/model/model.cpp attention).
  // (Under LoRA only the o adapter's A keeps that copy, and with LoRA dropout its dropped one.)
  // `joined_kept`: the output projection's input is kept for its own sake (its weight's gradient).
  const bool joined_kept = !lora || mla || (kept_by_adapters && s.lora.targets_include("o"));
  const double proj_input = T * o_in_local * kept_lin_in + (gathered_kv && s.recompute == Recompute::kNone && joined_kept ? T * o_in_local * e : 0.0);
  const double masks = s.dropout ? 2.0 * Tn * h : 0.0;
  // GELU: fc1 output and the GELU output (fc2's input). SwiGLU: the stack's count (stack.hpp),
  // one of which is the down projection's input.
  // A LoRA adapter on the down projection keeps its input, the product (its A's weight gradient
  // needs it), which a fused SwiGLU would otherwise recompute (executor/src/model/fused_ops.hpp swiglu).
  const bool down_adapter = lora && s.lora.targets_include("down");
  // Full recompute's replay stops before the dense MLP's last linear (stack.hpp FullRecomputeReplay):
  // under Inductor always; under torch's early stop where nothing after that GEMM's saves saves a
  // tensor (no dropout mask, no LoRA adapter on it) and the GEMM is ATen's (torchao's fp8 matmul
  // and bitsandbytes' 4-bit one under QLoRA are autograd functions, which save after their forward).
  const FullRecomputeReplay replay = stack.full_recompute_replay;
  const bool replay_stops_before_last_linear =
      !mdl.moe && (replay == FullRecomputeReplay::kWhatBackwardNeeds ||
                   (replay == FullRecomputeReplay::kUntilLastSaved && !s.dropout && !down_adapter && !fp8 &&
                    s.mode != TrainingMode::kQlora));
  const double mlp_width_saved = feat.gated_mlp ? (down_adapter ? std::max(3.0, stack.swiglu_saved) : stack.swiglu_saved) : 2.0;
  const double mlp_saved = mlp_width_elements * (mlp_width_saved - 1.0) * e;
  const double mlp_act_out = mlp_width_elements * kept_lin_in;  // input of fc2 / down
  const double routed_input = mdl.moe ? tokens_mlp * h * kept_lin_in : 0.0;
  // Mixture of experts, kept besides the experts' inputs: the MLP norm's output, which the router
  // and the token permutation take (no norm fused into a linear before a router), the router's
  // float32 probabilities, the experts' outputs, kept to weight them by the routing
  // probabilities (Megatron-Core's unpermute with probs; executor/src/parallel/moe.cpp), and per routed
  // copy the routing's small tensors: its top-k index (int64) and probability (float32), its
  // token's index (int64) and its float32 weight, and under expert parallelism the two int64
  // indices that order the received copies by expert and back.
  const double moe_kept = mdl.moe ? (norm_recomputed ? Tn * h * e : 0.0) + 4.0 * T * mdl.moe->experts +
                                        tokens_mlp * (h * e + 24.0 + (s.ep > 1 ? 16.0 : 0.0))
                                  : 0.0;
  double adapters = 0;
  if (lora) adapters = static_cast<double>(s.lora.targets.size()) * T * r * e;
  if (lora && s.lora.dropout > 0 && !mla) {
    // PEFT's lora_dropout: each adapter's A keeps its own dropped copy of the input, and the mask
    // (a byte an element, executor/src/model/dropout.hpp); column-parallel targets take the whole
    // input, row-parallel ones this rank's features. The down projection's dropped product
    // stands in for the product counted above, which nothing else keeps.
    for (const std::string& target : s.lora.targets) {
      const double width = target == "down" ? ffn_local : target == "o" ? o_in_local : h;
      const double tokens = target == "gate" || target == "up" || target == "down" ? tokens_mlp : T;
      adapters += tokens * width * (target == "down" ? 1.0 : 1.0 + e);
    }
  }
  // Eager autocast: each GEMM keeps its weight's bf16 copy for the input gradient (torchao's fp8
  // linears keep the fp32 weight itself).
  const double weight_copies =
      eager_casts && !fp8 ? 2.0 * (local_attention_matmul(mdl, t) + mlp_matrices * h * (ffn_local * experts_local + shared_local)) : 0.0;
  c.full_activation_bytes = norm_inputs + norm_stats + norm_outputs + qkv + score_bytes + proj_input + masks + mlp_saved +
                            mlp_act_out + routed_input + moe_kept + adapters + weight_copies;
  // Temporaries of one forward: eager rotate-half holds q, the rotated copy, x*cos, rotated*sin
  // and the negated half (4.5 x q); fused rotary the unrotated q; GPT the projection output.
  c.forward_transient_bytes = (feat.learned_positions || feat.alibi) && !mla ? T * h * e : (stack.fused_elementwise ? 1.0 : 4.5) * T * q_local * e;
  // The activations' gradients, and the weights' gradients in the compute dtype unless the GEMMs
  // add them into the fp32 gradient (then there are none).
  c.gradients_in_gemm = gradients_in_gemm(stack, s);
  c.backward_transient_bytes = mlp_matrices * std::max(tokens_mlp * ffn_local, T * shared_local) * e +
                               (c.gradients_in_gemm ? 0.0 : (local_attention_matmul(mdl, t) + mlp_matrices * h * std::max(ffn_local, shared_local)) * e);
  // PyTorch's context parallelism holds its buffers while attention runs, after the rotary's
  // temporaries and before the MLP's.
  c.forward_transient_bytes = std::max(c.forward_transient_bytes, cp_forward_transient);
  c.backward_transient_bytes = std::max(c.backward_transient_bytes, cp_backward_transient);
  c.smallest_saved_tensor_bytes = std::min(T * k_local * e, Tn * h * e);
  // torchtitan's op-level selective checkpointing policy, for Llama-shaped blocks (wk, wo, w3).
  const bool torchtitan_policy = feat.gated_mlp && !mla && stack.op_level_selective;
  switch (s.recompute) {
    case Recompute::kNone:
      c.activation_bytes = c.full_activation_bytes;
      break;
    case Recompute::kSelective:
      if (s.attention == AttentionKernel::kStandard) {
        c.activation_bytes = c.full_activation_bytes - score_bytes;  // Megatron: recompute core attention
        c.recompute = core_forward;
      } else if (is_trainplan(s.stack)) {
        // The executor recomputes the attention core (issue 3), keeping q, k, v; under flash
        // attention its output is still kept as the output projection's input, so only the
        // softmax statistics are saved and the core runs twice. Under LoRA the frozen output
        // projection keeps no input: the output stays only for an undropped o adapter.
        c.activation_bytes = c.full_activation_bytes - score_bytes - (joined_kept ? 0.0 : T * o_in_local * kept_lin_in);
        c.recompute = core_forward;
      } else if (torchtitan_policy) {
        // PyTorch's op-level selective checkpointing (torchtitan's policy, torch.utils.checkpoint
        // with create_selective_checkpoint_contexts): the outputs of SDPA and of every other
        // matmul of the block are saved (wq, wv, w1, w2 of wq, wk, wv, wo, w1, w3, w2), the rest
        // recomputed in backward from the block's input: the wk, wo and w3 GEMMs and every
        // element-wise op.
        c.activation_bytes = Tn * h * es + T * q_local * e + T * kv_local * e + proj_input + score_bytes + masks +
                             mlp_width_elements * e + Tn * h * e + routed_input + adapters;
        const auto ok = [&](double a, double b) { return gemm_aligned(a, lin_in) && gemm_aligned(b, lin_in); };
        double gemms = gemm_rates.gemm(T, kv_local, h, 1, lin_in, ok(kv_local, h)) + gemm_rates.gemm(T, h, q_local, 1, lin_in, ok(h, q_local)) +
                       experts_local * gemm_rates.gemm(tokens_per_expert, ffn_local, h, 1, lin_in, ok(ffn_local, h));
        if (shared_local > 0) gemms += gemm_rates.gemm(T, shared_local, h, 1, lin_in, ok(shared_local, h));
        if (fp8) {  // the recomputed GEMMs' input and weight casts (at least: eager reruns every cast of the block)
          const Fp8Casting& f = stack.fp8;
          gemms += rates.stream(f.input_from_norm * T * h) + rates.stream(f.input * T * q_local) +
                   experts_local * rates.stream(p.input_bytes(mdl.moe ? Fp8Cast::kOwn : Fp8Cast::kFromNorm) * tokens_per_expert * h) +
                   (shared_local > 0 ? rates.stream(f.input * T * h) : 0.0) +
                   rates.stream(f.weight_forward * h * (kv_local + q_local + experts_local * ffn_local + shared_local));
        }
        // Autocast's casts are recomputed too (not in the policy's save list): every weight's, and
        // eager's of the linear layers' inputs.
        c.recompute = recompute_pointwise + gemms + rotary_forward + p.autocast_weight_forward + p.autocast_input_forward;
        c.autocast_casts += p.autocast_weight_forward + p.autocast_input_forward;
        c.autocast_cache_bytes = weight_copies;
        c.forward_transient_bytes = std::max(c.forward_transient_bytes, T * kv_local * e + Tn * h * e);
        if (s.tp > 1) {
          // The policy saves reduce-scatters but no all-gather or all-reduce (torchtitan 820504e
          // models/llama3/parallelize_llama.py _save_list), and under torch.compile a collective
          // the user's checkpoint region marks for recompute is recomputed too (torch 2.11.0
          // torch/_functorch/partitioners.py force_save_collectives). So the recomputed wk and w3
          // take their gathered input from their all-gathers again, under sequence parallelism
          // (with DTensor's copies, as in forward); without it the block's second norm takes the
          // residual stream from the attention output's all-reduce again.
          if (s.sequence_parallel) {
            c.tp_comm_recompute = 2.0 * (tp_gather + ag_copy);
            c.tp_copies += 2.0 * ag_copy;
            if (dtensor_sp && !inductor) {
              // Eager replays the forward: wo runs again, and the copy before its reduce-scatter,
              // whose saved result is then returned (torch.utils.checkpoint's policy replay).
              c.tp_comm_recompute += rs_copy;
              c.tp_copies += rs_copy;
            } else if (dtensor_sp) {
              // Inductor's partitioner drops wo and that copy: their only use is the saved
              // reduce-scatter.
              c.recompute -= gemm_rates.gemm(T, h, q_local, 1, lin_in, ok(h, q_local));
            }
          } else {
            c.tp_comm_recompute = collective_time(hw, Collective::kAllReduce, Bytes(T * h * e), s.tp_group).value();
          }
        }
      } else {
        // Flash already keeps no scores: recompute the cheap memory-bound ops instead (norms,
        // activation function) and keep only their inputs.
        // LlamaRMSNorm's float32 copy goes with its outputs: only each norm's input stays.
        c.activation_bytes = c.full_activation_bytes - norm_outputs - norm_stats - mlp_act_out - 2.0 * Tn * h * (norm_saved_bytes(feat, stack, e) - e);
        c.recompute = recompute_pointwise + p.pointwise_input_casts;  // fp8: their outputs cast again
      }
      break;
    case Recompute::kFull:
      c.activation_bytes = Tn * h * es;  // the layer input only
      c.recompute = c.forward;
      c.autocast_casts += p.autocast_weight_forward + p.autocast_input_forward;  // the forward's casts again
      c.autocast_cache_bytes = weight_copies;
      c.tp_comm_recompute = c.tp_comm_forward;
      if (dtensor_sp) c.tp_copies += 2.0 * (rs_copy + ag_copy);  // the forward's copies again
      if (replay_stops_before_last_linear) {
        // The replay ends before the MLP's last linear (StackSpec::full_recompute_replay): that
        // GEMM, the collective after it (DTensor: and the copy before its reduce-scatter) and the
        // residual add are not run again.
        c.recompute -= last_linear_forward + output_add_forward;
        c.tp_comm_recompute -= tp_mlp_output;
        if (dtensor_sp) c.tp_copies -= rs_copy;
      }
      c.ep_comm += ep_forward;
      c.ep_bytes += ep_forward_bytes;  // the recomputed forward dispatches and combines again
      c.cp_comm += cp_gather;  // the recomputed forward gathers K/V again; a ring passes them round again
      if (s.cp > 1) c.cp_bytes += (s.cp - 1) * T * (k_local + v_local) * e + moe_counts_bytes;
      // The forward runs without a graph: every tensor of the layer is alive at once, then cached.
      c.forward_transient_bytes += c.full_activation_bytes;
      c.smallest_saved_tensor_bytes = Tn * h * es;
      p.kernels *= 1.5;  // the forward's kernels run twice
      break;
  }
  c.kernels = p.kernels;

  // --- FLOPs (per GPU) ---
  const double attn_matmul = local_attention_matmul(mdl, t);
  const double ffn_active = mdl.moe ? static_cast<double>(mdl.moe->expert_ffn_hidden) * mdl.moe->top_k + static_cast<double>(mdl.moe->shared_ffn_hidden)
                                    : static_cast<double>(mdl.ffn_hidden);
  const double mlp_matmul = mlp_matrices * h * ffn_active / t;
  const double attention_width = mdl.heads * (d_qk + d_v) / 2.0;  // h for multi-head attention with head_dim = h / heads
  const double attention_flops_fwd = 4.0 * s_k * attention_width / t * T;  // QK^T and PV, non-causal convention
  double adapter_params = 0;
  if (lora) {
    for (const auto& name : s.lora.targets) {
      if (mla && name != "o" && (name == "q" || name == "k" || name == "v")) {
        for (const LinearShape& l : attention_linears(mdl)) {
          if (name == lora_target_of(l.name)) adapter_params += r * (local_in(l, t) + local_out(l, t));
        }
      } else if (name == "q" || name == "o") adapter_params += r * (h + (name == "o" ? o_in_local : q_local));
      else if (name == "k" || name == "v") adapter_params += r * (h + kv_local);
      else if (name == "gate" && feat.gated_mlp) adapter_params += r * (h + ffn_local) * mdl.moe.value_or(MoeSpec{1, 1, 0}).top_k;
      else if (name == "up" || name == "down") adapter_params += r * (h + ffn_local) * mdl.moe.value_or(MoeSpec{1, 1, 0}).top_k;
    }
  }
  const double base_factor = frozen ? 4.0 : 6.0;  // frozen weights need no weight gradient
  c.model_flops = base_factor * (attn_matmul + mlp_matmul) * T + 6.0 * adapter_params * T + 3.0 * attention_flops_fwd;
  c.hardware_flops = c.model_flops;
  if (s.recompute == Recompute::kFull) {
    c.hardware_flops += 2.0 * (attn_matmul + mlp_matmul + adapter_params) * T + attention_flops_fwd;
    if (replay_stops_before_last_linear) c.hardware_flops -= 2.0 * h * ffn_active / t * T;  // w2 / fc2 not replayed
  } else if (s.recompute == Recompute::kSelective && (s.attention == AttentionKernel::kStandard || is_trainplan(s.stack))) {
    c.hardware_flops += attention_flops_fwd;
  } else if (s.recompute == Recompute::kSelective && torchtitan_policy) {
    // The recomputed wk, wo and w3 GEMMs.
    const double recomputed = (h * static_cast<double>(mdl.kv_dim()) + h * static_cast<double>(mdl.q_dim())) / t + h * ffn_active / t;
    c.hardware_flops += 2.0 * recomputed * T;
  }
  return c;
}

}  // namespace

LayerCost blend(const LayerCost& a, const LayerCost& b, double f) {
  const auto mix = [f](double x, double y) { return (1 - f) * x + f * y; };
  LayerCost c;
  c.forward = mix(a.forward, b.forward);
  c.backward = mix(a.backward, b.backward);
  c.recompute = mix(a.recompute, b.recompute);
  c.tp_comm_forward = mix(a.tp_comm_forward, b.tp_comm_forward);
  c.tp_comm_backward = mix(a.tp_comm_backward, b.tp_comm_backward);
  c.tp_comm_recompute = mix(a.tp_comm_recompute, b.tp_comm_recompute);
  c.tp_copies = mix(a.tp_copies, b.tp_copies);
  c.autocast_casts = mix(a.autocast_casts, b.autocast_casts);
  c.autocast_cache_bytes = mix(a.autocast_cache_bytes, b.autocast_cache_bytes);
  c.cp_comm = mix(a.cp_comm, b.cp_comm);
  c.cp_bytes = mix(a.cp_bytes, b.cp_bytes);
  c.ep_comm = mix(a.ep_comm, b.ep_comm);
  c.ep_bytes = mix(a.ep_bytes, b.ep_bytes);
  c.model_flops = mix(a.model_flops, b.model_flops);
  c.hardware_flops = mix(a.hardware_flops, b.hardware_flops);
  c.kernels = mix(a.kernels, b.kernels);
  c.activation_bytes = mix(a.activation_bytes, b.activation_bytes);
  c.full_activation_bytes = mix(a.full_activation_bytes, b.full_activation_bytes);
  // Memory extremes are not averaged: the worst layer sets them.
  c.forward_transient_bytes = std::max(a.forward_transient_bytes, b.forward_transient_bytes);
  c.backward_transient_bytes = std::max(a.backward_transient_bytes, b.backward_transient_bytes);
  c.smallest_saved_tensor_bytes = std::min(a.smallest_saved_tensor_bytes, b.smallest_saved_tensor_bytes);
  c.gradients_in_gemm = a.gradients_in_gemm && b.gradients_in_gemm;
  return c;
}

}  // namespace trainplan::costmodel
