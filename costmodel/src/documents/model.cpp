#include "trainplan/costmodel/model.hpp"

#include <nlohmann/json.hpp>

#include "json_reader.hpp"

namespace trainplan::costmodel {

const char* architecture_name(Architecture a) { return a == Architecture::kGpt ? "gpt" : "llama"; }

ModelFeatures architecture_features(Architecture a) {
  ModelFeatures f;
  if (a == Architecture::kGpt) {
    f.layer_norm = true;
    f.gated_mlp = false;
    f.learned_positions = true;
    f.qkv_bias = f.o_bias = f.mlp_bias = true;
  }
  return f;
}

std::vector<LinearShape> attention_linears(const ModelSpec& m) {
  const ModelFeatures f = m.features();
  const double h = static_cast<double>(m.hidden);
  const double heads = m.heads;
  if (m.mla) {
    // DeepSeek-V2 (Liu et al. 2024, Sec. 2.1.2) as in modeling_deepseek: q_a_proj, q_b_proj (or
    // q_proj), kv_a_proj_with_mqa (latent + shared rotary key), kv_b_proj, o_proj; attention_bias
    // puts biases on q_a / q, kv_a and o. Megatron replicates the down projections under TP.
    const MlaSpec& a = *m.mla;
    const double qk = static_cast<double>(a.qk_head_dim());
    std::vector<LinearShape> v;
    if (a.q_lora_rank > 0) {
      v.push_back({"q_a", h, static_cast<double>(a.q_lora_rank), f.qkv_bias, TpSplit::kReplicated});
      v.push_back({"q_b", static_cast<double>(a.q_lora_rank), heads * qk, false, TpSplit::kColumn});
    } else {
      v.push_back({"q", h, heads * qk, f.qkv_bias, TpSplit::kColumn});
    }
    v.push_back({"kv_a", h, static_cast<double>(a.kv_lora_rank + a.qk_rope_head_dim), f.qkv_bias, TpSplit::kReplicated});
    v.push_back({"kv_b", static_cast<double>(a.kv_lora_rank), heads * static_cast<double>(a.qk_nope_head_dim + a.v_head_dim), false,
                 TpSplit::kColumn});
    v.push_back({"o", heads * static_cast<double>(a.v_head_dim), h, f.o_bias, TpSplit::kRow});
    return v;
  }
  const double q = static_cast<double>(m.q_dim());
  const double kv = static_cast<double>(m.kv_dim());
  return {{"q", h, q, f.qkv_bias, TpSplit::kColumn},
          {"k", h, kv, f.qkv_bias, TpSplit::kColumn},
          {"v", h, kv, f.qkv_bias, TpSplit::kColumn},
          {"o", q, h, f.o_bias, TpSplit::kRow}};
}

const char* lora_target_of(const char* linear_name) {
  const std::string n = linear_name;
  if (n == "q" || n == "q_a" || n == "q_b") return "q";
  if (n == "k" || n == "kv_a") return "k";
  if (n == "v" || n == "kv_b") return "v";
  return "o";
}

double attention_matmul_params(const ModelSpec& m) {
  double total = 0;
  for (const LinearShape& l : attention_linears(m)) total += l.in * l.out;
  return total;
}

double attention_linear_params(const ModelSpec& m) {
  double total = 0;
  for (const LinearShape& l : attention_linears(m)) total += l.in * l.out + (l.bias ? l.out : 0.0);
  return total;
}

double mlp_matmul_params(const ModelSpec& m, double ffn) {
  return (m.features().gated_mlp ? 3.0 : 2.0) * static_cast<double>(m.hidden) * ffn;
}

int block_parameter_tensors(const ModelSpec& m, bool fused_qkv, bool fused_gate_up) {
  const ModelFeatures f = m.features();
  const int qkv = fused_qkv ? 1 : 3;
  const int mlp = f.gated_mlp && !fused_gate_up ? 3 : 2;
  return qkv + 1 + mlp + (f.qkv_bias ? qkv : 0) + (f.o_bias ? 1 : 0) + (f.mlp_bias ? mlp : 0) + (f.layer_norm ? 4 : 2);
}

ParameterCounts count_parameters(const ModelSpec& m) {
  const ModelFeatures feat = m.features();
  const double h = static_cast<double>(m.hidden);
  const double f = static_cast<double>(m.ffn_hidden);
  ParameterCounts c;
  c.embedding = static_cast<double>(m.vocab) * h + (feat.learned_positions ? static_cast<double>(m.max_seq_len) * h : 0.0);
  // Q and O are h x q_dim; K and V are h x kv_dim (GPT: biases on all four); MLA's projections
  // and its two RMSNorms inside the bottlenecks.
  c.attention = attention_linear_params(m);
  if (m.mla) c.attention += static_cast<double>(m.mla->q_lora_rank + m.mla->kv_lora_rank);
  // LayerNorm has weight and bias; RMSNorm only a weight.
  const double norm = feat.layer_norm ? 2 * h : h;
  c.norms = 2 * norm;
  auto mlp_params = [&](double ffn) {
    // Gated (SwiGLU/GeGLU): gate, up and down; plain (GELU): up and down. Biases on each output.
    const double biases = feat.mlp_bias ? (feat.gated_mlp ? 2 * ffn : ffn) + h : 0.0;
    return mlp_matmul_params(m, ffn) + biases;
  };
  c.mlp = mlp_params(f);
  c.mlp_active = c.mlp;
  if (m.moe) {
    const double expert = mlp_params(static_cast<double>(m.moe->expert_ffn_hidden));
    const double shared = m.moe->shared_ffn_hidden > 0 ? mlp_params(static_cast<double>(m.moe->shared_ffn_hidden)) : 0.0;
    const double router = h * m.moe->experts;
    const double routed = m.moe->experts * expert;
    const double moe_mlp = routed + shared + router;
    const double moe_active = m.moe->top_k * expert + shared + router;
    if (m.moe->dense_layers == 0) {
      c.mlp = moe_mlp;
      c.mlp_active = moe_active;
      c.routed_experts = routed;
      c.router = router;
    } else {  // per-layer averages over the dense and the MoE layers
      const double L = m.layers, dense = m.moe->dense_layers, sparse = m.moe_layers();
      c.mlp = (dense * c.mlp + sparse * moe_mlp) / L;
      c.mlp_active = (dense * c.mlp_active + sparse * moe_active) / L;
      c.routed_experts = sparse * routed / L;
      c.router = sparse * router / L;
    }
  }
  c.final_norm = norm;
  c.output = m.tied_embeddings ? 0.0 : static_cast<double>(m.vocab) * h;
  return c;
}

double model_flops_per_token(const ModelSpec& m, std::int64_t seq_len) {
  const ParameterCounts c = count_parameters(m);
  const double h = static_cast<double>(m.hidden);
  // Matmul parameters a token passes through: every layer's projections and MLP, plus the
  // output layer (the embedding lookup is not a matmul; tied weights are still multiplied).
  const double matmul_params = m.layers * (c.attention + c.mlp_active - c.router) + static_cast<double>(m.vocab) * h;
  // QK^T and PV: 2 FLOPs per multiply-add, forward and twice that backward.
  const double qk = static_cast<double>(m.mla ? m.mla->qk_head_dim() : m.head_dim());
  const double v = static_cast<double>(m.mla ? m.mla->v_head_dim : m.head_dim());
  const double attention = 6.0 * m.layers * m.attended_keys(static_cast<double>(seq_len)) * (m.heads * (qk + v));
  return 6.0 * matmul_params + attention;
}

Result<ModelSpec> parse_model(const nlohmann::json& json, const std::string& file, const std::string& pointer) {
  try {
    detail::ObjectReader r(json, file, pointer);
    r.expect_schema("trainplan/model/v1");
    ModelSpec m;
    m.name = r.string("name");
    m.source = r.optional_string("source").value_or("");
    m.architecture = r.one_of("architecture", {"gpt", "llama"}) == "gpt" ? Architecture::kGpt : Architecture::kLlama;
    m.layers = static_cast<int>(r.integer("layers", 1, 10000));
    m.hidden = r.integer("hidden", 1, 1 << 20);
    m.heads = static_cast<int>(r.integer("heads", 1, 4096));
    m.kv_heads = static_cast<int>(r.optional_integer("kv_heads", 1, 4096).value_or(m.heads));
    m.ffn_hidden = r.optional_integer("ffn_hidden", 1, 1 << 22).value_or(4 * m.hidden);
    m.vocab = r.integer("vocab", 1, 1 << 24);
    m.tied_embeddings = r.optional_boolean("tied_embeddings").value_or(m.architecture == Architecture::kGpt);
    m.max_seq_len = r.optional_integer("max_seq_len", 1, 1 << 24).value_or(2048);
    m.head_size = r.optional_integer("head_dim", 1, 1 << 16).value_or(0);
    if (m.head_size == 0 && m.hidden % m.heads != 0) {
      r.fail("hidden", "must be divisible by heads (" + std::to_string(m.heads) + ") unless head_dim is given");
    }
    if (m.heads % m.kv_heads != 0) r.fail("kv_heads", "must divide heads (" + std::to_string(m.heads) + ")");
    // Features that differ from the architecture's.
    ModelFeatures f = architecture_features(m.architecture);
    if (auto norm = r.optional_one_of("norm", {"layernorm", "rmsnorm"})) f.layer_norm = *norm == "layernorm";
    if (auto mlp = r.optional_one_of("mlp", {"gated", "geglu", "plain"})) {
      f.gated_mlp = *mlp != "plain";
      f.gelu_gate = *mlp == "geglu";
    }
    if (auto pos = r.optional_one_of("positions", {"learned", "rotary", "alibi"})) {
      f.learned_positions = *pos == "learned";
      f.alibi = *pos == "alibi";
    }
    f.qkv_bias = r.optional_boolean("qkv_bias").value_or(f.qkv_bias);
    f.o_bias = r.optional_boolean("o_bias").value_or(f.o_bias);
    f.mlp_bias = r.optional_boolean("mlp_bias").value_or(f.mlp_bias);
    if (f != architecture_features(m.architecture)) m.feature_overrides = f;
    m.sliding_window = r.optional_integer("sliding_window", 1, 1 << 24).value_or(0);
    m.rope_theta = r.optional_number("rope_theta", 1.0, 1e12).value_or(10000.0);
    m.norm_eps = r.optional_number("norm_eps", 1e-12, 0.1).value_or(1e-5);
    if (r.has("mla")) {
      detail::ObjectReader a = r.object("mla");
      MlaSpec spec;
      spec.q_lora_rank = a.optional_integer("q_lora_rank", 1, 1 << 20).value_or(0);
      spec.kv_lora_rank = a.integer("kv_lora_rank", 1, 1 << 20);
      spec.qk_nope_head_dim = a.integer("qk_nope_head_dim", 1, 1 << 16);
      spec.qk_rope_head_dim = a.integer("qk_rope_head_dim", 0, 1 << 16);
      spec.v_head_dim = a.integer("v_head_dim", 1, 1 << 16);
      a.finish();
      m.mla = spec;
    } else {
      r.optional_string("mla");
    }
    if (r.has("moe")) {
      detail::ObjectReader moe = r.object("moe");
      MoeSpec spec;
      spec.experts = static_cast<int>(moe.integer("experts", 2, 1 << 16));
      spec.top_k = static_cast<int>(moe.integer("top_k", 1, spec.experts));
      spec.expert_ffn_hidden = moe.optional_integer("expert_ffn_hidden", 1, 1 << 22).value_or(m.ffn_hidden);
      spec.shared_ffn_hidden = moe.optional_integer("shared_ffn_hidden", 1, 1 << 22).value_or(0);
      spec.dense_layers = static_cast<int>(moe.optional_integer("dense_layers", 0, m.layers - 1).value_or(0));
      spec.capacity_factor = moe.optional_number("capacity_factor", 0, 64).value_or(0);
      spec.aux_loss_coeff = moe.optional_number("aux_loss_coeff", 0, 1).value_or(spec.aux_loss_coeff);
      moe.finish();
      m.moe = spec;
    } else {
      r.optional_string("moe");  // mark absent/null key as read
    }
    r.finish();
    return m;
  } catch (const detail::DocumentError& e) {
    return Error{e.what()};
  }
}

Result<ModelSpec> parse_model_text(const std::string& text, const std::string& file) {
  try {
    return parse_model(detail::parse_json(text, file), file);
  } catch (const detail::DocumentError& e) {
    return Error{e.what()};
  }
}

nlohmann::json model_to_json(const ModelSpec& m) {
  nlohmann::json j = {
      {"schema", "trainplan/model/v1"},
      {"name", m.name},
      {"source", m.source},
      {"architecture", architecture_name(m.architecture)},
      {"layers", m.layers},
      {"hidden", m.hidden},
      {"heads", m.heads},
      {"kv_heads", m.kv_heads},
      {"ffn_hidden", m.ffn_hidden},
      {"vocab", m.vocab},
      {"tied_embeddings", m.tied_embeddings},
      {"max_seq_len", m.max_seq_len},
  };
  if (m.head_size > 0) j["head_dim"] = m.head_size;
  const ModelFeatures f = m.features();
  const ModelFeatures d = architecture_features(m.architecture);
  if (f.layer_norm != d.layer_norm) j["norm"] = f.layer_norm ? "layernorm" : "rmsnorm";
  if (f.gated_mlp != d.gated_mlp || f.gelu_gate != d.gelu_gate) j["mlp"] = !f.gated_mlp ? "plain" : f.gelu_gate ? "geglu" : "gated";
  if (f.learned_positions != d.learned_positions || f.alibi != d.alibi) j["positions"] = f.learned_positions ? "learned" : f.alibi ? "alibi" : "rotary";
  if (f.qkv_bias != d.qkv_bias) j["qkv_bias"] = f.qkv_bias;
  if (f.o_bias != d.o_bias) j["o_bias"] = f.o_bias;
  if (f.mlp_bias != d.mlp_bias) j["mlp_bias"] = f.mlp_bias;
  if (m.sliding_window > 0) j["sliding_window"] = m.sliding_window;
  if (m.rope_theta != 10000.0) j["rope_theta"] = m.rope_theta;
  if (m.norm_eps != 1e-5) j["norm_eps"] = m.norm_eps;
  if (m.mla) {
    j["mla"] = {{"kv_lora_rank", m.mla->kv_lora_rank}, {"qk_nope_head_dim", m.mla->qk_nope_head_dim},
                {"qk_rope_head_dim", m.mla->qk_rope_head_dim}, {"v_head_dim", m.mla->v_head_dim}};
    if (m.mla->q_lora_rank > 0) j["mla"]["q_lora_rank"] = m.mla->q_lora_rank;
  }
  if (m.moe) {
    j["moe"] = {{"experts", m.moe->experts}, {"top_k", m.moe->top_k}, {"expert_ffn_hidden", m.moe->expert_ffn_hidden}};
    if (m.moe->shared_ffn_hidden > 0) j["moe"]["shared_ffn_hidden"] = m.moe->shared_ffn_hidden;
    if (m.moe->dense_layers > 0) j["moe"]["dense_layers"] = m.moe->dense_layers;
    if (m.moe->capacity_factor > 0) j["moe"]["capacity_factor"] = m.moe->capacity_factor;
    if (m.moe->aux_loss_coeff != MoeSpec{}.aux_loss_coeff) j["moe"]["aux_loss_coeff"] = m.moe->aux_loss_coeff;
  }
  return j;
}

ModelSpec gpt_model(const std::string& name, int layers, std::int64_t hidden, int heads, std::int64_t seq, std::int64_t vocab) {
  ModelSpec m;
  m.name = name;
  m.architecture = Architecture::kGpt;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = heads;
  m.ffn_hidden = 4 * hidden;
  m.vocab = vocab;
  m.tied_embeddings = true;
  m.max_seq_len = seq;
  return m;
}

}  // namespace trainplan::costmodel
