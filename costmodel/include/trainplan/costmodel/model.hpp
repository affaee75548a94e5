#pragma once
// ModelSpec: the architecture of a decoder-only transformer (GPT-style or Llama-style, dense or
// mixture-of-experts, with the variations of the Hugging Face families: explicit head size,
// biases, plain or gated MLP, learned or rotary positions, shared experts and leading dense
// layers, multi-head latent attention, sliding-window attention), its parameter counts, and the
// `trainplan/model/v1` JSON document.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "trainplan/costmodel/result.hpp"

namespace trainplan::costmodel {

enum class Architecture {
  kGpt,    // LayerNorm with bias, GELU MLP (ffn_hidden = 4h usually), learned positions, biases.
  kLlama,  // RMSNorm, SwiGLU MLP, rotary positions, grouped-query attention, no biases.
};

// What an architecture implies unless a model says otherwise (architecture_features()).
struct ModelFeatures {
  bool layer_norm = false;         // LayerNorm (weight and bias); false: RMSNorm (weight only)
  bool gated_mlp = true;           // SwiGLU/GeGLU: gate, up and down matrices; false: GELU, up and down
  bool gelu_gate = false;          // a gated MLP's gate activation is GELU (GeGLU, Gemma); false: SiLU (SwiGLU)
  bool learned_positions = false;  // a learned position table of max_seq_len rows; false: rotary
  // ALiBi (Press et al. 2022): a per-head linear bias the attention kernel adds to the scores (MPT,
  // BLOOM, Falcon with alibi): no position table and no rotary op. Only where learned_positions is false.
  bool alibi = false;
  bool qkv_bias = false;           // biases on the Q, K and V projections
  bool o_bias = false;             // bias on the attention output projection
  bool mlp_bias = false;           // biases on the MLP matrices

  friend bool operator==(const ModelFeatures& a, const ModelFeatures& b) {
    return a.layer_norm == b.layer_norm && a.gated_mlp == b.gated_mlp && a.gelu_gate == b.gelu_gate && a.learned_positions == b.learned_positions &&
           a.alibi == b.alibi &&
           a.qkv_bias == b.qkv_bias && a.o_bias == b.o_bias && a.mlp_bias == b.mlp_bias;
  }
  friend bool operator!=(const ModelFeatures& a, const ModelFeatures& b) { return !(a == b); }
};

// gpt: LayerNorm, GELU MLP, learned positions, every bias. llama: none of them.
[[nodiscard]] ModelFeatures architecture_features(Architecture a);

struct MoeSpec {
  int experts = 0;                   // REQUIRES: >= 2 (routed experts)
  int top_k = 0;                     // REQUIRES: 1 <= top_k <= experts
  std::int64_t expert_ffn_hidden = 0;  // hidden size of each expert's MLP
  // Width of the shared experts' MLP that every token passes through beside the routed ones
  // (DeepSeek: n_shared_experts * moe_intermediate_size; Qwen2-MoE: shared_expert_intermediate_size).
  // Default: 0, none.
  std::int64_t shared_ffn_hidden = 0;
  // Leading layers whose MLP is dense, of ffn_hidden (DeepSeek's first_k_dense_replace).
  // Default: 0. REQUIRES: < layers.
  int dense_layers = 0;
  // Tokens an expert takes per micro-batch and rank: ceil(capacity_factor x tokens x top_k /
  // experts) (GShard, Switch Transformer); the assignments past it are dropped (the token keeps
  // its residual). Default: 0, no capacity (dropless, as Mixtral). REQUIRES: >= 0.
  double capacity_factor = 0;
  // Weight of the load-balancing loss experts x sum_e f_e P_e added to the loss (f_e: share of
  // the top-k assignments routed to e, P_e: mean router probability of e). Default: 0.01, Switch
  // Transformer's alpha (Fedus et al. 2021, section 2.2).
  double aux_loss_coeff = 0.01;
};

// Multi-head latent attention (DeepSeek-V2/V3): Q through a low-rank bottleneck (or one plain
// projection), K and V from one compressed latent shared by the heads plus a shared rotary key.
struct MlaSpec {
  std::int64_t q_lora_rank = 0;        // 0: a plain h x heads*qk_head_dim() Q projection (V2-Lite)
  std::int64_t kv_lora_rank = 0;       // REQUIRES: >= 1
  std::int64_t qk_nope_head_dim = 0;   // per head, the part of Q and K without rotary
  std::int64_t qk_rope_head_dim = 0;   // per head, the rotary part (the key's is shared by the heads)
  std::int64_t v_head_dim = 0;

  [[nodiscard]] std::int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// One linear layer of a block, its weight in x out (+ out bias), and how tensor parallelism
// splits it: column-parallel layers split `out`, row-parallel ones `in`, replicated ones neither.
enum class TpSplit { kColumn, kRow, kReplicated };
struct LinearShape {
  const char* name;  // q, k, v, o, q_a, q_b, kv_a, kv_b (the LoRA target names where they apply)
  double in = 0;
  double out = 0;
  bool bias = false;
  TpSplit split = TpSplit::kColumn;
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
  std::optional<MoeSpec> moe;    // every layer's MLP (after moe->dense_layers) is a mixture of experts when set
  // Default: 0, hidden / heads. Set where heads * head size != hidden (Gemma 7B: 16 x 256, h 3072).
  std::int64_t head_size = 0;
  // Default: unset, architecture_features(architecture). Set by documents and configs that
  // differ from their architecture in a feature (Falcon: LayerNorm, GELU MLP and rotary).
  std::optional<ModelFeatures> feature_overrides;
  std::optional<MlaSpec> mla;       // multi-head latent attention instead of Q, K, V, O
  // Keys each query attends to at most (Mistral 7B v0.1: 4096); default 0: the whole sequence.
  std::int64_t sliding_window = 0;
  // Rotary base (Llama 3: 500000) and the norms' epsilon (Llama 2 and 3: 1e-5, transformers'
  // LlamaConfig default 1e-6). They change no count or cost, only the executor's arithmetic, so
  // a checkpoint imported from Hugging Face computes what it computed there. Defaults: 10000, 1e-5.
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;

  [[nodiscard]] std::int64_t head_dim() const { return head_size > 0 ? head_size : hidden / heads; }
  [[nodiscard]] std::int64_t q_dim() const { return head_dim() * heads; }  // Q width (attention output width)
  [[nodiscard]] std::int64_t kv_dim() const { return head_dim() * kv_heads; }
  [[nodiscard]] ModelFeatures features() const { return feature_overrides.value_or(architecture_features(architecture)); }
  // Keys one query of a sequence of seq_len attends to (the non-causal convention): seq_len, or
  // the sliding window when shorter.
  [[nodiscard]] double attended_keys(double seq_len) const {
    return sliding_window > 0 && static_cast<double>(sliding_window) < seq_len ? static_cast<double>(sliding_window) : seq_len;
  }
  // Layers whose MLP is a mixture of experts (0 for a dense model).
  [[nodiscard]] int moe_layers() const { return moe ? layers - moe->dense_layers : 0; }
};

// The attention block's projections in order: Q, K, V, O; with MLA q_a (or plain q), q_b,
// kv_a, kv_b, o. Norms inside MLA (q_a_layernorm, kv_a_layernorm) are in count_parameters.
[[nodiscard]] std::vector<LinearShape> attention_linears(const ModelSpec& model);
// The LoRA target ("q", "k", "v", "o") that adapts an attention projection of attention_linears:
// MLA's q_a and q_b count as "q", kv_a as "k" and kv_b as "v".
[[nodiscard]] const char* lora_target_of(const char* linear_name);
// Weights and biases of the attention projections of one layer.
[[nodiscard]] double attention_linear_params(const ModelSpec& model);
// Weights (no biases) of the attention projections of one layer, i.e. multiplied with each token.
[[nodiscard]] double attention_matmul_params(const ModelSpec& model);
// Weights of one MLP of width ffn: 3 * h * ffn gated, 2 * h * ffn plain.
[[nodiscard]] double mlp_matmul_params(const ModelSpec& model, double ffn);

// Parameter counts (number of parameters, not bytes).
// Per-layer figures are averages over the layers where layers differ (MoE after dense layers).
struct ParameterCounts {
  double embedding = 0;       // token embedding V*h (+ learned positions for GPT)
  double attention = 0;       // per layer: Q, K, V, O projections (+ biases; MLA's norms)
  double norms = 0;           // per layer: the two norms
  double mlp = 0;             // per layer: dense MLP, or all experts + shared experts + router for MoE
  double mlp_active = 0;      // per layer: the MLP parameters one token passes through
  double routed_experts = 0;  // per layer: the routed experts' parameters (split by expert parallelism)
  double router = 0;          // per layer: the router's weights
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

// Parameter tensors of one dense transformer block: the Q, K, V and O weights (Q, K and V one
// tensor where the stack fuses them), the MLP's matrices (3 gated, 2 plain; gate and up one where
// fused), their biases where the model has them, and the two norms' weights (and biases under
// LayerNorm). A Llama block has 9 unfused, 6 fused; a GPT block 16 unfused, 12 fused. What
// per-tensor launches (optimizers, gradient adds) are counted with.
[[nodiscard]] int block_parameter_tensors(const ModelSpec& model, bool fused_qkv, bool fused_gate_up);

// Model FLOPs per token of one training step (forward + backward, no recompute), counting
// matrix multiplies only: 6 * (active matmul parameters) + 12 * L * s * h for attention
// (non-causal convention, Korthikanti 2022 §6 / PaLM App. B); in general the attention term is
// 6 * L * keys * heads * (qk head size + v head size), keys = attended_keys(seq_len).
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
