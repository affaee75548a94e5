// Instruction-tuning data (issue 15): prompt/response examples tokenised byte by byte or with a
// vocabulary, one example per sequence, the loss taken on the response tokens only and averaged
// over the whole global batch's (data.hpp), so every layout computes the same losses.

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "data.hpp"
#include "executor_support.hpp"
#include "fused_ops.hpp"
#include "tensor_parallel.hpp"

namespace trainplan::testing {
namespace {

namespace ex = trainplan::executor;

std::vector<int64_t> row(const at::Tensor& t, int64_t i) {
  const at::Tensor r = t[i].contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

// Byte-level ids: bytes 0-255, BOS 256, EOS 257, PAD 258. "ab" -> "c": BOS a b c EOS PAD...; the
// targets are the tokens shifted by one, and only c and EOS take a loss.
TEST(InstructionData, ByteTokensAndTheResponseMaskByHand) {
  const std::string dir = scratch_dir("instruction-bytes");
  std::ofstream(dir + "/d.jsonl") << R"({"prompt": "ab", "response": "c"})" << "\n\n"
                                  << R"({"instruction": "x", "input": "y", "output": "zz"})" << "\n";
  ex::DataLoader loader(ex::DataSpec{dir + "/d.jsonl", 2, 1, ""}, 512, 8);
  EXPECT_TRUE(loader.masked());
  // Two examples, global batch 2: both in step 1, in the epoch's seeded order.
  const ex::MicroBatch b = loader.micro_batch(1, 0, 1, 2, 2, 0, at::kCPU);
  const int first = row(b.tokens, 0)[1] == 'a' ? 0 : 1;
  EXPECT_EQ(row(b.tokens, first), (std::vector<int64_t>{256, 'a', 'b', 'c', 257, 258, 258, 258}));
  EXPECT_EQ(row(b.targets, first), (std::vector<int64_t>{-1, -1, 'c', 257, -1, -1, -1, -1}));
  // Alpaca's fields: prompt = instruction, a blank line, input.
  EXPECT_EQ(row(b.tokens, 1 - first), (std::vector<int64_t>{256, 'x', '\n', '\n', 'y', 'z', 'z', 257}));
  EXPECT_EQ(row(b.targets, 1 - first), (std::vector<int64_t>{-1, -1, -1, -1, 'z', 'z', 257, -1}));
  EXPECT_EQ(loader.step_targets(1, 2), 2 + 3);
}

// A vocabulary file: pieces matched longest first, bytes without a piece through "<0xNN>", BOS
// and EOS from their usual names; an unknown key, a missing response or an id past the model's
// vocabulary is an error naming the line.
TEST(InstructionData, VocabularyPiecesAndErrors) {
  const std::string dir = scratch_dir("instruction-vocab");
  std::ofstream(dir + "/vocab.json") << R"({"<s>": 1, "</s>": 2, "<0x21>": 3, "hel": 10, "he": 11, "l": 12, "lo": 13, "o": 14})";
  std::ofstream(dir + "/d.jsonl") << R"({"prompt": "hello", "response": "!"})" << "\n";
  ex::DataLoader loader(ex::DataSpec{dir + "/d.jsonl", 2, 1, dir + "/vocab.json"}, 32, 6);
  const ex::MicroBatch b = loader.micro_batch(1, 0, 1, 1, 1, 0, at::kCPU);
  EXPECT_EQ(row(b.tokens, 0), (std::vector<int64_t>{1, 10, 13, 3, 2, 2}));  // <s> hel lo ! </s>, padded with </s>
  EXPECT_EQ(row(b.targets, 0), (std::vector<int64_t>{-1, -1, 3, 2, -1, -1}));

  // Byte-level BPE (GPT-2, Llama 3): bytes through their stand-ins ("Ġ" for the space).
  std::ofstream(dir + "/bpe.json") << R"({"<|begin_of_text|>": 1, "<|end_of_text|>": 2, "h": 3, "i": 4, "hi": 5, "\u0120hi": 6, "!": 7, "\u0120": 8})";
  std::ofstream(dir + "/hi.jsonl") << R"({"prompt": "hi hi", "response": "!"})" << "\n";
  const ex::MicroBatch bpe = ex::DataLoader(ex::DataSpec{dir + "/hi.jsonl", 2, 1, dir + "/bpe.json"}, 32, 6).micro_batch(1, 0, 1, 1, 1, 0, at::kCPU);
  EXPECT_EQ(row(bpe.tokens, 0), (std::vector<int64_t>{1, 5, 6, 7, 2, 2}));  // <|begin_of_text|> hi Ġhi ! <|end_of_text|>
  // SentencePiece (Llama 2): "▁" before the text and for each space.
  std::ofstream(dir + "/sp.json") << R"({"<s>": 1, "</s>": 2, "\u2581hi": 3, "\u2581": 4, "<0x21>": 5})";
  const ex::MicroBatch sp = ex::DataLoader(ex::DataSpec{dir + "/hi.jsonl", 2, 1, dir + "/sp.json"}, 32, 7).micro_batch(1, 0, 1, 1, 1, 0, at::kCPU);
  EXPECT_EQ(row(sp.tokens, 0), (std::vector<int64_t>{1, 3, 3, 4, 5, 2, 2}));  // <s> ▁hi ▁hi | ▁ ! </s>: the response is a text of its own

  std::ofstream(dir + "/bad.jsonl") << R"({"prompt": "hello", "response": "?"})" << "\n";
  EXPECT_THROW(
      {
        try {
          ex::DataLoader bad(ex::DataSpec{dir + "/bad.jsonl", 2, 1, dir + "/vocab.json"}, 32, 6);
        } catch (const ex::DataError& e) {
          EXPECT_NE(std::string(e.what()).find("bad.jsonl:1 response: byte 0 (<0x3F>) matches no piece"), std::string::npos) << e.what();
          throw;
        }
      },
      ex::DataError);
  std::ofstream(dir + "/noresponse.jsonl") << "\n" << R"({"prompt": "hello"})" << "\n";
  try {
    ex::DataLoader bad(ex::DataSpec{dir + "/noresponse.jsonl", 2, 1, ""}, 512, 6);
    ADD_FAILURE() << "accepted an example without a response";
  } catch (const ex::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("noresponse.jsonl:2: no \"response\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(ex::DataLoader(ex::DataSpec{dir + "/d.jsonl", 2, 1, dir + "/vocab.json"}, 12, 6), ex::DataError);  // id 13 >= 12
  EXPECT_THROW(ex::DataLoader(ex::DataSpec{dir + "/d.jsonl", 2, 1, ""}, 256, 6), ex::DataError);  // bytes need 259 ids
}

// The masked losses (negative targets take none) divided by a given count equal ATen's
// cross-entropy with ignore_index summed and divided alike, gradients included (float64 inputs:
// the vocabulary-parallel path to 1e-12, the chunked one, which sums in float32, to float32's).
TEST(InstructionData, MaskedLossesEqualTheIgnoreIndexReference) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({24, 16}, at::kDouble).requires_grad_(true);
  const at::Tensor w = at::randn({40, 16}, at::kDouble).requires_grad_(true);
  at::Tensor targets = at::randint(40, {24}, at::kLong);
  targets.narrow(0, 0, 7).fill_(-1);
  targets.narrow(0, 20, 2).fill_(-1);
  const double denominator = 9.5;  // another rank's tokens count too
  const at::Tensor reference = at::cross_entropy_loss(at::linear(x, w), targets, {}, at::Reduction::Sum, -1) / denominator;
  const auto ref_grads = torch::autograd::grad({reference}, {x, w});
  const at::Tensor fused = ex::linear_cross_entropy(x, w, targets, 5, {}, 1.0, denominator);  // 5-row chunks
  const auto fused_grads = torch::autograd::grad({fused}, {x, w});
  // The chunked loss accumulates in float32 whatever its inputs' dtype: float32's precision.
  EXPECT_NEAR(fused.item<double>(), reference.item<double>(), 1e-6 * reference.item<double>());
  EXPECT_TRUE(at::allclose(fused_grads[0], ref_grads[0], 1e-5, 1e-7));
  EXPECT_TRUE(at::allclose(fused_grads[1], ref_grads[1], 1e-5, 1e-7));
  const at::Tensor plain = ex::vocab_parallel_cross_entropy({}, at::linear(x, w), targets, 0, denominator);
  EXPECT_NEAR(plain.item<double>(), reference.item<double>(), 1e-12);
}

// Whole runs on examples of different lengths (so micro-batches hold different numbers of
// response tokens, some cut at seq_len): equal losses on one rank, dp2 ZeRO-1, tp2, cp2 and pp2,
// with LoRA and dropout on top.
TEST(InstructionData, EveryLayoutComputesTheOneRankLosses) {
  const std::string dir = scratch_dir("instruction-layouts");
  {
    std::ofstream out(dir + "/train.jsonl");
    for (int i = 0; i < 24; ++i) {
      const std::string prompt = "question " + std::to_string(i) + std::string(static_cast<std::size_t>(i % 5) * 3, '?');
      const std::string response = "answer " + std::string(static_cast<std::size_t>(1 + (i * 7) % 40), static_cast<char>('a' + i % 26));
      out << nlohmann::json{{"prompt", prompt}, {"response", response}}.dump() << "\n";
    }
  }
  const auto losses = [&](const std::string& name, int ranks, int tp, int cp, int pp, bool lora) {
    PlanSpec spec;
    spec.ranks = ranks;
    spec.tp = tp;
    spec.cp = cp;
    spec.pp = pp;
    spec.zero_stage = ranks > 1 ? 1 : 0;
    spec.micro_batch = 4 / ranks;
    spec.global_batch = 8;
    spec.seq_len = 32;
    spec.layers = 2;
    spec.model_patch = {{"vocab", 320}};
    if (lora) spec.training_patch = {{"mode", "lora"}, {"lora", {{"rank", 4}, {"dropout", 0.1}}}, {"dropout", true}};
    const std::string plan = write_plan(dir, name, spec);
    const Outcome o = run_executor(ranks * tp * cp * pp, "--plan " + plan + " --data " + dir + "/train.jsonl --steps 4 --lr 3e-3 --threads 1 --quiet --measurement " +
                                                             dir + "/" + name + ".measurement.json");
    EXPECT_EQ(o.exit_code, 0) << name << "\n" << o.output;
    return o.exit_code == 0 ? read_json(dir + "/" + name + ".measurement.json").at("losses").get<std::vector<double>>() : std::vector<double>{};
  };
  for (bool lora : {false, true}) {
    const std::string tag = lora ? "lora_" : "";
    const std::vector<double> one = losses(tag + "one", 1, 1, 1, 1, lora);
    ASSERT_EQ(one.size(), 4u);
    for (const auto& [name, ranks, tp, cp, pp] : {std::tuple<const char*, int, int, int, int>{"dp2", 2, 1, 1, 1}, {"tp2", 1, 2, 1, 1},
                                                  {"cp2", 1, 1, 2, 1}, {"pp2", 1, 1, 1, 2}}) {
      const std::vector<double> got = losses(tag + name, ranks, tp, cp, pp, lora);
      ASSERT_EQ(got.size(), one.size()) << tag << name;
      for (std::size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(got[i], one[i], 1e-5 * std::abs(one[i])) << tag << name << " step " << i + 1;
    }
  }
}

// The CPU walkthrough of docs/executor.md: a base model trained briefly and exported in the Hugging Face
// layout, then LoRA on the sample instructions from that export on 2 ranks; the response loss falls.
TEST(InstructionData, TheReadmeWalkthroughRuns) {
  const std::string dir = scratch_dir("walkthrough");
  const std::string samples = std::string(TRAINPLAN_SOURCE_DIR) + "/samples";
  Outcome o = run_executor(1, "--plan " + samples + "/plans/tiny-llama-bytes-pretrain.json --steps 10 --threads 1 --quiet --export " + dir +
                                  "/base --export-format hf");
  ASSERT_EQ(o.exit_code, 0) << o.output;
  o = run_executor(2, "--plan " + samples + "/plans/tiny-llama-bytes-lora.json --init-from " + dir + "/base --data " + samples +
                          "/data/arithmetic-instructions.jsonl --steps 30 --lr 3e-3 --threads 1 --quiet --measurement " + dir +
                          "/m.json --export " + dir + "/tuned --export-format hf --export-lora both");
  ASSERT_EQ(o.exit_code, 0) << o.output;
  const std::vector<double> losses = read_json(dir + "/m.json").at("losses").get<std::vector<double>>();
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_LT(losses.back(), 0.8 * losses.front());
  for (const char* file : {"config.json", "model.safetensors", "adapter_config.json", "adapter_model.safetensors"}) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/tuned/" + file)) << file;
  }
}

}  // namespace
}  // namespace trainplan::testing
