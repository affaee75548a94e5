// Models from Hugging Face config.json files (tests/data/hf, transcribed from the published
// configs; tests/data/hf/README.md cites each): parameter counts against the published totals,
// the keys each family reads and their transformers defaults, one-line errors, the model/v1
// round trip of the new keys, and the cost model's consistency (an HF Llama 3.1 8B config plans
// exactly like the built-in llama3-8b preset; the layer FLOPs agree with model_flops_per_token).

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_support.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/hf_config.hpp"
#include "trainplan/costmodel/model.hpp"
#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/presets.hpp"

namespace trainplan {
namespace {

using namespace costmodel;
namespace fs = std::filesystem;

std::string hf_path(const std::string& name) { return testing::data_path("hf/" + name + ".json"); }

ModelSpec hf_model(const std::string& name) {
  auto m = find_model(hf_path(name));
  if (!m) throw std::runtime_error(m.error().message);
  return *m;
}

// The error parse_hf_config gives for a JSON text ("" when it parses).
std::string hf_error(const std::string& text, const std::string& file = "config.json") {
  auto m = parse_hf_config(nlohmann::json::parse(text), file);
  return m ? "" : m.error().message;
}

struct PublishedCount {
  const char* file;
  double published;  // total parameters as published
  double rounding;   // half a unit of the published figure's last digit: the tolerance
  const char* source;
};

// Every figure rounds our exact count to the published precision; the exact counts are in the
// comments (the arithmetic of model_test.cpp's header, with each family's shapes).
const PublishedCount kTotals[] = {
    // 32 * (41,943,040 + 176,160,768 + 8,192) + 2 * 525,336,576 + 4,096 = 8,030,261,248
    {"llama-3.1-8b", 8.03e9, 0.005e9, "huggingface.co/meta-llama/Llama-3.1-8B: 8.03B params"},
    // 80 * (150,994,944 + 704,643,072 + 16,384) + 2 * 1,050,673,152 + 8,192 = 70,553,706,496
    {"llama-3.1-70b", 70.6e9, 0.05e9, "huggingface.co/meta-llama/Llama-3.1-70B: 70.6B params"},
    // 32 * (41,943,040 + 8 * 176,160,768 + 32,768 + 8,192) + 2 * 131,072,000 + 4,096 = 46,702,792,704
    {"mixtral-8x7b-v0.1", 46.7e9, 0.05e9, "mistral.ai/news/mixtral-of-experts: 46.7B total parameters"},
    // 32 * (41,943,040 + 176,160,768 + 8,192) + 2 * 131,072,000 + 4,096 = 7,241,732,096
    {"mistral-7b-v0.1", 7.24e9, 0.005e9, "huggingface.co/mistralai/Mistral-7B-v0.1: 7.24B params"},
    // 28 * (29,365,248 + 4,608 qkv bias + 203,685,888 + 7,168) + 2 * 544,997,376 + 3,584 = 7,615,616,512
    {"qwen2-7b", 7.62e9, 0.005e9, "huggingface.co/Qwen/Qwen2-7B: 7.62B params"},
    // 36 * (41,943,040 + 150,994,944 + 8,192) + 2 * 622,329,856 + 4,096 = 8,190,726,144
    {"qwen3-8b", 8.2e9, 0.05e9, "huggingface.co/Qwen/Qwen3-8B model card: 8.2B parameters"},
    // 28 * (50,331,648 + 226,492,416 + 6,144) + 786,432,000 (tied) + 3,072 = 8,537,680,896
    {"gemma-7b", 8.54e9, 0.005e9, "Gemma Team 2024 (arXiv:2403.08295), Table 2: 786M embedding + 7,751M non-embedding"},
    // 48 * (4h^2 + 4h + 8h^2 + 5h + 4h) + (50,257 + 1,024) h + 2h, h = 1,600 = 1,557,611,200
    {"gpt2-xl", 1.56e9, 0.005e9, "huggingface.co/openai-community/gpt2-xl (1.5B); 1,557.6M by hand, as the gpt2-1.5b preset"},
    // 44 * (151,019,520 + 302,020,608 + 24,576) + 2 * 309,854,208 + 12,288 = 20,554,567,680
    {"gpt-neox-20b", 20.6e9, 0.05e9, "Black et al. 2022 (GPT-NeoX-20B), Table 1: 20,554,567,680 parameters"},
    // 32 * (41,877,504 + 165,183,488 + 18,176) + 295,469,056 (tied) + 9,088 = 6,922,011,520; the
    // hub's 7.22B counts the lm_head stored beside the tied embedding (checked below)
    {"falcon-7b", 6.92e9, 0.005e9, "huggingface.co/tiiuae/falcon-7b: 7B (7.22B stored, 6.92B without the stored lm_head copy)"},
    // 32 * (37,748,736 + 75,497,472 + 6,144) + 2 * 98,500,608 + 3,072 = 3,821,079,552
    {"phi-3-mini-4k-instruct", 3.82e9, 0.005e9, "huggingface.co/microsoft/Phi-3-mini-4k-instruct: 3.82B params (card: 3.8B)"},
    // 61 MLA layers (187,107,328 + 14,336) + 3 dense MLPs 396,361,728 + 58 MoE MLPs (256 + 1) * 44,040,192
    // + 1,835,008 router + 2 * 926,679,040 + 7,168 = 671,026,404,352 (the 14B MTP module not included)
    {"deepseek-v3", 671e9, 0.5e9, "DeepSeek-AI 2024 (DeepSeek-V3, arXiv:2412.19437), Abstract: 671B total"},
    // 27 MLA layers + 1 dense MLP + 26 MoE MLPs of 64 routed + 2 shared experts = 15,706,484,224
    {"deepseek-v2-lite", 15.7e9, 0.05e9, "huggingface.co/deepseek-ai/DeepSeek-V2-Lite model card: 15.7B total"},
    // 24 * (16,783,360 + 60 * 8,650,752 + 34,603,008 + 122,880 + 4,096) + 2 * 311,164,928 + 2,048 = 14,315,735,040
    {"qwen1.5-moe-a2.7b", 14.3e9, 0.05e9, "huggingface.co/Qwen/Qwen1.5-MoE-A2.7B model card: 14.3B total"},
};

TEST(HfConfig, ParameterCountsMatchThePublishedTotals) {
  for (const PublishedCount& c : kTotals) {
    const ModelSpec m = hf_model(c.file);
    const double total = count_parameters(m).total(m.layers);
    EXPECT_NEAR(total, c.published, c.rounding) << c.file << " vs " << c.source;
  }
}

// Exact counts where the source gives one, and the hand counts above to the parameter.
TEST(HfConfig, ParameterCountsAreExactWhereTheSourceIsExact) {
  EXPECT_DOUBLE_EQ(count_parameters(hf_model("gpt-neox-20b")).total(44), 20554567680.0);  // Black et al. 2022, Table 1
  const ModelSpec gemma = hf_model("gemma-7b");
  const ParameterCounts g = count_parameters(gemma);
  EXPECT_DOUBLE_EQ(g.embedding, 786432000.0);                                      // Gemma Team 2024, Table 2
  EXPECT_DOUBLE_EQ(g.total(gemma.layers) - g.embedding, 7751248896.0);             // Table 2: non-embedding
  const ModelSpec qwen3 = hf_model("qwen3-8b");
  const ParameterCounts q = count_parameters(qwen3);
  // Qwen3-8B model card: "Number of Parameters (Non-Embedding): 6.95B"
  EXPECT_NEAR(q.total(qwen3.layers) - q.embedding - q.output, 6.95e9, 0.005e9);
  EXPECT_DOUBLE_EQ(count_parameters(hf_model("deepseek-v3")).total(61), 671026404352.0);
  EXPECT_DOUBLE_EQ(count_parameters(hf_model("deepseek-v2-lite")).total(27), 15706484224.0);
  EXPECT_DOUBLE_EQ(count_parameters(hf_model("qwen1.5-moe-a2.7b")).total(24), 14315735040.0);
  // Falcon-7B: the hub's 7.22B is the tied model plus the lm_head copy its checkpoint stores.
  const ModelSpec falcon = hf_model("falcon-7b");
  EXPECT_NEAR(count_parameters(falcon).total(falcon.layers) + 65024.0 * 4544, 7.22e9, 0.005e9);
}

// Active parameters per token. Mixtral counts the embedding (46.7B / 12.9B, Mistral AI's
// announcement); DeepSeek counts what a token multiplies with, without the embedding
// lookup: V3 37B (arXiv:2412.19437), V2-Lite 2.4B (model card); Qwen1.5-MoE-A2.7B's 2.7B
// (model card) counts it. DeepSeek's figures have two significant digits; V2-Lite's 2.45B
// is just past 2.4's rounding, so those two are checked to 2.5%.
TEST(HfConfig, ActiveParametersOfTheMixturesOfExperts) {
  const struct { const char* file; bool with_embedding; double published; double tolerance; } cases[] = {
      {"mixtral-8x7b-v0.1", true, 12.9e9, 0.05e9},
      {"deepseek-v3", false, 37e9, 0.025 * 37e9},
      {"deepseek-v2-lite", false, 2.4e9, 0.025 * 2.4e9},
      {"qwen1.5-moe-a2.7b", true, 2.7e9, 0.05e9},
  };
  for (const auto& c : cases) {
    const ModelSpec m = hf_model(c.file);
    const ParameterCounts p = count_parameters(m);
    const double active = p.active(m.layers) - (c.with_embedding ? 0.0 : p.embedding);
    EXPECT_NEAR(active, c.published, c.tolerance) << c.file;
    EXPECT_LT(p.active(m.layers), 0.3 * p.total(m.layers)) << c.file;
  }
}

// transformers 5 saves the rotary base inside rope_parameters (RopeParameters), 4.x at the top: both
// read, the top-level key first; neither leaves transformers' default, 10000.
TEST(HfConfig, RotaryBaseAtTheTopOrInRopeParameters) {
  nlohmann::json config = nlohmann::json::parse(
      R"({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
          "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192})");
  EXPECT_DOUBLE_EQ(parse_hf_config(config, "c.json")->rope_theta, 10000.0);
  config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  EXPECT_DOUBLE_EQ(parse_hf_config(config, "c.json")->rope_theta, 500000.0);
  config["rope_theta"] = 250000.0;
  EXPECT_DOUBLE_EQ(parse_hf_config(config, "c.json")->rope_theta, 250000.0);
}

TEST(HfConfig, ReadsEachFamilysKeys) {
  const ModelSpec llama = hf_model("llama-3.1-8b");
  EXPECT_EQ(llama.name, "llama-3.1-8b");
  EXPECT_EQ(llama.architecture, Architecture::kLlama);
  EXPECT_EQ(llama.kv_heads, 8);
  EXPECT_EQ(llama.max_seq_len, 131072);
  EXPECT_FALSE(llama.feature_overrides.has_value());
  EXPECT_EQ(llama.head_size, 0);
  EXPECT_DOUBLE_EQ(llama.rope_theta, 500000.0);  // the executor's arithmetic: rotary base and norm epsilon
  EXPECT_DOUBLE_EQ(llama.norm_eps, 1e-5);
  EXPECT_EQ(costmodel::model_to_json(llama).at("rope_theta"), 500000.0);

  const ModelSpec gemma = hf_model("gemma-7b");
  EXPECT_EQ(gemma.head_dim(), 256);
  EXPECT_EQ(gemma.q_dim(), 4096);  // 16 heads x 256 != hidden 3072
  EXPECT_TRUE(gemma.tied_embeddings);
  EXPECT_TRUE(gemma.features().gated_mlp);
  EXPECT_TRUE(gemma.features().gelu_gate);  // GemmaMLP: hidden_act "gelu", a GeGLU
  EXPECT_FALSE(llama.features().gelu_gate);  // LlamaMLP: silu, a SwiGLU
  EXPECT_EQ(costmodel::model_to_json(gemma).at("mlp"), "geglu");

  const ModelSpec qwen2 = hf_model("qwen2-7b");
  EXPECT_TRUE(qwen2.features().qkv_bias);
  EXPECT_FALSE(qwen2.features().o_bias);
  EXPECT_EQ(qwen2.sliding_window, 0);  // use_sliding_window: false

  const ModelSpec mistral = hf_model("mistral-7b-v0.1");
  EXPECT_EQ(mistral.sliding_window, 4096);
  EXPECT_EQ(hf_model("phi-3-mini-4k-instruct").sliding_window, 2047);
  EXPECT_EQ(hf_model("mixtral-8x7b-v0.1").sliding_window, 0);  // null

  const ModelSpec falcon = hf_model("falcon-7b");
  EXPECT_EQ(falcon.kv_heads, 1);  // multi_query
  EXPECT_TRUE(falcon.features().layer_norm);
  EXPECT_FALSE(falcon.features().gated_mlp);
  EXPECT_FALSE(falcon.features().learned_positions);
  EXPECT_FALSE(falcon.features().qkv_bias);
  EXPECT_TRUE(falcon.tied_embeddings);

  // MPT: GELU MLP of expansion_ratio x d_model, no biases anywhere (no_bias), ALiBi instead of the
  // learned table (attn_config alibi), the output layer tied to the embedding.
  const ModelSpec mpt = hf_model("mpt-7b");
  EXPECT_EQ(mpt.ffn_hidden, 16384);
  EXPECT_EQ(mpt.kv_heads, 32);
  EXPECT_TRUE(mpt.features().layer_norm);
  EXPECT_FALSE(mpt.features().gated_mlp);
  EXPECT_TRUE(mpt.features().alibi);
  EXPECT_FALSE(mpt.features().learned_positions);
  EXPECT_FALSE(mpt.features().qkv_bias || mpt.features().o_bias || mpt.features().mlp_bias);
  EXPECT_TRUE(mpt.tied_embeddings);
  EXPECT_EQ(mpt.max_seq_len, 2048);
  // 32 * (4 x 4096^2 + 2 x 4096 x 16384 + 2 x 4096) + 50,432 x 4096 (tied) + 4096 = 6,649,286,656
  // (the model card's "6.7B"), and the LayerNorms' biases the cost model counts for every LayerNorm
  // though MPT's no_bias removes them: 33 x 4096 + 32 x 4096 more.
  EXPECT_EQ(count_parameters(mpt).total(mpt.layers), 6649286656.0 + 65.0 * 4096);

  const ModelSpec neox = hf_model("gpt-neox-20b");
  EXPECT_TRUE(neox.features().layer_norm && neox.features().qkv_bias && neox.features().mlp_bias);
  EXPECT_FALSE(neox.features().learned_positions);
  EXPECT_FALSE(neox.tied_embeddings);

  const ModelSpec gpt2 = hf_model("gpt2-xl");
  EXPECT_EQ(gpt2.architecture, Architecture::kGpt);
  EXPECT_EQ(gpt2.ffn_hidden, 6400);
  EXPECT_EQ(gpt2.max_seq_len, 1024);

  const ModelSpec lite = hf_model("deepseek-v2-lite");
  ASSERT_TRUE(lite.mla && lite.moe);
  EXPECT_EQ(lite.mla->q_lora_rank, 0);  // null: a plain Q projection
  EXPECT_EQ(lite.mla->kv_lora_rank, 512);
  EXPECT_EQ(lite.mla->qk_head_dim(), 192);
  EXPECT_EQ(lite.moe->experts, 64);
  EXPECT_EQ(lite.moe->top_k, 6);
  EXPECT_EQ(lite.moe->shared_ffn_hidden, 2 * 1408);
  EXPECT_EQ(lite.moe->dense_layers, 1);
  EXPECT_EQ(lite.moe_layers(), 26);

  const ModelSpec v3 = hf_model("deepseek-v3");
  ASSERT_TRUE(v3.mla && v3.moe);
  EXPECT_EQ(v3.mla->q_lora_rank, 1536);
  EXPECT_EQ(v3.moe->dense_layers, 3);
  EXPECT_EQ(v3.moe->shared_ffn_hidden, 2048);
}

// Absent keys take the transformers config class's default (configuration_<family>.py).
// ALiBi is a bias inside the attention kernel: the layer runs no rotary op (Llama 3 8B's rotary
// embedding on q and k, eager: its kernels' time and launches), and nothing else changes.
TEST(HfConfig, AlibiRunsNoPositionOp) {
  const HardwareProfile hw = testing::cluster("dgx-h100");
  ModelSpec rotary = testing::model("llama3-8b");
  ModelSpec alibi = rotary;
  ModelFeatures f = alibi.features();
  f.alibi = true;
  alibi.feature_overrides = f;
  LayerSetting s;
  s.stack = Stack::kPytorchEager;
  s.seq_len = 4096;
  const LayerCost a = transformer_layer_cost(alibi, hw, s), r = transformer_layer_cost(rotary, hw, s);
  EXPECT_LT(a.forward, r.forward);
  EXPECT_LT(a.kernels, r.kernels);
  EXPECT_EQ(a.model_flops, r.model_flops);
  EXPECT_EQ(count_parameters(alibi).total(32), count_parameters(rotary).total(32));
}

TEST(HfConfig, AbsentKeysTakeTheTransformersDefaults) {
  const auto read = [](const std::string& text) {
    auto m = parse_hf_config(nlohmann::json::parse(text), "config.json");
    if (!m) throw std::runtime_error(m.error().message);
    return *m;
  };
  const std::string sizes = R"("hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 32, "intermediate_size": 11008, "vocab_size": 32000)";
  const ModelSpec llama = read(R"({"model_type": "llama", )" + sizes + "}");
  // MPTConfig (MosaicML's models/mpt/configuration_mpt.py): no_bias=False, learned_pos_emb=True unless alibi
  // or rope, expansion_ratio 4, ffn_type mptmlp; mptglu gated by ffn_act_fn (GELU by default),
  // ffn_hidden_size over the ratio, tie_word_embeddings=True.
  const std::string mpt_sizes = R"("model_type": "mpt", "d_model": 1024, "n_layers": 2, "n_heads": 16, "vocab_size": 50432)";
  const ModelSpec mpt = read("{" + mpt_sizes + "}");
  EXPECT_TRUE(mpt.features().qkv_bias && mpt.features().o_bias && mpt.features().mlp_bias);
  EXPECT_TRUE(mpt.features().learned_positions);
  EXPECT_EQ(mpt.ffn_hidden, 4096);
  EXPECT_TRUE(mpt.tied_embeddings);
  const ModelSpec roped = read("{" + mpt_sizes + R"(, "attn_config": {"rope": true}, "tie_word_embeddings": false,
      "ffn_config": {"ffn_type": "mptglu", "ffn_act_fn": {"name": "silu"}, "ffn_hidden_size": 2816}})");
  EXPECT_FALSE(roped.features().learned_positions || roped.features().alibi);  // rotary
  EXPECT_TRUE(roped.features().gated_mlp);
  EXPECT_FALSE(roped.features().gelu_gate);  // SwiGLU
  EXPECT_EQ(roped.ffn_hidden, 2816);
  EXPECT_FALSE(roped.tied_embeddings);
  EXPECT_TRUE(read("{" + mpt_sizes + R"(, "ffn_config": {"ffn_type": "mptglu"}})").features().gelu_gate);
  EXPECT_EQ(read("{" + mpt_sizes + R"(, "attn_config": {"attn_type": "grouped_query_attention", "kv_n_heads": 4}})").kv_heads, 4);
  EXPECT_EQ(llama.kv_heads, 32);         // num_key_value_heads None -> num_attention_heads
  EXPECT_FALSE(llama.tied_embeddings);   // tie_word_embeddings=False
  EXPECT_EQ(llama.max_seq_len, 2048);    // max_position_embeddings=2048
  EXPECT_DOUBLE_EQ(llama.rope_theta, 10000.0);  // rope_theta=10000.0
  EXPECT_DOUBLE_EQ(llama.norm_eps, 1e-6);       // rms_norm_eps=1e-6
  EXPECT_DOUBLE_EQ(read(R"({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2, )" + sizes + "}").norm_eps, 1e-5);  // MixtralConfig: 1e-5
  const ModelSpec mistral = read(R"({"model_type": "mistral", )" + sizes + "}");
  EXPECT_EQ(mistral.kv_heads, 8);              // num_key_value_heads=8
  EXPECT_EQ(mistral.sliding_window, 4096);     // sliding_window=4096
  EXPECT_EQ(mistral.max_seq_len, 4096 * 32);
  EXPECT_EQ(read(R"({"model_type": "mistral", "sliding_window": null, )" + sizes + "}").sliding_window, 0);
  const ModelSpec gemma = read(R"({"model_type": "gemma", "num_key_value_heads": 32, )" + sizes + "}");
  EXPECT_TRUE(gemma.tied_embeddings);  // tie_word_embeddings=True
  EXPECT_EQ(gemma.head_dim(), 256);    // head_dim=256
  const ModelSpec falcon = read(R"({"model_type": "falcon", "hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 32, "vocab_size": 65024})");
  EXPECT_EQ(falcon.kv_heads, 1);              // multi_query=True
  EXPECT_EQ(falcon.ffn_hidden, 4 * 4096);     // ffn_hidden_size None -> 4 * hidden_size
  EXPECT_TRUE(falcon.tied_embeddings);
  const ModelSpec falcon40 = read(R"({"model_type": "falcon", "new_decoder_architecture": true, "num_kv_heads": 8, "hidden_size": 8192, "num_hidden_layers": 2, "num_attention_heads": 128, "vocab_size": 65024})");
  EXPECT_EQ(falcon40.kv_heads, 8);
  const ModelSpec gpt2 = read(R"({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257})");
  EXPECT_EQ(gpt2.ffn_hidden, 3072);  // n_inner None -> 4 * n_embd
  EXPECT_EQ(gpt2.max_seq_len, 1024);
  EXPECT_TRUE(gpt2.tied_embeddings);
  const ModelSpec v3 = read(R"({"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128, "intermediate_size": 18432, "vocab_size": 129280})");
  ASSERT_TRUE(v3.mla && v3.moe);
  EXPECT_EQ(v3.mla->q_lora_rank, 1536);
  EXPECT_EQ(v3.moe->experts, 256);
  EXPECT_EQ(v3.moe->top_k, 8);
  EXPECT_EQ(v3.moe->dense_layers, 3);
  const ModelSpec v2 = read(R"({"model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 16, "intermediate_size": 10944, "vocab_size": 102400})");
  EXPECT_FALSE(v2.moe.has_value());  // n_routed_experts=None: dense
}

TEST(HfConfig, ErrorsAreOneLineNamingTheKey) {
  const struct { const char* what; std::string text; std::vector<std::string> fragments; } cases[] = {
      {"unknown model_type", R"({"model_type": "bert", "hidden_size": 768})",
       {"config.json: /model_type: \"bert\" is not supported", "supported: llama, mistral, mixtral", "deepseek_v3"}},
      {"missing key", R"({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 32, "intermediate_size": 11008, "vocab_size": 32000})",
       {"config.json: /hidden_size: is required (model_type llama)"}},
      {"missing gpt2 key", R"({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "vocab_size": 50257})",
       {"config.json: /n_layer: is required (model_type gpt2)"}},
      {"wrong type", R"({"model_type": "qwen2", "hidden_size": "3584", "num_hidden_layers": 2, "num_attention_heads": 28, "intermediate_size": 18944, "vocab_size": 152064})",
       {"config.json: /hidden_size: must be an integer", "(model_type qwen2)"}},
      {"wrong boolean", R"({"model_type": "llama", "tie_word_embeddings": "yes", "hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 32, "intermediate_size": 11008, "vocab_size": 32000})",
       {"config.json: /tie_word_embeddings: must be true or false (model_type llama)"}},
      {"kv heads", R"({"model_type": "llama", "num_key_value_heads": 5, "hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 32, "intermediate_size": 11008, "vocab_size": 32000})",
       {"/num_key_value_heads: (5) must divide num_attention_heads (32)"}},
      {"model_type missing", R"({"model_type": null, "hidden_size": 4096})", {"config.json: /model_type: must be a string"}},
  };
  for (const auto& c : cases) {
    const std::string message = hf_error(c.text);
    ASSERT_FALSE(message.empty()) << c.what;
    for (const auto& f : c.fragments) EXPECT_NE(message.find(f), std::string::npos) << c.what << ": \"" << f << "\" not in: " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << c.what << ": " << message;
  }
}

// find_model: an HF config by path, a checkpoint folder holding config.json, and trainplan
// documents still read as before; unknown keys in an HF config are no error.
TEST(HfConfig, FindModelReadsConfigsAndCheckpointFolders) {
  const fs::path dir = fs::temp_directory_path() / "trainplan_hf_test" / "Llama-3.1-8B";
  fs::create_directories(dir);
  fs::copy_file(hf_path("llama-3.1-8b"), dir / "config.json", fs::copy_options::overwrite_existing);
  auto folder = find_model(dir.string());
  ASSERT_TRUE(folder) << folder.error().message;
  EXPECT_EQ(folder->name, "Llama-3.1-8B");
  auto file = find_model((dir / "config.json").string());
  ASSERT_TRUE(file) << file.error().message;
  EXPECT_EQ(file->name, "Llama-3.1-8B");
  EXPECT_EQ(model_to_json(*file), model_to_json(*folder));
  fs::remove_all(dir.parent_path());

  auto missing = find_model((fs::temp_directory_path() / "trainplan_no_such_model" / "config.json").string());
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("cannot open"), std::string::npos);
  // A trainplan document with a typo is still rejected (it has a schema, so it is no HF config).
  auto strict = parse_model_or_hf_config_text(R"({"schema": "trainplan/model/v1", "name": "x", "architecture": "llama", "layers": 2,
      "hidden": 64, "heads": 4, "vocab": 100, "model_type": "llama"})", "x.json");
  ASSERT_FALSE(strict);
  EXPECT_NE(strict.error().message.find("model_type"), std::string::npos) << strict.error().message;
}

// A plan file's model reference may name an HF config (resolved like --model).
TEST(HfConfig, PlanFilesReferToConfigs) {
  const nlohmann::json plan = {{"schema", "trainplan/plan/v1"}, {"model", hf_path("qwen3-8b")}, {"cluster", "dgx-h100"}, {"gpus", 8}};
  auto request = parse_plan(plan, "plan.json");
  ASSERT_TRUE(request) << request.error().message;
  EXPECT_EQ(request->model.name, "qwen3-8b");
  EXPECT_DOUBLE_EQ(count_parameters(request->model).total(36), 8190726144.0);
  const nlohmann::json bad = {{"schema", "trainplan/plan/v1"}, {"model", testing::data_path("hf/README.md")}, {"cluster", "dgx-h100"}, {"gpus", 8}};
  auto refused = parse_plan(bad, "plan.json");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("plan.json: /model: "), std::string::npos) << refused.error().message;
}

// Each HF model written as a trainplan/model/v1 document reads back as the same model (the
// new keys: head_dim, norm, mlp, positions, biases, sliding_window, mla, moe's shared and dense).
TEST(HfConfig, EveryModelRoundTripsThroughTheModelDocument) {
  for (const PublishedCount& c : kTotals) {
    const ModelSpec m = hf_model(c.file);
    const nlohmann::json doc = model_to_json(m);
    auto back = parse_model(doc, "roundtrip.json");
    ASSERT_TRUE(back) << c.file << ": " << back.error().message;
    EXPECT_EQ(model_to_json(*back), doc) << c.file;
    EXPECT_DOUBLE_EQ(count_parameters(*back).total(back->layers), count_parameters(m).total(m.layers)) << c.file;
    EXPECT_DOUBLE_EQ(model_flops_per_token(*back, 4096), model_flops_per_token(m, 4096)) << c.file;
  }
  // The keys as written: only what differs from the architecture.
  const nlohmann::json falcon = model_to_json(hf_model("falcon-7b"));
  EXPECT_EQ(falcon.at("architecture"), "gpt");
  EXPECT_EQ(falcon.at("positions"), "rotary");
  EXPECT_EQ(falcon.at("qkv_bias"), false);
  EXPECT_FALSE(falcon.contains("norm"));
  const ModelSpec mpt = hf_model("mpt-7b");
  const nlohmann::json alibi = model_to_json(mpt);
  EXPECT_EQ(alibi.at("positions"), "alibi");
  auto mpt_back = parse_model(alibi, "mpt.json");
  ASSERT_TRUE(mpt_back) << mpt_back.error().message;
  EXPECT_TRUE(mpt_back->features() == mpt.features());
  const nlohmann::json lite = model_to_json(hf_model("deepseek-v2-lite"));
  EXPECT_FALSE(lite.at("mla").contains("q_lora_rank"));
  EXPECT_EQ(lite.at("moe").at("dense_layers"), 1);
  EXPECT_EQ(lite.at("moe").at("shared_ffn_hidden"), 2816);
  // The presets' documents gain no keys.
  for (const auto& name : model_preset_names()) {
    const nlohmann::json j = model_to_json(testing::model(name));
    for (const char* key : {"head_dim", "norm", "mlp", "positions", "qkv_bias", "o_bias", "mlp_bias", "sliding_window", "mla"}) {
      EXPECT_FALSE(j.contains(key)) << name << " " << key;
    }
  }
}

// The same architecture from an HF config and from the built-in preset plans identically: every
// number of the estimate, for layouts that exercise TP, PP, SP, ZeRO, recompute and LoRA.
TEST(HfConfig, Llama31ConfigEstimatesExactlyLikeTheLlama3Preset) {
  const ModelSpec hf = hf_model("llama-3.1-8b");
  const ModelSpec preset = testing::model("llama3-8b");
  EXPECT_DOUBLE_EQ(count_parameters(hf).total(hf.layers), count_parameters(preset).total(preset.layers));
  const auto layouts = [](Plan& p, int which) {
    p.parallel.dp = 16;
    if (which == 1) { p.parallel.tp = 2; p.parallel.pp = 2; p.parallel.dp = 4; p.parallel.sequence_parallel = true; p.parallel.zero_stage = 1; p.parallel.recompute = Recompute::kSelective; }
    if (which == 2) { p.parallel.zero_stage = 3; p.parallel.recompute = Recompute::kFull; p.training.stack = Stack::kPytorchEager; }
    if (which == 3) { p.training.mode = TrainingMode::kLora; p.training.lora.rank = 16; p.training.lora.targets = {"q", "k", "v", "o", "gate", "up", "down"}; }
  };
  for (int which = 0; which < 4; ++which) {
    Plan a = testing::make_plan(hf, "dgx-h100", 16, 8192, 64);
    Plan b = testing::make_plan(preset, "dgx-h100", 16, 8192, 64);
    layouts(a, which);
    layouts(b, which);
    const Estimate ea = testing::checked_estimate(a);
    const Estimate eb = testing::checked_estimate(b);
    nlohmann::json ja = estimate_to_json(a, ea), jb = estimate_to_json(b, eb);
    ja.erase("plan");
    jb.erase("plan");
    ja.erase("model");
    jb.erase("model");
    EXPECT_EQ(ja.dump(), jb.dump()) << "layout " << which;
    EXPECT_EQ(ea.time.step.value(), eb.time.step.value()) << "layout " << which;
  }
  // Likewise GPT-2 XL and Mixtral against their presets.
  const ModelSpec gpt2 = hf_model("gpt2-xl");
  EXPECT_DOUBLE_EQ(count_parameters(gpt2).total(gpt2.layers), count_parameters(testing::model("gpt2-1.5b")).total(48));
  Plan g = testing::make_plan(gpt2, "dgx-h100", 8, 1024, 64);
  Plan gp = testing::make_plan(testing::model("gpt2-1.5b"), "dgx-h100", 8, 1024, 64);
  EXPECT_EQ(testing::checked_estimate(g).time.step.value(), testing::checked_estimate(gp).time.step.value());
  const ModelSpec mixtral = hf_model("mixtral-8x7b-v0.1");
  Plan x = testing::make_plan(mixtral, "dgx-h100", 64, 4096, 256);
  Plan xp = testing::make_plan(testing::model("mixtral-8x7b"), "dgx-h100", 64, 4096, 256);
  for (Plan* p : {&x, &xp}) { p->parallel.tp = 2; p->parallel.dp = 32; p->parallel.ep = 8; p->parallel.zero_stage = 1; }
  EXPECT_EQ(testing::checked_estimate(x).time.step.value(), testing::checked_estimate(xp).time.step.value());
  EXPECT_EQ(testing::checked_estimate(x).memory.total.value(), testing::checked_estimate(xp).memory.total.value());
}

// The layer cost's FLOPs (compute.cpp's GEMM shapes) agree with model_flops_per_token
// (count_parameters) for every family: head_dim != h / heads, biases, MLA, shared experts,
// leading dense layers and sliding windows included.
TEST(HfConfig, LayerFlopsAgreeWithModelFlopsPerToken) {
  for (const PublishedCount& c : kTotals) {
    const ModelSpec m = hf_model(c.file);
    const long long seq = std::min<long long>(m.max_seq_len, 8192);
    Plan p = testing::make_plan(m, "dgx-h100", 8, seq, 64);
    p.parallel.dp = 8;
    auto valid = validate_plan(p);
    ASSERT_TRUE(valid) << c.file << ": " << valid.error().message;
    const Estimate e = estimate(p);
    const double expected = model_flops_per_token(m, seq) * e.throughput.tokens_per_second_per_gpu / 1e12;
    EXPECT_NEAR(e.throughput.model_tflops_per_gpu / expected, 1.0, 0.01) << c.file;
  }
}

// Sliding-window attention (Mistral 7B v0.1: 4096) attends to at most the window: the attention
// FLOPs per token stop growing with the sequence past it, and the step gets cheaper than full
// attention at 32k.
TEST(HfConfig, SlidingWindowCapsTheAttendedKeys) {
  const ModelSpec mistral = hf_model("mistral-7b-v0.1");
  ModelSpec full = mistral;
  full.sliding_window = 0;
  EXPECT_DOUBLE_EQ(model_flops_per_token(mistral, 4096), model_flops_per_token(full, 4096));
  // 6 * L * heads * (2 * head_dim) per key: 12 * 32 * 4096 per key beyond the window.
  EXPECT_DOUBLE_EQ(model_flops_per_token(full, 32768) - model_flops_per_token(mistral, 32768), 12.0 * 32 * 4096 * (32768 - 4096));
  EXPECT_DOUBLE_EQ(model_flops_per_token(mistral, 32768), model_flops_per_token(mistral, 8192));
  Plan a = testing::make_plan(mistral, "dgx-h100", 8, 32768, 8);
  Plan b = testing::make_plan(full, "dgx-h100", 8, 32768, 8);
  for (Plan* p : {&a, &b}) { p->parallel.tp = 8; p->parallel.dp = 1; p->parallel.sequence_parallel = true; }
  EXPECT_LT(testing::checked_estimate(a).time.step.value(), 0.8 * testing::checked_estimate(b).time.step.value());
}

// Gemma's Q is 16 x 256 = 4096 wide on a 3072 hidden size: more attention weights and FLOPs
// than a model with head_dim = hidden / heads.
TEST(HfConfig, ExplicitHeadDimWidensTheAttention) {
  const ModelSpec gemma = hf_model("gemma-7b");
  ModelSpec narrow = gemma;
  narrow.head_size = 0;  // 16 x 192
  EXPECT_DOUBLE_EQ(count_parameters(gemma).attention - count_parameters(narrow).attention, 4.0 * 3072 * (4096 - 3072));
  EXPECT_GT(model_flops_per_token(gemma, 8192), model_flops_per_token(narrow, 8192));
}

}  // namespace
}  // namespace trainplan
