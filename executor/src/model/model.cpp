// The decoder's forward functions: attention, norms, rotary, the block and the loss (see model.hpp;
// the layout and initialisation are in model_layout.cpp).

#include "model.hpp"

#include <cmath>
#include <initializer_list>
#include <map>
#include <stdexcept>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace trainplan::executor {

namespace cm = trainplan::costmodel;

namespace {

// Recomputes the attention core in backward instead of storing its intermediates (Korthikanti
// 2022 "selective" recompute): saves only q, k and v (and the context-parallel mask, if any).
at::Tensor attention_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, bool gqa) {
  // Causal without CP; under CP the mask of the gathered keys' global positions.
  return mask.defined() ? at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, std::nullopt, gqa)
                        : at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, std::nullopt, gqa);
}

struct RecomputedAttention : torch::autograd::Function<RecomputedAttention> {
  // `mask` travels in saved_data (a constant; autograd takes no undefined tensor as an input).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const c10::IValue& mask, bool gqa) {
    ctx->saved_data["gqa"] = gqa;
    ctx->saved_data["mask"] = mask;
    ctx->save_for_backward({q, k, v});
    return attention_core(q, k, v, mask_of(mask), gqa);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool gqa = ctx->saved_data["gqa"].toBool();
    at::Tensor q = saved[0].detach().requires_grad_(true);
    at::Tensor k = saved[1].detach().requires_grad_(true);
    at::Tensor v = saved[2].detach().requires_grad_(true);
    torch::autograd::AutoGradMode enable(true);
    at::Tensor out = attention_core(q, k, v, mask_of(ctx->saved_data["mask"]), gqa);
    auto g = torch::autograd::grad({out}, {q, k, v}, {grads[0]});
    return {g[0], g[1], g[2], at::Tensor(), at::Tensor()};
  }
  static at::Tensor mask_of(const c10::IValue& mask) { return mask.isTensor() ? mask.toTensor() : at::Tensor(); }
};

// Causal attention of q over k and v ([b, heads, s, hd]). Under context parallelism q holds this
// rank's two chunks and the keys and values are gathered from every rank; each chunk attends the
// keys up to its own end (context_parallel.hpp).
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ContextParallel& cp, AttentionRecompute recompute,
                     bool gqa) {
  const auto core = [&](const at::Tensor& qc, const at::Tensor& kc, const at::Tensor& vc, const at::Tensor& mask) {
    return recompute == AttentionRecompute::kSelective ? RecomputedAttention::apply(qc, kc, vc, mask.defined() ? c10::IValue(mask) : c10::IValue(), gqa)
                                                       : attention_core(qc, kc, vc, mask, gqa);
  };
  if (!cp.active()) return core(q, k, v, at::Tensor());
  const at::Tensor keys = gather_context(cp, k), values = gather_context(cp, v);  // [b, kv_heads, seq, hd], global order
  const int64_t chunk = q.size(2) / 2;
  std::vector<at::Tensor> out;
  for (int half = 0; half < 2; ++half) {
    const int64_t n = cp.chunk_keys[half];
    // [b, s, heads, hd] in memory, as the kernels write it, so the caller's reshape is a view.
    out.push_back(core(q.narrow(2, half * chunk, chunk), keys.narrow(2, 0, n), values.narrow(2, 0, n), cp.chunk_mask[half]).transpose(1, 2));
  }
  return at::cat(out, 1).transpose(1, 2);
}

at::Tensor norm(const cm::ModelSpec& m, const at::Tensor& x, const at::Tensor& weight, const at::Tensor* bias) {
  if (m.architecture == cm::Architecture::kGpt) return at::layer_norm(x, {m.hidden}, weight, *bias, m.norm_eps);
  return rms_norm(x, weight, m.norm_eps);  // fused_ops.hpp: what CUDA's kernel keeps, on CPU too
}

// Rotates pairs (i, i + d/2) of the last dim ("rotate half", as in the Llama reference code).
at::Tensor apply_rotary(const at::Tensor& x, const Rotary& r) { return x * r.cos + rotate_half(x) * r.sin; }

}  // namespace

Rotary make_rotary(const cm::ModelSpec& m, int64_t seq_len, const at::Device& device, at::ScalarType dtype) {
  const int64_t d = m.head_dim();
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor inv = at::pow(m.rope_theta, -at::arange(0, d, 2, f32) / static_cast<double>(d));  // [d/2]
  const at::Tensor angles = at::outer(at::arange(seq_len, f32), inv);                              // [s, d/2]
  const at::Tensor both = at::cat({angles, angles}, -1);                                           // [s, d]
  return Rotary{both.cos().to(device, dtype), both.sin().to(device, dtype)};
}

at::Tensor embedding_forward(const cm::ModelSpec& m, const TensorParallel& tp, const ContextParallel& cp, const std::vector<at::Tensor>& p,
                             const at::Tensor& tokens, const at::Tensor& table_grad_sum) {
  at::Tensor x = tp.active() ? leave_tp_region(tp, vocab_parallel_embedding(p[0], tokens, tp.rank() * p[0].size(0)))
                             : embedding_into(p[0], tokens, table_grad_sum);
  if (m.architecture == cm::Architecture::kGpt) {
    const int64_t first = tp.sharded_sequence() ? tp.rank() * x.size(1) : 0;  // this rank's sequence shard
    const at::Tensor positions = cp.active() ? cp.positions.narrow(0, first, x.size(1)).to(tokens.device())
                                             : at::arange(first, first + x.size(1), tokens.options());
    x = x + at::embedding(p[1], positions).unsqueeze(0);
  }
  return x;
}

bool is_moe_layer(const cm::ModelSpec& m, int layer) { return m.moe.has_value() && layer >= m.moe->dense_layers; }

at::Tensor block_forward(const cm::ModelSpec& m, const TensorParallel& tp, const ContextParallel& cp, const std::vector<at::Tensor>& p, const at::Tensor& x,
                         const Rotary& rotary, AttentionRecompute recompute, Kernels kernels, const std::vector<at::Tensor>& grad_sums,
                         const MoeRun& moe, const LoraSpec& lora, const DropoutRun& drop, bool fp8) {
  const bool gpt = m.architecture == cm::Architecture::kGpt;
  const int64_t hd = m.head_dim();
  const int64_t heads = m.heads / tp.size();                                    // this rank's query heads
  const int64_t kv_heads = tp.size() <= m.kv_heads ? m.kv_heads / tp.size() : 1;  // and key/value heads
  const bool fused = kernels == Kernels::kFused && !gpt;
  if (fp8 && gpt) throw std::logic_error("block_forward: fp8 linear layers are for Llama-style blocks (trainer.cpp refuses GPT)");
  const bool lora_dropout = lora.active() && drop.active() && drop.lora > 0;
  const bool fused_norm = fused && !tp.active() && !lora_dropout;  // the TP region begins at the norm's output
  // The float32 gradient sums of the fused path's weights (model.hpp), by parameter index.
  const bool into_sums = fused_norm && !grad_sums.empty();
  if (into_sums && grad_sums.size() != p.size()) throw std::logic_error("block_forward: one gradient sum per parameter expected");
  const auto sum = [&](std::size_t k) { return into_sums ? grad_sums[k] : at::Tensor(); };

  // LoRA adapters: after the block's parameters, A then B of each target in lora_target_order();
  // by target, the parameter index of its A (B follows it).
  std::map<std::string, std::size_t> adapters;
  std::size_t block_params = p.size();
  if (lora.active()) {
    std::size_t n = 0;
    for (const std::string& t : lora_target_order()) n += lora.has(t) ? 2 : 0;
    if (n > p.size()) throw std::logic_error("block_forward: fewer parameters than the LoRA adapters");
    block_params = p.size() - n;
    std::size_t at_param = block_params;
    for (const std::string& t : lora_target_order()) {
      if (!lora.has(t)) continue;
      adapters[t] = at_param;
      at_param += 2;
    }
  }
  const auto adapted = [&](const std::string& t) { return adapters.count(t) != 0; };
  // scale x B (A x) from A x ([.., rank]): the small tensor is scaled, not the output.
  const auto adapter_up = [&](const std::string& t, const at::Tensor& ax) {
    const std::size_t b_index = adapters.at(t) + 1;
    const at::Tensor scaled = ax * lora.scale;
    return into_sums ? linear_into(scaled, p[b_index], sum(b_index)) : at::linear(scaled, p[b_index]);
  };
  // The adapter's input dropped (PEFT's lora_dropout), a mask per target: the whole sequence of
  // this rank's tokens, and a row-parallel projection's (o, down) features from this TP rank's.
  const auto adapter_a = [&](const std::string& t, const at::Tensor& input) {
    const std::size_t a_index = adapters.at(t);
    at::Tensor in = input;
    if (lora_dropout) {
      uint64_t site = static_cast<uint64_t>(DropoutSite::kLoraFirst);
      for (const std::string& o : lora_target_order()) {
        if (o == t) break;
        ++site;
      }
      const int64_t offset = t == "o" || t == "down" ? tp.rank() * input.size(-1) : 0;
      in = dropout(input, drop, drop.lora, dropout_site(drop.layer, site), drop.positions, offset);
    }
    return into_sums ? linear_into(in, p[a_index], sum(a_index)) : at::linear(in, p[a_index]);
  };
  // A residual branch's output dropped: this rank's rows (its sequence shard under sequence
  // parallelism), every feature.
  const auto drop_branch = [&](const at::Tensor& y, DropoutSite site) {
    if (!drop.active() || drop.hidden <= 0) return y;
    const at::Tensor rows = tp.sharded_sequence() ? drop.positions.narrow(0, tp.rank() * y.size(1), y.size(1)) : drop.positions;
    return dropout(y, drop, drop.hidden, dropout_site(drop.layer, static_cast<uint64_t>(site)), rows, 0);
  };
  // linear(input, w) plus its adapter where `t` has one.
  // fp8: the base weight's GEMMs on fp8 operands, the adapter's in bf16.
  const auto projection = [&](const std::string& t, const at::Tensor& input, const at::Tensor& w, const at::Tensor& bias, std::size_t w_index) {
    at::Tensor y = (into_sums || fp8) && !bias.defined() ? linear_into(input, w, sum(w_index), fp8) : at::linear(input, w, bias);
    if (adapted(t)) y = y + adapter_up(t, adapter_a(t, input));
    return y;
  };
  // Linears sharing one input, the targets' adapters' A matrices among them: `run` computes one
  // output per parameter index it is given (the targets' weights, then the A matrices); one
  // output per target comes back, its adapter's B added.
  using Targets = std::vector<std::pair<std::string, std::size_t>>;
  const auto shared_input_projections = [&](const Targets& targets, const auto& run) {
    std::vector<std::size_t> indices;
    std::vector<std::string> with_adapter;
    for (const auto& [t, w] : targets) indices.push_back(w);
    for (const auto& [t, w] : targets) {
      if (!adapted(t)) continue;
      indices.push_back(adapters.at(t));
      with_adapter.push_back(t);
    }
    std::vector<at::Tensor> out = run(indices);
    for (std::size_t k = 0; k < with_adapter.size(); ++k) {
      for (std::size_t j = 0; j < targets.size(); ++j) {
        if (targets[j].first == with_adapter[k]) out[j] = out[j] + adapter_up(with_adapter[k], out[targets.size() + k]);
      }
    }
    out.resize(targets.size());
    return out;
  };
  // The fused norm of input (+ branch, the residual add in the norm's pass) and its linears.
  // `stream` receives the residual stream's continuation: the norm's input, whose gradient the
  // norm's backward adds to its own (fused_ops.hpp), so the residual fork takes no add pass.
  const auto norm_projections = [&](const at::Tensor& input, const at::Tensor& branch, std::size_t norm_index, const Targets& targets,
                                    at::Tensor& stream) {
    return shared_input_projections(targets, [&](const std::vector<std::size_t>& indices) {
      std::vector<at::Tensor> weights, sums;
      for (std::size_t k : indices) {
        weights.push_back(p[k]);
        if (into_sums) sums.push_back(grad_sums[k]);
      }
      std::vector<at::Tensor> out = norm_linears(input, p[norm_index], m.norm_eps, weights, sums, sum(norm_index), /*residual=*/true, branch,
                                                 fp8 ? targets.size() : 0);
      stream = out.back();
      out.pop_back();
      return out;
    });
  };
  // Under sequence parallelism a group of column-parallel projections gathers its input itself
  // and keeps only the sequence shard (tensor_parallel.hpp gathered_linears); with LoRA dropout
  // each A takes a dropped copy of the gathered input, so that case gathers through
  // enter_tp_region. The targets' biases (GPT) are added after the GEMMs.
  // fp8: through enter_tp_region (the gathered input kept), as gathered_linears has no fp8 GEMMs.
  const bool regather = tp.sharded_sequence() && !lora_dropout && !fp8;
  const auto gathered_projections = [&](const at::Tensor& shard, const Targets& targets, const std::vector<at::Tensor>& biases) {
    return shared_input_projections(targets, [&](const std::vector<std::size_t>& indices) {
      std::vector<at::Tensor> weights;
      for (std::size_t k : indices) weights.push_back(p[k]);
      std::vector<at::Tensor> out = gathered_linears(tp, shard, weights);
      for (std::size_t j = 0; j < biases.size(); ++j) {
        if (biases[j].defined()) out[j] = out[j] + biases[j];
      }
      return out;
    });
  };

  std::size_t i = 0;
  const at::Tensor& n1w = p[i++];
  const at::Tensor* n1b = gpt ? &p[i++] : nullptr;
  const std::size_t iq = i;
  const at::Tensor &wq = p[i++], &wk = p[i++], &wv = p[i++], &wo = p[i++];
  at::Tensor bq, bk, bv, bo;
  if (gpt) {
    bq = p[i++];
    bk = p[i++];
    bv = p[i++];
    bo = p[i++];
  }
  const std::size_t n2 = i;
  const at::Tensor& n2w = p[i++];
  const at::Tensor* n2b = gpt ? &p[i++] : nullptr;

  const int64_t b = x.size(0), s = tp.sharded_sequence() ? x.size(1) * tp.size() : x.size(1);
  at::Tensor q, k, v;
  at::Tensor residual = x;  // the residual stream: the fused norm hands it on (norm_projections)
  if (fused_norm) {
    const std::vector<at::Tensor> qkv = norm_projections(x, at::Tensor(), 0, {{"q", iq}, {"k", iq + 1}, {"v", iq + 2}}, residual);
    q = qkv[0];
    k = qkv[1];
    v = qkv[2];
  } else if (regather) {
    const std::vector<at::Tensor> qkv = gathered_projections(norm(m, x, n1w, n1b), {{"q", iq}, {"k", iq + 1}, {"v", iq + 2}}, {bq, bk, bv});
    q = qkv[0];
    k = qkv[1];
    v = qkv[2];
  } else {
    const at::Tensor a = enter_tp_region(tp, norm(m, x, n1w, n1b));  // [b, s, h], the whole sequence
    q = projection("q", a, wq, bq, iq);
    k = projection("k", a, wk, bk, iq + 1);
    v = projection("v", a, wv, bv, iq + 2);
  }
  q = q.view({b, s, heads, hd}).transpose(1, 2);
  k = k.view({b, s, kv_heads, hd}).transpose(1, 2);
  v = v.view({b, s, kv_heads, hd}).transpose(1, 2);
  if (fused) {
    q = rotary_embedding(q, rotary.cos, rotary.sin);
    k = rotary_embedding(k, rotary.cos, rotary.sin);
  } else if (!gpt) {
    q = apply_rotary(q, rotary);
    k = apply_rotary(k, rotary);
  }
  at::Tensor attn = attention(q, k, v, cp, recompute, kv_heads != heads);
  attn = attn.transpose(1, 2).reshape({b, s, heads * hd});
  // Row-parallel: the bias after the sum, the adapter's partial product before it.
  at::Tensor projected = leave_tp_region(tp, projection("o", attn, wo, at::Tensor(), iq + 3));
  if (bo.defined()) projected = projected + bo;
  const at::Tensor attention_branch = drop_branch(projected, DropoutSite::kAttention);
  const bool moe_layer = m.moe && block_params - i == 1 + 3 * static_cast<std::size_t>(m.moe->experts / (moe.ep == nullptr ? 1 : moe.ep->size()));
  if (fp8 && moe_layer) throw std::logic_error("block_forward: fp8 experts are not built (trainer.cpp refuses MoE models in fp8)");
  // x + the attention branch: h1, or, when the MLP's norm is fused, taken in that norm's pass
  // and handed on by it (mlp_residual).
  const bool add_in_norm = fused_norm && !gpt && !moe_layer;
  const at::Tensor h1 = add_in_norm ? at::Tensor() : residual + attention_branch;
  at::Tensor mlp_residual = h1;

  at::Tensor mlp;
  if (gpt) {
    const at::Tensor &w1 = p[i], &b1 = p[i + 1], &w2 = p[i + 2], &b2 = p[i + 3];
    const at::Tensor fc1 = regather ? gathered_projections(norm(m, h1, n2w, n2b), {{"fc1", i}}, {b1})[0]
                                    : at::linear(enter_tp_region(tp, norm(m, h1, n2w, n2b)), w1, b1);
    mlp = leave_tp_region(tp, at::linear(at::gelu(fc1, "tanh"), w2)) + b2;
  } else if (moe_layer) {
    // An MoE layer: the router, then this rank's experts (model_layout).
    const auto from = static_cast<std::ptrdiff_t>(i);
    mlp = moe_mlp(*m.moe, norm(m, h1, n2w, n2b), std::vector<at::Tensor>(p.begin() + from, p.end()), moe,
                  into_sums ? std::vector<at::Tensor>(grad_sums.begin() + from, grad_sums.end()) : std::vector<at::Tensor>{});
  } else {
    const at::Tensor &gate = p[i], &up = p[i + 1], &down = p[i + 2];
    at::Tensor g, u;
    if (fused_norm || regather) {
      const std::vector<at::Tensor> gu = fused_norm ? norm_projections(residual, attention_branch, n2, {{"gate", i}, {"up", i + 1}}, mlp_residual)
                                                    : gathered_projections(norm(m, h1, n2w, n2b), {{"gate", i}, {"up", i + 1}}, {});
      g = gu[0];
      u = gu[1];
    } else {
      const at::Tensor c = enter_tp_region(tp, norm(m, h1, n2w, n2b));
      g = projection("gate", c, gate, at::Tensor(), i);
      u = projection("up", c, up, at::Tensor(), i + 1);
    }
    // The fused SwiGLU keeps gate and up, not their product; an adapted down projection needs
    // the product as its adapter's input, which its A matrix keeps.
    if (fused && !adapted("down")) mlp = swiglu_down(g, u, down, sum(i + 2), fp8);
    else mlp = projection("down", fused ? swiglu(g, u) : at::silu(g) * u, down, at::Tensor(), i + 2);
    mlp = leave_tp_region(tp, mlp);
  }
  return mlp_residual + drop_branch(mlp, DropoutSite::kMlp);
}

at::Tensor head_loss(const cm::ModelSpec& m, const TensorParallel& tp, const std::vector<at::Tensor>& p,
                     const at::Tensor& output_weight, const at::Tensor& x, const at::Tensor& targets, Kernels kernels,
                     const at::Tensor& output_weight_grad_sum, double loss_multiplier, double denominator) {
  const bool gpt = m.architecture == cm::Architecture::kGpt;
  const at::Tensor normed = enter_tp_region(tp, norm(m, x, p[0], gpt ? &p[1] : nullptr));
  if (kernels == Kernels::kFused && !tp.active()) {
    return linear_cross_entropy(normed.reshape({-1, normed.size(-1)}), output_weight, targets.reshape({-1}), 0, output_weight_grad_sum,
                                loss_multiplier, denominator);
  }
  const at::Tensor logits = at::linear(normed, output_weight);  // [b, s, vocab / tp]
  return vocab_parallel_cross_entropy(tp, logits.reshape({-1, logits.size(-1)}).to(at::kFloat), targets.reshape({-1}),
                                      tp.rank() * output_weight.size(0), denominator);
}

at::Tensor head_logits(const cm::ModelSpec& m, const std::vector<at::Tensor>& p, const at::Tensor& output_weight, const at::Tensor& x) {
  const bool gpt = m.architecture == cm::Architecture::kGpt;
  return at::linear(norm(m, x, p[0], gpt ? &p[1] : nullptr), output_weight).to(at::kFloat);
}

}  // namespace trainplan::executor
