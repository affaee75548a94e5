// Decoder layout, initialisation and forward functions (see model.hpp).

#include "model.hpp"

#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace trainplan::executor {

namespace cm = trainplan::costmodel;

namespace {

constexpr double kInitStd = 0.02;
constexpr double kNormEps = 1e-5;
constexpr double kRopeTheta = 10000.0;

void add_slot(UnitLayout& u, const std::string& name, std::vector<int64_t> shape, InitKind init, bool decay) {
  ParamSlot s;
  s.name = u.name + "." + name;
  s.shape = std::move(shape);
  s.numel = 1;
  for (int64_t d : s.shape) s.numel *= d;
  s.offset = u.numel;
  s.init = init;
  s.weight_decay = decay;
  u.numel += s.numel;
  u.slots.push_back(std::move(s));
}

uint64_t name_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a 64
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

// Recomputes the attention core in backward instead of storing its intermediates (Korthikanti
// 2022 "selective" recompute): saves only q, k and v.
struct RecomputedAttention : torch::autograd::Function<RecomputedAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, bool gqa) {
    ctx->saved_data["gqa"] = gqa;
    ctx->save_for_backward({q, k, v});
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, std::nullopt, gqa);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool gqa = ctx->saved_data["gqa"].toBool();
    at::Tensor q = saved[0].detach().requires_grad_(true);
    at::Tensor k = saved[1].detach().requires_grad_(true);
    at::Tensor v = saved[2].detach().requires_grad_(true);
    torch::autograd::AutoGradMode enable(true);
    at::Tensor out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, std::nullopt, gqa);
    auto g = torch::autograd::grad({out}, {q, k, v}, {grads[0]});
    return {g[0], g[1], g[2], at::Tensor()};
  }
};

at::Tensor norm(const cm::ModelSpec& m, const at::Tensor& x, const at::Tensor& weight, const at::Tensor* bias) {
  if (m.architecture == cm::Architecture::kGpt) return at::layer_norm(x, {m.hidden}, weight, *bias, kNormEps);
  return at::rms_norm(x, {m.hidden}, weight, kNormEps);
}

// Rotates pairs (i, i + d/2) of the last dim ("rotate half", as in the Llama reference code).
at::Tensor apply_rotary(const at::Tensor& x, const Rotary& r) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  const at::Tensor rotated = at::cat({-x2, x1}, -1);
  return x * r.cos.to(x.scalar_type()) + rotated * r.sin.to(x.scalar_type());
}

}  // namespace

std::vector<UnitLayout> model_layout(const cm::ModelSpec& m) {
  const bool gpt = m.architecture == cm::Architecture::kGpt;
  const int64_t h = m.hidden, kv = m.kv_dim(), f = m.ffn_hidden;
  std::vector<UnitLayout> units;

  UnitLayout emb{"embedding", UnitKind::kEmbedding, -1, {}, 0};
  add_slot(emb, "tokens.weight", {m.vocab, h}, InitKind::kNormal, true);
  if (gpt) add_slot(emb, "positions.weight", {m.max_seq_len, h}, InitKind::kNormal, false);
  units.push_back(std::move(emb));

  for (int l = 0; l < m.layers; ++l) {
    UnitLayout b{"layers." + std::to_string(l), UnitKind::kBlock, l, {}, 0};
    add_slot(b, "attention_norm.weight", {h}, InitKind::kOnes, false);
    if (gpt) add_slot(b, "attention_norm.bias", {h}, InitKind::kZeros, false);
    add_slot(b, "attention.wq.weight", {h, h}, InitKind::kNormal, true);
    add_slot(b, "attention.wk.weight", {kv, h}, InitKind::kNormal, true);
    add_slot(b, "attention.wv.weight", {kv, h}, InitKind::kNormal, true);
    add_slot(b, "attention.wo.weight", {h, h}, InitKind::kScaledNormal, true);
    if (gpt) {
      add_slot(b, "attention.wq.bias", {h}, InitKind::kZeros, false);
      add_slot(b, "attention.wk.bias", {kv}, InitKind::kZeros, false);
      add_slot(b, "attention.wv.bias", {kv}, InitKind::kZeros, false);
      add_slot(b, "attention.wo.bias", {h}, InitKind::kZeros, false);
    }
    add_slot(b, "mlp_norm.weight", {h}, InitKind::kOnes, false);
    if (gpt) {
      add_slot(b, "mlp_norm.bias", {h}, InitKind::kZeros, false);
      add_slot(b, "mlp.fc1.weight", {f, h}, InitKind::kNormal, true);
      add_slot(b, "mlp.fc1.bias", {f}, InitKind::kZeros, false);
      add_slot(b, "mlp.fc2.weight", {h, f}, InitKind::kScaledNormal, true);
      add_slot(b, "mlp.fc2.bias", {h}, InitKind::kZeros, false);
    } else {
      add_slot(b, "mlp.gate.weight", {f, h}, InitKind::kNormal, true);
      add_slot(b, "mlp.up.weight", {f, h}, InitKind::kNormal, true);
      add_slot(b, "mlp.down.weight", {h, f}, InitKind::kScaledNormal, true);
    }
    units.push_back(std::move(b));
  }

  UnitLayout head{"head", UnitKind::kHead, -1, {}, 0};
  add_slot(head, "norm.weight", {h}, InitKind::kOnes, false);
  if (gpt) add_slot(head, "norm.bias", {h}, InitKind::kZeros, false);
  if (!m.tied_embeddings) add_slot(head, "output.weight", {m.vocab, h}, InitKind::kNormal, true);
  units.push_back(std::move(head));
  return units;
}

void init_unit(const UnitLayout& unit, const cm::ModelSpec& m, uint64_t seed, at::Tensor& flat) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed ^ name_hash(unit.name));
  const double scaled = kInitStd / std::sqrt(2.0 * m.layers);
  for (const ParamSlot& s : unit.slots) {
    at::Tensor dst = flat.narrow(0, s.offset, s.numel);
    switch (s.init) {
      case InitKind::kNormal: dst.copy_(at::normal(0.0, kInitStd, {s.numel}, gen)); break;
      case InitKind::kScaledNormal: dst.copy_(at::normal(0.0, scaled, {s.numel}, gen)); break;
      case InitKind::kOnes: dst.fill_(1.0); break;
      case InitKind::kZeros: dst.zero_(); break;
    }
  }
}

Rotary make_rotary(const cm::ModelSpec& m, int64_t seq_len, const at::Device& device) {
  const int64_t d = m.head_dim();
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor inv = at::pow(kRopeTheta, -at::arange(0, d, 2, f32) / static_cast<double>(d));  // [d/2]
  const at::Tensor angles = at::outer(at::arange(seq_len, f32), inv);                              // [s, d/2]
  const at::Tensor both = at::cat({angles, angles}, -1);                                           // [s, d]
  return Rotary{both.cos().to(device), both.sin().to(device)};
}

at::Tensor embedding_forward(const cm::ModelSpec& m, const std::vector<at::Tensor>& p, const at::Tensor& tokens) {
  at::Tensor x = at::embedding(p[0], tokens);
  if (m.architecture == cm::Architecture::kGpt) {
    const at::Tensor positions = at::arange(tokens.size(1), tokens.options());
    x = x + at::embedding(p[1], positions).unsqueeze(0);
  }
  return x;
}

at::Tensor block_forward(const cm::ModelSpec& m, const std::vector<at::Tensor>& p, const at::Tensor& x, const Rotary& rotary,
                         AttentionRecompute recompute) {
  const bool gpt = m.architecture == cm::Architecture::kGpt;
  const int64_t b = x.size(0), s = x.size(1), hd = m.head_dim();
  std::size_t i = 0;
  const at::Tensor& n1w = p[i++];
  const at::Tensor* n1b = gpt ? &p[i++] : nullptr;
  const at::Tensor &wq = p[i++], &wk = p[i++], &wv = p[i++], &wo = p[i++];
  at::Tensor bq, bk, bv, bo;
  if (gpt) {
    bq = p[i++];
    bk = p[i++];
    bv = p[i++];
    bo = p[i++];
  }
  const at::Tensor& n2w = p[i++];
  const at::Tensor* n2b = gpt ? &p[i++] : nullptr;

  const at::Tensor a = norm(m, x, n1w, n1b);
  at::Tensor q = at::linear(a, wq, bq).view({b, s, m.heads, hd}).transpose(1, 2);
  at::Tensor k = at::linear(a, wk, bk).view({b, s, m.kv_heads, hd}).transpose(1, 2);
  at::Tensor v = at::linear(a, wv, bv).view({b, s, m.kv_heads, hd}).transpose(1, 2);
  if (!gpt) {
    q = apply_rotary(q, rotary);
    k = apply_rotary(k, rotary);
  }
  const bool gqa = m.kv_heads != m.heads;
  at::Tensor attn = recompute == AttentionRecompute::kSelective
                        ? RecomputedAttention::apply(q, k, v, gqa)
                        : at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, std::nullopt, gqa);
  attn = attn.transpose(1, 2).reshape({b, s, m.hidden});
  const at::Tensor h1 = x + at::linear(attn, wo, bo);

  const at::Tensor c = norm(m, h1, n2w, n2b);
  at::Tensor mlp;
  if (gpt) {
    const at::Tensor &w1 = p[i], &b1 = p[i + 1], &w2 = p[i + 2], &b2 = p[i + 3];
    mlp = at::linear(at::gelu(at::linear(c, w1, b1), "tanh"), w2, b2);
  } else {
    const at::Tensor &gate = p[i], &up = p[i + 1], &down = p[i + 2];
    mlp = at::linear(at::silu(at::linear(c, gate)) * at::linear(c, up), down);
  }
  return h1 + mlp;
}

at::Tensor head_loss(const cm::ModelSpec& m, const std::vector<at::Tensor>& p, const at::Tensor& output_weight,
                     const at::Tensor& x, const at::Tensor& targets) {
  const bool gpt = m.architecture == cm::Architecture::kGpt;
  const at::Tensor normed = norm(m, x, p[0], gpt ? &p[1] : nullptr);
  const at::Tensor logits = at::linear(normed, output_weight);
  return at::cross_entropy_loss(logits.view({-1, m.vocab}).to(at::kFloat), targets.reshape({-1}));
}

}  // namespace trainplan::executor
