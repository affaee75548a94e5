// Parameter counts and model FLOPs of the presets against published figures and hand counts,
// preset name resolution, and the model document round trip.
//
// Hand counts (notation of shared/notes/cost-model-references.md): Llama blocks have
// attention 2h^2 + 2h*kv_dim, SwiGLU MLP 3*h*ffn, two RMSNorms 2h, a final RMSNorm h, and untied
// embedding and output layers V*h each. GPT blocks have attention 4h^2 + 4h (biases), MLP
// 8h^2 + 5h, two LayerNorms 4h, learned positions s*h, a final LayerNorm 2h, tied output.

#include <cmath>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_support.hpp"
#include "trainplan/costmodel/model.hpp"
#include "trainplan/costmodel/presets.hpp"

namespace trainplan {
namespace {

using namespace costmodel;

struct CountCase {
  const char* preset;
  double hand_count;      // exact, from the architecture numbers (derivation in the comment)
  double published;       // the figure its authors (or its Hugging Face checkpoint) report
  double tolerance;       // relative, for the rounding of the published figure
  const char* source;
};

// Hand counts:
//  llama3-8b:   32 * (41,943,040 + 176,160,768 + 8,192) + 2 * 525,336,576 + 4,096
//  llama3-70b:  80 * (150,994,944 + 704,643,072 + 16,384) + 2 * 1,050,673,152 + 8,192
//  llama3-405b: 126 * (570,425,344 + 2,617,245,696 + 32,768) + 2 * 2,101,346,304 + 16,384
//  llama2-7b:   32 * (67,108,864 + 135,266,304 + 8,192) + 2 * 131,072,000 + 4,096
//  mixtral:     32 * (41,943,040 + 8 * 176,160,768 + 32,768 router + 8,192) + 2 * 131,072,000 + 4,096
//  gpt3-175b:   96 * (12 h^2 + 13 h) + (51,200 + 2,048) * h + 2h, h = 12,288
const CountCase kCounts[] = {
    {"llama3-8b", 8030261248.0, 8.03e9, 0.001, "Dubey et al. 2024 (Llama 3), Table 3; HF Meta-Llama-3-8B: 8.03B"},
    {"llama3-70b", 70553706496.0, 70.55e9, 0.001, "Dubey et al. 2024, Table 3; HF Meta-Llama-3-70B: 70.6B"},
    {"llama3-405b", 405853388800.0, 405.8e9, 0.001, "Dubey et al. 2024, Table 3; HF Llama-3.1-405B: 406B"},
    {"llama2-7b", 6738415616.0, 6.738e9, 0.0001, "HF meta-llama/Llama-2-7b-hf safetensors: 6,738,415,616"},
    {"mixtral-8x7b", 46702792704.0, 46.70e9, 0.001, "Jiang et al. 2024 (Mixtral), Sec. 2: 47B total"},
    {"gpt3-175b", 174615846912.0, 174.6e9, 0.001, "Brown et al. 2020, Table 2.1: 175B; Narayanan 2021 formula"},
};

TEST(ParameterCount, PresetsMatchHandCountsAndPublishedFigures) {
  for (const CountCase& c : kCounts) {
    const ModelSpec m = testing::model(c.preset);
    const double total = count_parameters(m).total(m.layers);
    EXPECT_DOUBLE_EQ(total, c.hand_count) << c.preset;
    EXPECT_NEAR(total / c.published, 1.0, c.tolerance) << c.preset << " vs " << c.source;
  }
}

// Mixtral of Experts (Jiang et al. 2024), Sec. 2: "47B parameters, 13B active per token";
// hand count of the active ones: 32 * (41,943,040 + 2 * 176,160,768 + 32,768 + 8,192) + 2 * 131,072,000 + 4,096.
// The parameter tensors of a block, counted by hand: Llama's q, k, v, o, gate, up, down and two
// RMSNorm weights (9; 6 with Q/K/V and gate/up fused, as Megatron's linear_qkv and linear_fc1);
// GPT's q, k, v, o, fc1, fc2 weights and biases and two LayerNorms' weight and bias (16; 12 with
// Q/K/V fused); Qwen2's Llama block with Q, K and V biases (12).
TEST(ParameterCount, BlockTensorsMatchHandCounts) {
  const ModelSpec llama = testing::model("llama3-8b");
  const ModelSpec gpt = testing::model("gpt3-175b");
  EXPECT_EQ(block_parameter_tensors(llama, false, false), 9);
  EXPECT_EQ(block_parameter_tensors(llama, true, true), 6);
  EXPECT_EQ(block_parameter_tensors(gpt, false, false), 16);
  EXPECT_EQ(block_parameter_tensors(gpt, true, true), 12);
  ModelSpec qwen = llama;
  ModelFeatures f = qwen.features();
  f.qkv_bias = true;
  qwen.feature_overrides = f;
  EXPECT_EQ(block_parameter_tensors(qwen, false, false), 12);
}

TEST(ParameterCount, MixtralActiveParametersAreTopTwoOfEightExperts) {
  const ModelSpec m = testing::model("mixtral-8x7b");
  const ParameterCounts c = count_parameters(m);
  EXPECT_DOUBLE_EQ(c.active(m.layers), 12879925248.0);
  EXPECT_NEAR(c.active(m.layers) / 12.88e9, 1.0, 0.001);
  EXPECT_LT(c.active(m.layers), 0.3 * c.total(m.layers));
}

TEST(ParameterCount, DenseModelsHaveAllParametersActive) {
  for (const char* name : {"llama3-8b", "llama3-70b", "gpt3-175b", "llama2-7b"}) {
    const ModelSpec m = testing::model(name);
    const ParameterCounts c = count_parameters(m);
    EXPECT_DOUBLE_EQ(c.active(m.layers), c.total(m.layers)) << name;
  }
}

// Narayanan et al. 2021, Sec. 3: P = 12 L h^2 (1 + 13/(12h) + (V+s)/(12Lh)). The code also counts
// the final LayerNorm (2h), which the formula leaves out.
TEST(ParameterCount, GptMatchesNarayananFormulaPlusFinalLayerNorm) {
  const struct { const char* name; int layers; long long hidden; int heads; long long seq; long long vocab; } models[] = {
      {"gpt3-175b", 96, 12288, 96, 2048, 51200},
      {"1.7B", 24, 2304, 24, 2048, 51200},   // Narayanan 2021 Table 1, first row
      {"39.1B", 48, 8192, 64, 2048, 51200},  // Table 1
      {"1T", 128, 25600, 160, 2048, 51200},  // Table 1, last row
  };
  for (const auto& g : models) {
    const ModelSpec m = g.name == std::string("gpt3-175b") ? testing::model("gpt3-175b")
                                                          : testing::gpt_model(g.name, g.layers, g.hidden, g.heads, g.seq, g.vocab);
    const double L = g.layers, h = static_cast<double>(g.hidden), V = static_cast<double>(g.vocab), s = static_cast<double>(g.seq);
    const double narayanan = 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h));
    const double total = count_parameters(m).total(m.layers);
    EXPECT_NEAR(total / narayanan, 1.0, 1e-4) << g.name;
    EXPECT_NEAR(total - narayanan, 2 * h, 1.0) << g.name;  // exact up to rounding
  }
}

// Korthikanti et al. 2022, Sec. 6: model FLOPs per step 72 B s L h^2 (1 + s/(6h) + V/(12Lh)),
// i.e. per token 72 L h^2 (1 + s/(6h) + V/(12Lh)); the code's matmul count adds the biases.
TEST(ModelFlops, GptMatchesKorthikantiFormula) {
  const struct { const char* name; int layers; long long hidden; int heads; long long seq; } models[] = {
      {"22B", 48, 6144, 64, 2048}, {"175B", 96, 12288, 96, 2048}, {"530B", 105, 20480, 128, 2048}, {"1T", 128, 25600, 160, 2048},
      {"long", 24, 2048, 16, 16384},
  };
  for (const auto& g : models) {
    const ModelSpec m = testing::gpt_model(g.name, g.layers, g.hidden, g.heads, g.seq);
    const double L = g.layers, h = static_cast<double>(g.hidden), s = static_cast<double>(g.seq), V = 51200;
    const double per_token = 72.0 * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)) / s;
    EXPECT_NEAR(model_flops_per_token(m, g.seq) / per_token, 1.0, 0.005) << g.name;
  }
}

// Llama 3 8B by hand: 6 * (32 * (41,943,040 + 176,160,768) + 525,336,576) + 12 * 32 * 8192 * 4096.
TEST(ModelFlops, LlamaCountsMatmulParametersAndAttention) {
  const ModelSpec m = testing::model("llama3-8b");
  const double expected = 6.0 * (32.0 * (41943040.0 + 176160768.0) + 525336576.0) + 12.0 * 32 * 8192 * 4096;
  EXPECT_NEAR(model_flops_per_token(m, 8192) / expected, 1.0, 1e-12);
  // The attention term grows linearly with the sequence: 12 L h per extra token of context.
  EXPECT_NEAR(model_flops_per_token(m, 8192) - model_flops_per_token(m, 4096), 12.0 * 32 * 4096 * 4096, 1.0);
}

// A MoE token passes through top_k experts only: 6 * active matmul parameters (router excluded).
TEST(ModelFlops, MixtralCountsOnlyActiveExperts) {
  const ModelSpec m = testing::model("mixtral-8x7b");
  const double expected = 6.0 * (32.0 * (41943040.0 + 2 * 176160768.0) + 131072000.0) + 12.0 * 32 * 4096 * 4096;
  EXPECT_NEAR(model_flops_per_token(m, 4096) / expected, 1.0, 1e-12);
}

TEST(ModelAliases, ShortNamesResolveToPresets) {
  const std::pair<const char*, const char*> cases[] = {
      {"70b", "llama3-70b"}, {"405b", "llama3-405b"}, {"8b", "llama3-8b"}, {"175b", "gpt3-175b"},
      {"7b", "llama2-7b"},   {"13b", "llama2-13b"},   {"mixtral", "mixtral-8x7b"}, {"8x7b", "mixtral-8x7b"},
      {"tinyllama", "tinyllama-1.1b"}, {"1.5b", "gpt2-1.5b"},
  };
  for (const auto& [alias, preset] : cases) {
    EXPECT_EQ(resolve_model_alias(alias), preset) << alias;
    auto m = find_model(alias);
    ASSERT_TRUE(m.ok()) << alias << ": " << m.error().message;
    EXPECT_EQ(m->name, preset) << alias;
  }
  // Names that are not aliases pass through unchanged.
  EXPECT_EQ(resolve_model_alias("llama3-70b"), "llama3-70b");
  EXPECT_EQ(resolve_model_alias("my-model.json"), "my-model.json");
}

TEST(FindModel, UnknownNameFailsListingEveryPreset) {
  auto m = find_model("llama9-1t");
  ASSERT_FALSE(m.ok());
  const std::string& message = m.error().message;
  EXPECT_NE(message.find("unknown model \"llama9-1t\""), std::string::npos) << message;
  const auto presets = model_preset_names();
  ASSERT_GE(presets.size(), 10u);
  for (const auto& name : presets) EXPECT_NE(message.find(name), std::string::npos) << name << " missing from: " << message;
}

TEST(FindHwprofile, UnknownNameFailsListingEveryPreset) {
  auto hw = find_hwprofile("dgx-z900");
  ASSERT_FALSE(hw.ok());
  const std::string& message = hw.error().message;
  EXPECT_NE(message.find("dgx-z900"), std::string::npos) << message;
  for (const auto& name : hwprofile_preset_names()) EXPECT_NE(message.find(name), std::string::npos) << name << " missing from: " << message;
}

TEST(FindModel, MissingPathFailsNamingThePath) {
  const std::string path = testing::source_path("samples/models/does-not-exist.json");
  auto m = find_model(path);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find(path), std::string::npos) << m.error().message;
}

TEST(ModelDocument, EveryPresetRoundTripsThroughJson) {
  for (const auto& name : model_preset_names()) {
    const ModelSpec a = testing::model(name);
    auto b = parse_model(model_to_json(a), "roundtrip.json");
    ASSERT_TRUE(b.ok()) << name << ": " << b.error().message;
    EXPECT_EQ(b->name, a.name);
    EXPECT_EQ(b->architecture, a.architecture) << name;
    EXPECT_EQ(b->layers, a.layers) << name;
    EXPECT_EQ(b->hidden, a.hidden) << name;
    EXPECT_EQ(b->heads, a.heads) << name;
    EXPECT_EQ(b->kv_heads, a.kv_heads) << name;
    EXPECT_EQ(b->ffn_hidden, a.ffn_hidden) << name;
    EXPECT_EQ(b->vocab, a.vocab) << name;
    EXPECT_EQ(b->tied_embeddings, a.tied_embeddings) << name;
    EXPECT_EQ(b->max_seq_len, a.max_seq_len) << name;
    ASSERT_EQ(b->moe.has_value(), a.moe.has_value()) << name;
    if (a.moe) {
      EXPECT_EQ(b->moe->experts, a.moe->experts);
      EXPECT_EQ(b->moe->top_k, a.moe->top_k);
      EXPECT_EQ(b->moe->expert_ffn_hidden, a.moe->expert_ffn_hidden);
    }
    EXPECT_DOUBLE_EQ(count_parameters(*b).total(b->layers), count_parameters(a).total(a.layers)) << name;
  }
}

}  // namespace
}  // namespace trainplan
