#include "trainplan/costmodel/model.hpp"

#include <nlohmann/json.hpp>

#include "json_reader.hpp"

namespace trainplan::costmodel {

const char* architecture_name(Architecture a) { return a == Architecture::kGpt ? "gpt" : "llama"; }

ParameterCounts count_parameters(const ModelSpec& m) {
  const double h = static_cast<double>(m.hidden);
  const double kv = static_cast<double>(m.kv_dim());
  const double f = static_cast<double>(m.ffn_hidden);
  const bool gpt = m.architecture == Architecture::kGpt;
  ParameterCounts c;
  c.embedding = static_cast<double>(m.vocab) * h + (gpt ? static_cast<double>(m.max_seq_len) * h : 0.0);
  // Q and O are h x h; K and V are h x kv_dim. GPT adds biases on all four.
  c.attention = 2 * h * h + 2 * h * kv + (gpt ? (h + 2 * kv + h) : 0.0);
  // LayerNorm has weight and bias; RMSNorm only a weight.
  c.norms = gpt ? 4 * h : 2 * h;
  auto mlp_params = [&](double ffn) {
    // GELU MLP: two matrices with biases. SwiGLU: gate, up and down matrices, no biases.
    return gpt ? (2 * h * ffn + ffn + h) : 3 * h * ffn;
  };
  if (m.moe) {
    const double expert = mlp_params(static_cast<double>(m.moe->expert_ffn_hidden));
    const double router = h * m.moe->experts;
    c.mlp = m.moe->experts * expert + router;
    c.mlp_active = m.moe->top_k * expert + router;
  } else {
    c.mlp = mlp_params(f);
    c.mlp_active = c.mlp;
  }
  c.final_norm = gpt ? 2 * h : h;
  c.output = m.tied_embeddings ? 0.0 : static_cast<double>(m.vocab) * h;
  return c;
}

double model_flops_per_token(const ModelSpec& m, std::int64_t seq_len) {
  const ParameterCounts c = count_parameters(m);
  const double h = static_cast<double>(m.hidden);
  // Matmul parameters a token passes through: every layer's projections and MLP, plus the
  // output layer (the embedding lookup is not a matmul; tied weights are still multiplied).
  const double matmul_params = m.layers * (c.attention + c.mlp_active - (m.moe ? h * m.moe->experts : 0.0)) +
                               static_cast<double>(m.vocab) * h;
  const double attention = 12.0 * m.layers * static_cast<double>(seq_len) * h;
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
    if (m.hidden % m.heads != 0) r.fail("hidden", "must be divisible by heads (" + std::to_string(m.heads) + ")");
    if (m.heads % m.kv_heads != 0) r.fail("kv_heads", "must divide heads (" + std::to_string(m.heads) + ")");
    if (r.has("moe")) {
      detail::ObjectReader moe = r.object("moe");
      MoeSpec spec;
      spec.experts = static_cast<int>(moe.integer("experts", 2, 1 << 16));
      spec.top_k = static_cast<int>(moe.integer("top_k", 1, spec.experts));
      spec.expert_ffn_hidden = moe.optional_integer("expert_ffn_hidden", 1, 1 << 22).value_or(m.ffn_hidden);
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
  if (m.moe) {
    j["moe"] = {{"experts", m.moe->experts}, {"top_k", m.moe->top_k}, {"expert_ffn_hidden", m.moe->expert_ffn_hidden}};
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
