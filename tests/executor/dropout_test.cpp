// Dropout in the executor (issue 15): masks that depend only on an element's place in the global
// batch (dropout.hpp), so every parallel layout computes the same losses.

#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dropout.hpp"
#include "executor_support.hpp"

namespace trainplan::testing {
namespace {

namespace ex = trainplan::executor;

at::Tensor longs(int64_t from, int64_t to) { return at::arange(from, to, at::kLong); }

// The share dropped is the rate: 1M draws at 0.1 drop 100000 +- 300 (one sigma); 5 sigma allowed.
TEST(Dropout, DropsTheRateOfElements) {
  for (const double rate : {0.1, 0.5}) {
    const at::Tensor keep = ex::dropout_keep(longs(0, 16), longs(0, 256), 0, 256, 1234, 7, rate);
    const double dropped = 1.0 - keep.to(at::kDouble).mean().item<double>();
    EXPECT_NEAR(dropped, rate, 5.0 * std::sqrt(rate * (1 - rate) / keep.numel())) << rate;
  }
  EXPECT_TRUE(ex::dropout_keep(longs(0, 4), longs(0, 8), 0, 8, 1, 1, 0.0).all().item<bool>());
}

// A piece of a tensor (other sequences, positions or features: DP, CP/SP and TP pieces) draws the
// mask of those elements of the whole; another site, seed or sequence draws another.
TEST(Dropout, APieceDrawsTheWholeMasksPiece) {
  const at::Tensor whole = ex::dropout_keep(longs(10, 14), longs(0, 32), 0, 64, 99, 5, 0.3);
  const at::Tensor piece = ex::dropout_keep(longs(12, 14), longs(8, 24), 16, 32, 99, 5, 0.3);
  EXPECT_TRUE(at::equal(piece, whole.narrow(0, 2, 2).narrow(1, 8, 16).narrow(2, 16, 32)));
  const at::Tensor scattered = ex::dropout_keep(longs(10, 14), at::tensor({3, 30, 7}, at::kLong), 0, 64, 99, 5, 0.3);
  EXPECT_TRUE(at::equal(scattered, whole.index_select(1, at::tensor({3, 30, 7}, at::kLong))));
  const double same_site = ex::dropout_keep(longs(10, 14), longs(0, 32), 0, 64, 99, 6, 0.3).eq(whole).to(at::kDouble).mean().item<double>();
  const double same_seed = ex::dropout_keep(longs(10, 14), longs(0, 32), 0, 64, 98, 5, 0.3).eq(whole).to(at::kDouble).mean().item<double>();
  // Independent masks at rate 0.3 agree on 0.7^2 + 0.3^2 = 58% of the elements.
  EXPECT_NEAR(same_site, 0.58, 0.03);
  EXPECT_NEAR(same_seed, 0.58, 0.03);
}

// The dropped elements are zero, the kept ones scaled by 1 / (1 - rate), and the gradient is
// masked and scaled alike.
TEST(Dropout, ForwardAndBackwardMaskAndScale) {
  ex::DropoutRun run;
  run.hidden = 0.25;
  run.seed = 3;
  run.samples = longs(0, 2);
  run.positions = longs(0, 8);
  const at::Tensor x = at::randn({2, 8, 16}, at::kDouble).requires_grad_(true);
  const at::Tensor y = ex::dropout(x, run, 0.25, 11, run.positions, 0);
  const at::Tensor keep = ex::dropout_keep(run.samples, run.positions, 0, 16, 3, 11, 0.25);
  EXPECT_TRUE(at::allclose(y, x * keep / 0.75));
  y.sum().backward();
  EXPECT_TRUE(at::allclose(x.grad(), keep.to(at::kDouble) / 0.75));
}

// Whole runs: tiny-llama with dropout 0.1 on its residual branches, equal losses on one rank,
// tp2 with sequence parallelism, cp2 with full recompute, pp2 with selective recompute and dp2
// ZeRO-3; and different from the run without dropout.
TEST(Dropout, EveryLayoutComputesTheOneRankLosses) {
  const std::string dir = scratch_dir("dropout-layouts");
  struct Layout {
    std::string name;
    int ranks, tp, cp, pp, zero;
    bool sp;
    std::string recompute;
  };
  const auto losses = [&](const Layout& l, bool dropout) {
    PlanSpec spec;
    spec.ranks = l.ranks;
    spec.tp = l.tp;
    spec.cp = l.cp;
    spec.pp = l.pp;
    spec.zero_stage = l.zero;
    spec.sequence_parallel = l.sp;
    spec.recompute = l.recompute;
    spec.micro_batch = 4 / l.ranks;
    spec.global_batch = 8;
    spec.training_patch = {{"dropout", dropout}, {"dropout_rate", 0.1}};
    const std::string name = l.name + (dropout ? "" : "_nodrop");
    const std::string plan = write_plan(dir, name, spec);
    const Outcome o = run_executor(l.ranks * l.tp * l.cp * l.pp, "--plan " + plan + " --steps 4 --threads 1 --quiet --measurement " + dir + "/" + name + ".measurement.json");
    EXPECT_EQ(o.exit_code, 0) << o.output;
    return o.exit_code == 0 ? read_json(dir + "/" + name + ".measurement.json").at("losses").get<std::vector<double>>() : std::vector<double>{};
  };
  const std::vector<double> one = losses({"one", 1, 1, 1, 1, 0, false, "none"}, true);
  const std::vector<double> plain = losses({"one", 1, 1, 1, 1, 0, false, "none"}, false);
  ASSERT_EQ(one.size(), 4u);
  ASSERT_EQ(plain.size(), 4u);
  EXPECT_GT(std::abs(one[0] - plain[0]), 1e-4) << "dropout changes the loss";
  for (const Layout& l : {Layout{"tp2_sp", 1, 2, 1, 1, 0, true, "none"}, Layout{"cp2_full", 1, 1, 2, 1, 0, false, "full"},
                          Layout{"pp2_selective", 1, 1, 1, 2, 0, false, "selective"}, Layout{"dp2_zero3", 2, 1, 1, 1, 3, false, "none"}}) {
    const std::vector<double> got = losses(l, true);
    ASSERT_EQ(got.size(), one.size()) << l.name;
    for (std::size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(got[i], one[i], 1e-5 * std::abs(one[i])) << l.name << " step " << i + 1;
  }
}

}  // namespace
}  // namespace trainplan::testing
