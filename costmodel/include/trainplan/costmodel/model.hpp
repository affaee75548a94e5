#pragma once
// ModelSpec: the architecture of a decoder-only transformer (GPT-style or Llama-style, dense or
// mixture-of-experts), its parameter counts, and the `trainplan/model/v1` JSON document.

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "trainplan/costmodel/result.hpp"

namespace trainplan::costmodel {

enum class Architecture {
  kGpt,    // LayerNorm with bias, GELU MLP (ffn_hidden = 4h usually), learned positions, biases.
  kLlama,  // RMSNorm, SwiGLU MLP, rotary positions, grouped-query attention, no biases.
};

struct MoeSpec {
  int experts = 0;                   // REQUIRES: >= 2
  int top_k = 0;                     // REQUIRES: 1 <= top_k <= experts
  std::int64_t expert_ffn_hidden = 0;  // hidden size of each expert's MLP
};

struct ModelSpec {
  std::string name;
  std::string source;        // where the architecture numbers come from
  Architecture architecture = Architecture::kLlama;
  int layers = 0;
  std::int64_t hidden = 0;
  int heads = 0;
  int kv_heads = 0;          // == heads without grouped-query attention
  std::int64_t ffn_hidden = 0;
  std::int64_t vocab = 0;
  bool tied_embeddings = false;
  std::int64_t max_seq_len = 0;  // context length; GPT's learned position table has this many rows
  std::optional<MoeSpec> moe;    // every layer's MLP is a mixture of experts when set

  [[nodiscard]] std::int64_t head_dim() const { return hidden / heads; }
  [[nodiscard]] std::int64_t kv_dim() const { return head_dim() * kv_heads; }
};

// Parameter counts (number of parameters, not bytes).
struct ParameterCounts {
  double embedding = 0;       // token embedding V*h (+ learned positions for GPT)
  double attention = 0;       // per layer: Q, K, V, O projections (+ biases)
  double norms = 0;           // per layer: the two norms
  double mlp = 0;             // per layer: dense MLP, or all experts + router for MoE
  double mlp_active = 0;      // per layer: the MLP parameters one token passes through
  double final_norm = 0;
  double output = 0;          // output projection V*h; 0 when tied to the embedding

  [[nodiscard]] double per_layer() const { return attention + norms + mlp; }
  [[nodiscard]] double total(int layers) const {
    return embedding + layers * per_layer() + final_norm + output;
  }
  // Parameters that one token's forward pass multiplies with (MoE: top_k experts).
  [[nodiscard]] double active(int layers) const {
    return embedding + layers * (attention + norms + mlp_active) + final_norm + output;
  }
};

[[nodiscard]] ParameterCounts count_parameters(const ModelSpec& model);

// Model FLOPs per token of one training step (forward + backward, no recompute), counting
// matrix multiplies only: 6 * (active matmul parameters) + 12 * L * s * h for attention
// (non-causal convention, Korthikanti 2022 §6 / PaLM App. B).
[[nodiscard]] double model_flops_per_token(const ModelSpec& model, std::int64_t seq_len);

// A GPT-style model as in Megatron-LM's experiments (Narayanan 2021, Korthikanti 2022): multi-head
// attention (kv_heads = heads), ffn 4h, tied embeddings, vocabulary 51200 unless given.
[[nodiscard]] ModelSpec gpt_model(const std::string& name, int layers, std::int64_t hidden, int heads, std::int64_t seq,
                                  std::int64_t vocab = 51200);

// Parses a `trainplan/model/v1` document. `file` names the source in error messages.
[[nodiscard]] Result<ModelSpec> parse_model(const nlohmann::json& json, const std::string& file,
                                            const std::string& pointer = "");
[[nodiscard]] Result<ModelSpec> parse_model_text(const std::string& text, const std::string& file);
[[nodiscard]] nlohmann::json model_to_json(const ModelSpec& model);

[[nodiscard]] const char* architecture_name(Architecture a);

}  // namespace trainplan::costmodel
