#include "trainplan/costmodel/hf_config.hpp"

#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "json_reader.hpp"

namespace trainplan::costmodel {

namespace {

using detail::ObjectReader;

constexpr std::int64_t kMaxDim = std::int64_t{1} << 22;
constexpr std::int64_t kMaxCount = std::int64_t{1} << 16;
constexpr std::int64_t kMaxPositions = std::int64_t{1} << 24;

// The name of the model: the file's stem, or the folder's name for ".../<model>/config.json".
std::string model_name(const std::string& file, const nlohmann::json& json) {
  const std::filesystem::path path(file);
  std::string name = path.stem().string();
  if (name == "config") {
    std::error_code ec;  // no exception leaves the library; without a working directory, the path as given
    const std::filesystem::path full = std::filesystem::absolute(path, ec);
    const std::string folder = (ec ? path : full).parent_path().filename().string();
    if (!folder.empty()) name = folder;
  }
  if (name.empty() || name == "config") {
    const auto it = json.find("_name_or_path");
    if (it != json.end() && it->is_string() && !it->get<std::string>().empty()) {
      name = std::filesystem::path(it->get<std::string>()).filename().string();
    }
  }
  return name.empty() ? "hf-model" : name;
}

int count(ObjectReader& r, const std::string& key) { return static_cast<int>(r.integer(key, 1, kMaxCount)); }

// The keys that size every family (under their usual names).
void read_common_sizes(ObjectReader& r, ModelSpec& m) {
  m.hidden = r.integer("hidden_size", 1, kMaxDim);
  m.layers = static_cast<int>(r.integer("num_hidden_layers", 1, 10000));
  m.heads = count(r, "num_attention_heads");
  m.vocab = r.integer("vocab_size", 1, kMaxPositions);
}

// An optional integer key whose default is the config class's (nullopt: the class's None).
std::optional<std::int64_t> optional_dim(ObjectReader& r, const std::string& key, std::optional<std::int64_t> fallback) {
  if (r.has(key)) return r.integer(key, 1, kMaxPositions);
  return r.is_null(key) ? std::nullopt : fallback;
}

// Qwen2/Qwen3 families: sliding windows only with use_sliding_window, and then only on layers
// from max_window_layers on. Only the all-layers case is modelled; a window on some layers is
// ignored, which counts full attention there (an over-estimate of those layers' attention).
std::int64_t qwen_sliding_window(ObjectReader& r) {
  if (!r.optional_boolean("use_sliding_window").value_or(false)) return 0;
  const std::int64_t window = optional_dim(r, "sliding_window", 4096).value_or(0);
  const std::int64_t from = r.optional_integer("max_window_layers", 0, 10000).value_or(28);
  return from == 0 ? window : 0;
}

// Llama and the families that share its block: RMSNorm, rotary positions, gated MLP,
// grouped-query attention; what differs is defaults, biases, head_dim, windows and experts.
ModelSpec read_llama_like(ObjectReader& r, const std::string& type) {
  ModelSpec m;
  m.architecture = Architecture::kLlama;
  read_common_sizes(r, m);
  m.ffn_hidden = r.integer("intermediate_size", 1, kMaxDim);

  // transformers' defaults per family (configuration_<family>.py, 4.53).
  std::optional<std::int64_t> kv_default, head_dim_default;
  bool tied_default = false;
  std::int64_t positions_default = 2048;
  if (type == "mistral" || type == "mixtral") {
    kv_default = 8;
    positions_default = 4096 * 32;
  } else if (type == "qwen2" || type == "qwen3") {
    kv_default = 32;
    positions_default = 32768;
    if (type == "qwen3") head_dim_default = 128;
  } else if (type == "qwen2_moe") {
    kv_default = 16;
    positions_default = 32768;
  } else if (type == "qwen3_moe") {
    kv_default = 4;
    positions_default = 32768;
  } else if (type == "gemma") {
    kv_default = 16;
    head_dim_default = 256;
    tied_default = true;
    positions_default = 8192;
  } else if (type == "phi3") {
    positions_default = 4096;
  }
  m.kv_heads = static_cast<int>(optional_dim(r, "num_key_value_heads", kv_default).value_or(m.heads));
  m.tied_embeddings = r.optional_boolean("tie_word_embeddings").value_or(tied_default);
  m.max_seq_len = optional_dim(r, "max_position_embeddings", positions_default).value_or(positions_default);
  if (auto d = optional_dim(r, "head_dim", head_dim_default)) {
    if (*d * m.heads != m.hidden) m.head_size = *d;  // keep hidden / heads models identical to the presets
  }

  ModelFeatures f = architecture_features(Architecture::kLlama);
  if (type == "llama" || type == "qwen3" || type == "qwen3_moe" || type == "gemma") {
    // LlamaAttention / Qwen3Attention / GemmaAttention: attention_bias on q, k, v and o.
    f.qkv_bias = f.o_bias = r.optional_boolean("attention_bias").value_or(false);
  }
  // The gate's activation: Gemma's hidden_activation (when set) or hidden_act; SiLU elsewhere
  // (transformers' defaults: gelu_pytorch_tanh for gemma, silu for the others).
  const char* act_key = r.has("hidden_activation") ? "hidden_activation" : "hidden_act";
  const std::string act = r.optional_string(act_key).value_or(type == "gemma" ? "gelu_pytorch_tanh" : "silu");
  if (act.rfind("gelu", 0) == 0) {
    f.gelu_gate = true;
  } else if (act != "silu" && act != "swish") {
    r.fail(act_key, "\"" + act + "\" is not supported for a gated MLP (silu or gelu)");
  }
  if (type == "llama") f.mlp_bias = r.optional_boolean("mlp_bias").value_or(false);
  if (type == "qwen2") f.qkv_bias = true;  // Qwen2Attention: bias on q, k, v (not o), always
  if (type == "qwen2_moe") f.qkv_bias = r.optional_boolean("qkv_bias").value_or(true);
  if (f != architecture_features(Architecture::kLlama)) m.feature_overrides = f;

  // The executor's arithmetic (model.hpp): rotary base and the RMSNorm epsilon, transformers'
  // defaults where absent (10000 everywhere; 1e-5 for Mixtral, 1e-6 for the others).
  m.rope_theta = r.optional_number("rope_theta", 1.0, 1e12).value_or(10000.0);
  // transformers 5 writes it inside rope_parameters (configuration_utils.py, RopeParameters).
  if (!r.has("rope_theta") && r.has("rope_parameters") && r.raw("rope_parameters").is_object()) {
    ObjectReader rope = r.object("rope_parameters");
    m.rope_theta = rope.optional_number("rope_theta", 1.0, 1e12).value_or(10000.0);
  }
  m.norm_eps = r.optional_number("rms_norm_eps", 1e-12, 0.1).value_or(type == "mixtral" ? 1e-5 : 1e-6);
  if (type == "mistral") m.sliding_window = optional_dim(r, "sliding_window", 4096).value_or(0);
  if (type == "mixtral" || type == "phi3") m.sliding_window = optional_dim(r, "sliding_window", std::nullopt).value_or(0);
  if (type == "qwen2" || type == "qwen3" || type == "qwen2_moe" || type == "qwen3_moe") {
    m.sliding_window = qwen_sliding_window(r);
  }

  if (type == "mixtral") {
    MoeSpec moe;
    moe.experts = static_cast<int>(r.optional_integer("num_local_experts", 2, kMaxCount).value_or(8));
    moe.top_k = static_cast<int>(r.optional_integer("num_experts_per_tok", 1, moe.experts).value_or(2));
    moe.expert_ffn_hidden = m.ffn_hidden;
    m.moe = moe;
  } else if (type == "qwen2_moe" || type == "qwen3_moe") {
    const bool qwen2 = type == "qwen2_moe";
    MoeSpec moe;
    moe.experts = static_cast<int>(r.optional_integer("num_experts", 2, kMaxCount).value_or(qwen2 ? 60 : 128));
    moe.top_k = static_cast<int>(r.optional_integer("num_experts_per_tok", 1, moe.experts).value_or(qwen2 ? 4 : 8));
    moe.expert_ffn_hidden = r.optional_integer("moe_intermediate_size", 1, kMaxDim).value_or(qwen2 ? 1408 : 768);
    // Qwen2MoeSparseMoeBlock: one shared expert of its own width (its one-unit sigmoid gate,
    // hidden_size weights per layer, is not counted).
    if (qwen2) moe.shared_ffn_hidden = r.optional_integer("shared_expert_intermediate_size", 1, kMaxDim).value_or(5632);
    if (r.optional_integer("decoder_sparse_step", 1, 10000).value_or(1) != 1) {
      r.fail("decoder_sparse_step", "only 1 is supported (every layer a mixture of experts)");
    }
    if (r.has("mlp_only_layers") && !(r.raw("mlp_only_layers").is_array() && r.raw("mlp_only_layers").empty())) {
      r.fail("mlp_only_layers", "dense layers among the experts are not supported (only an empty list)");
    }
    m.moe = moe;
  }
  return m;
}

ModelSpec read_gpt2(ObjectReader& r) {
  ModelSpec m;
  m.architecture = Architecture::kGpt;  // LayerNorm, GELU MLP, learned positions, biases
  m.hidden = r.integer("n_embd", 1, kMaxDim);
  m.layers = static_cast<int>(r.integer("n_layer", 1, 10000));
  m.heads = count(r, "n_head");
  m.vocab = r.integer("vocab_size", 1, kMaxPositions);
  m.kv_heads = m.heads;
  m.max_seq_len = r.optional_integer("n_positions", 1, kMaxPositions).value_or(1024);
  m.ffn_hidden = optional_dim(r, "n_inner", std::nullopt).value_or(4 * m.hidden);  // GPT2MLP: n_inner or 4 * n_embd
  m.tied_embeddings = r.optional_boolean("tie_word_embeddings").value_or(true);  // PretrainedConfig's default
  return m;
}

ModelSpec read_gpt_neox(ObjectReader& r) {
  ModelSpec m;
  m.architecture = Architecture::kGpt;
  read_common_sizes(r, m);
  m.ffn_hidden = r.integer("intermediate_size", 1, kMaxDim);
  m.kv_heads = m.heads;
  m.max_seq_len = r.optional_integer("max_position_embeddings", 1, kMaxPositions).value_or(2048);
  m.tied_embeddings = r.optional_boolean("tie_word_embeddings").value_or(false);
  ModelFeatures f = architecture_features(Architecture::kGpt);
  f.learned_positions = false;  // rotary on rotary_pct of each head
  f.qkv_bias = f.o_bias = r.optional_boolean("attention_bias").value_or(true);
  m.feature_overrides = f;  // GPTNeoXMLP: dense_h_to_4h and dense_4h_to_h with biases, GELU
  return m;
}

ModelSpec read_falcon(ObjectReader& r) {
  ModelSpec m;
  m.architecture = Architecture::kGpt;
  read_common_sizes(r, m);
  m.ffn_hidden = optional_dim(r, "ffn_hidden_size", std::nullopt).value_or(4 * m.hidden);
  // FalconAttention: new_decoder_architecture groups by num_kv_heads; otherwise multi_query
  // (the default) shares one K and V head, or every head has its own.
  const bool new_architecture = r.optional_boolean("new_decoder_architecture").value_or(false);
  const bool multi_query = r.optional_boolean("multi_query").value_or(true);
  const int kv = static_cast<int>(optional_dim(r, "num_kv_heads", std::nullopt).value_or(m.heads));
  m.kv_heads = new_architecture ? kv : (multi_query ? 1 : m.heads);
  m.max_seq_len = r.optional_integer("max_position_embeddings", 1, kMaxPositions).value_or(2048);
  m.tied_embeddings = r.optional_boolean("tie_word_embeddings").value_or(true);  // PretrainedConfig's default
  ModelFeatures f = architecture_features(Architecture::kGpt);
  f.learned_positions = false;  // rotary, or ALiBi with alibi: true (FalconAttention); neither has a table
  f.alibi = r.optional_boolean("alibi").value_or(false);
  f.qkv_bias = f.o_bias = f.mlp_bias = r.optional_boolean("bias").value_or(false);
  m.feature_overrides = f;
  return m;
}

// MPT (MosaicML's training code at 8c8dd48, models/mpt/configuration_mpt.py and
// modeling_mpt.py, as mosaicml/mpt-7b's config.json writes it): d_model, n_layers, n_heads,
// expansion_ratio (the MLP's width over d_model) or ffn_config ffn_hidden_size, vocab_size,
// max_seq_len; no_bias (default false: biases everywhere); attn_config alibi or rope (either turns
// learned_pos_emb off, MPTConfig), attn_type grouped_query_attention with kv_n_heads or
// multiquery_attention; ffn_config ffn_type mptmlp (GELU) or mptglu (gated, GELU unless ffn_act_fn
// names silu); tie_word_embeddings (default true: logits = wte(hidden, True)); norm_type a
// LayerNorm unless it names an RMSNorm.
ModelSpec read_mpt(ObjectReader& r) {
  ModelSpec m;
  m.architecture = Architecture::kGpt;
  m.hidden = r.integer("d_model", 1, kMaxDim);
  m.layers = static_cast<int>(r.integer("n_layers", 1, 10000));
  m.heads = count(r, "n_heads");
  m.vocab = r.integer("vocab_size", 1, kMaxPositions);
  m.max_seq_len = r.optional_integer("max_seq_len", 1, kMaxPositions).value_or(2048);
  const double ratio = r.optional_number("expansion_ratio", 0.01, 1000).value_or(4.0);
  m.ffn_hidden = static_cast<std::int64_t>(std::llround(ratio * static_cast<double>(m.hidden)));
  m.kv_heads = m.heads;
  m.tied_embeddings = r.optional_boolean("tie_word_embeddings").value_or(true);
  ModelFeatures f = architecture_features(Architecture::kGpt);
  const bool bias = !r.optional_boolean("no_bias").value_or(false);
  f.qkv_bias = f.o_bias = f.mlp_bias = bias;
  const std::string norm = r.optional_string("norm_type").value_or("low_precision_layernorm");
  f.layer_norm = norm.find("rmsnorm") == std::string::npos;
  bool rope = false;
  if (r.has("attn_config")) {
    ObjectReader a = r.object("attn_config");
    f.alibi = a.optional_boolean("alibi").value_or(false);
    rope = a.optional_boolean("rope").value_or(false);
    const std::string kind = a.optional_string("attn_type").value_or("multihead_attention");
    if (kind == "grouped_query_attention") {
      m.kv_heads = static_cast<int>(a.integer("kv_n_heads", 1, m.heads));
    } else if (kind == "multiquery_attention") {
      m.kv_heads = 1;
    } else if (kind != "multihead_attention") {
      a.fail("attn_type", "\"" + kind + "\" is not supported (multihead_attention, multiquery_attention, grouped_query_attention)");
    }
  }
  f.learned_positions = !f.alibi && !rope && r.optional_boolean("learned_pos_emb").value_or(true);
  if (r.has("ffn_config")) {
    ObjectReader ffn = r.object("ffn_config");
    const std::string kind = ffn.optional_string("ffn_type").value_or("mptmlp");
    if (kind != "mptmlp" && kind != "mptglu") ffn.fail("ffn_type", "\"" + kind + "\" is not supported (mptmlp, mptglu)");
    if (kind == "mptglu") {
      f.gated_mlp = true;
      std::string act = "gelu";
      if (ffn.has("ffn_act_fn")) act = ffn.object("ffn_act_fn").optional_string("name").value_or("gelu");
      f.gelu_gate = act.find("silu") == std::string::npos;
    }
    if (const auto width = ffn.optional_integer("ffn_hidden_size", 1, kMaxDim)) m.ffn_hidden = *width;
  }
  m.feature_overrides = f;
  return m;
}

ModelSpec read_deepseek(ObjectReader& r, const std::string& type) {
  const bool v3 = type == "deepseek_v3";
  ModelSpec m;
  m.architecture = Architecture::kLlama;
  read_common_sizes(r, m);
  m.ffn_hidden = r.integer("intermediate_size", 1, kMaxDim);
  m.kv_heads = m.heads;  // MLA: every head has its own K and V, decompressed from the latent
  m.max_seq_len = r.optional_integer("max_position_embeddings", 1, kMaxPositions).value_or(v3 ? 4096 : 2048);
  m.tied_embeddings = r.optional_boolean("tie_word_embeddings").value_or(false);
  if (r.optional_boolean("attention_bias").value_or(false)) {
    ModelFeatures f = architecture_features(Architecture::kLlama);
    f.qkv_bias = f.o_bias = true;
    m.feature_overrides = f;
  }
  MlaSpec a;
  // q_lora_rank: null (DeepSeek-V2-Lite) is a plain Q projection; absent is the class default.
  a.q_lora_rank = optional_dim(r, "q_lora_rank", 1536).value_or(0);
  a.kv_lora_rank = r.optional_integer("kv_lora_rank", 1, kMaxDim).value_or(512);
  a.qk_nope_head_dim = r.optional_integer("qk_nope_head_dim", 1, kMaxDim).value_or(128);
  a.qk_rope_head_dim = r.optional_integer("qk_rope_head_dim", 0, kMaxDim).value_or(64);
  a.v_head_dim = r.optional_integer("v_head_dim", 1, kMaxDim).value_or(128);
  m.mla = a;
  // Experts: V3's class defaults to 256 routed experts; V2's to none (a dense model).
  const std::optional<std::int64_t> routed = optional_dim(r, "n_routed_experts", v3 ? std::optional<std::int64_t>(256) : std::nullopt);
  if (routed) {
    MoeSpec moe;
    if (*routed < 2) r.fail("n_routed_experts", "must be >= 2");
    moe.experts = static_cast<int>(*routed);
    const std::optional<std::int64_t> top_k = optional_dim(r, "num_experts_per_tok", v3 ? std::optional<std::int64_t>(8) : std::nullopt);
    if (!top_k) r.fail("num_experts_per_tok", "is required with n_routed_experts");
    if (*top_k > moe.experts) r.fail("num_experts_per_tok", "must be <= n_routed_experts (" + std::to_string(moe.experts) + ")");
    moe.top_k = static_cast<int>(*top_k);
    moe.expert_ffn_hidden = r.optional_integer("moe_intermediate_size", 1, kMaxDim).value_or(v3 ? 2048 : 1407);
    // DeepseekV2MoE / DeepseekV3MoE: the shared experts are one MLP n_shared_experts times as wide.
    const std::int64_t shared = optional_dim(r, "n_shared_experts", v3 ? std::optional<std::int64_t>(1) : std::nullopt).value_or(0);
    moe.shared_ffn_hidden = shared * moe.expert_ffn_hidden;
    moe.dense_layers = static_cast<int>(r.optional_integer("first_k_dense_replace", 0, m.layers - 1).value_or(v3 ? 3 : 0));
    if (r.optional_integer("moe_layer_freq", 1, 10000).value_or(1) != 1) {
      r.fail("moe_layer_freq", "only 1 is supported (every layer after first_k_dense_replace a mixture of experts)");
    }
    m.moe = moe;
  }
  return m;
}

}  // namespace

const char* hf_model_types() {
  return "llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma, gpt2, gpt_neox, falcon, mpt, phi3, deepseek_v2, "
         "deepseek_v3";
}

bool is_hf_config(const nlohmann::json& json) {
  // model_type names the architecture; a config.json without it but with the keys every
  // transformers config has is one still, so that its error is the missing model_type, not a
  // missing trainplan schema.
  return json.is_object() && !json.contains("schema") &&
         (json.contains("model_type") || json.contains("architectures") || json.contains("num_hidden_layers"));
}

Result<ModelSpec> parse_hf_config(const nlohmann::json& json, const std::string& file) {
  std::string type;
  try {
    ObjectReader r(json, file, "");
    type = r.string("model_type");
    ModelSpec m;
    if (type == "llama" || type == "mistral" || type == "mixtral" || type == "qwen2" || type == "qwen3" || type == "qwen2_moe" ||
        type == "qwen3_moe" || type == "gemma" || type == "phi3") {
      m = read_llama_like(r, type);
    } else if (type == "gpt2") {
      m = read_gpt2(r);
    } else if (type == "gpt_neox") {
      m = read_gpt_neox(r);
    } else if (type == "falcon") {
      m = read_falcon(r);
    } else if (type == "mpt") {
      m = read_mpt(r);
    } else if (type == "deepseek_v2" || type == "deepseek_v3") {
      m = read_deepseek(r, type);
    } else {
      const std::string value = type;
      type.clear();  // the message names it already
      r.fail("model_type", "\"" + value + "\" is not supported (supported: " + hf_model_types() + ")");
    }
    if (m.kv_heads < 1 || m.heads % m.kv_heads != 0) {
      r.fail("num_key_value_heads", "(" + std::to_string(m.kv_heads) + ") must divide num_attention_heads (" + std::to_string(m.heads) + ")");
    }
    if (m.head_size == 0 && !m.mla && m.hidden % m.heads != 0) {
      r.fail("num_attention_heads", "(" + std::to_string(m.heads) + ") must divide the hidden size (" + std::to_string(m.hidden) + ")");
    }
    m.name = model_name(file, json);
    m.source = "Hugging Face config.json " + std::filesystem::path(file).filename().string() + " (model_type " + type + ")";
    return m;
  } catch (const detail::DocumentError& e) {
    return Error{std::string(e.what()) + (type.empty() ? "" : " (model_type " + type + ")")};
  }
}

Result<ModelSpec> parse_model_or_hf_config_text(const std::string& text, const std::string& file) {
  try {
    const nlohmann::json json = detail::parse_json(text, file);
    return is_hf_config(json) ? parse_hf_config(json, file) : parse_model(json, file);
  } catch (const detail::DocumentError& e) {
    return Error{e.what()};
  }
}

}  // namespace trainplan::costmodel
