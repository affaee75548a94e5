// The executor's initial weights (executor/src/model/model.hpp init_unit): drawn in chunks of 2^20
// values, each chunk from its own seeded generator, on however many threads ATen has; the same
// values on 1 thread as on 2, the distributions the model's document asks for, and chunks that
// are not copies of one another.

#include <cmath>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "model.hpp"
#include "trainplan/costmodel/model.hpp"

namespace trainplan::executor {
namespace {

namespace cm = trainplan::costmodel;

// A Llama-style block of hidden 512 and MLP 3072: q and o are 512 x 512 (0.26 M values, one
// chunk), gate, up and down 3072 x 512 (1.57 M values: a whole chunk of 2^20 and a partial one).
cm::ModelSpec block_model() {
  cm::ModelSpec m;
  m.name = "init-test";
  m.architecture = cm::Architecture::kLlama;
  m.layers = 4;
  m.hidden = 512;
  m.heads = 8;
  m.kv_heads = 8;
  m.ffn_hidden = 3072;
  m.vocab = 1000;
  m.max_seq_len = 64;
  return m;
}

const ParamSlot& slot_named(const UnitLayout& u, const std::string& suffix) {
  for (const ParamSlot& s : u.slots) {
    if (s.name.size() >= suffix.size() && s.name.compare(s.name.size() - suffix.size(), suffix.size(), suffix) == 0) return s;
  }
  throw std::runtime_error("no slot " + suffix);
}

TEST(Init, TheValuesDoNotDependOnTheThreadsAndFollowTheirDistributions) {
  const cm::ModelSpec m = block_model();
  const std::vector<UnitLayout> units = model_layout(m);
  const UnitLayout& block = units.at(1);
  ASSERT_EQ(block.name, "layers.0");
  const int threads = at::get_num_threads();
  at::Tensor one = at::empty({block.numel}), two = at::empty({block.numel});
  at::set_num_threads(1);
  init_unit(block, m, 1234, one);
  at::set_num_threads(2);
  init_unit(block, m, 1234, two);
  at::set_num_threads(threads);
  EXPECT_TRUE(at::equal(one, two));

  const auto values = [&](const std::string& suffix) {
    const ParamSlot& s = slot_named(block, suffix);
    return one.narrow(0, s.offset, s.numel);
  };
  // N(0, 0.02) and, for the projections into the residual stream, N(0, 0.02 / sqrt(2 L)) = 0.00707;
  // over 1.57 M values the sample deviation is within 0.2% of its parameter (its standard error
  // is 0.06%).
  EXPECT_NEAR(values("mlp.gate.weight").std().item<double>(), 0.02, 0.02 * 0.002);
  EXPECT_NEAR(values("mlp.down.weight").std().item<double>(), 0.02 / std::sqrt(8.0), 0.02 / std::sqrt(8.0) * 0.002);
  EXPECT_NEAR(values("mlp.gate.weight").mean().item<double>(), 0.0, 1e-4);
  EXPECT_TRUE(at::equal(values("attention_norm.weight"), at::ones({512})));
  // The gate's two chunks (values 0 .. 2^20 and 2^20 ..) and two matrices drawn from other seeds.
  const at::Tensor gate = values("mlp.gate.weight");
  EXPECT_FALSE(at::equal(gate.narrow(0, 0, 1000), gate.narrow(0, int64_t{1} << 20, 1000)));
  EXPECT_FALSE(at::equal(gate.narrow(0, 0, 1000), values("mlp.up.weight").narrow(0, 0, 1000)));
  at::Tensor other = at::empty({block.numel});
  init_unit(block, m, 1235, other);
  EXPECT_FALSE(at::equal(one, other)) << "another seed, other values";
}

}  // namespace
}  // namespace trainplan::executor
