// The router of the executor's mixture of experts (executor/src/parallel/moe.hpp) on hand-made logits:
// top-k choice and its renormalised weights, capacity filled first choices first (GShard), the
// load-balancing loss (Switch Transformer, Fedus et al. 2021 eq. 4 generalised to top-k as in
// Megatron-Core), and its gradient reaching the router through the block's output.

#include <cmath>

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "moe.hpp"

namespace trainplan::executor {
namespace {

// Four tokens, three experts, top-2. First choices in token order: e0, e0, e0, e1; second: e1,
// e2, e1, e2. With capacity 2, e0 takes tokens 0 and 1 and is full for token 2's first choice;
// e1 takes token 3 (first) and token 0 (second) and is full for token 2's second choice.
at::Tensor logits() { return at::tensor({3.0f, 2.0f, 0.0f, 3.0f, 0.0f, 2.0f, 3.0f, 2.0f, 0.0f, 0.0f, 3.0f, 2.0f}).view({4, 3}); }

// A [4, 2] mask from 0/1 flags.
at::Tensor kept(std::initializer_list<int64_t> flags) { return at::tensor(flags, at::kLong).view({4, 2}).to(at::kBool); }

TEST(MoeRouting, TopKWithWeightsRenormalisedOverTheChosen) {
  const Routing r = route(logits(), 2, 0);
  EXPECT_TRUE(at::equal(r.experts, at::tensor({0, 1, 0, 2, 0, 1, 1, 2}, at::kLong).view({4, 2})));
  EXPECT_TRUE(r.kept.all().item<bool>());  // no capacity: nothing dropped
  // Token 0: e^3 / (e^3 + e^2) = 1 / (1 + e^-1) = 0.731059.
  EXPECT_NEAR(r.weights[0][0].item<float>(), 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(r.weights[0][1].item<float>(), 1.0 / (1.0 + std::exp(1.0)), 1e-6);
  EXPECT_NEAR(r.weights[3][0].item<float>(), 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
}

TEST(MoeRouting, CapacityKeepsFirstChoicesBeforeSecondChoicesInTokenOrder) {
  const Routing r = route(logits(), 2, 2);
  EXPECT_TRUE(at::equal(r.kept, kept({1, 1, 1, 1, 0, 0, 1, 1}))) << r.kept;
  EXPECT_EQ(r.kept.logical_not().sum().item<int64_t>(), 2);
  // Capacity 1: e0 keeps token 0, e1 token 3 (first choices first), e2 token 1's second choice.
  const Routing tight = route(logits(), 2, 1);
  EXPECT_TRUE(at::equal(tight.kept, kept({1, 0, 0, 1, 0, 0, 1, 0}))) << tight.kept;
}

TEST(MoeRouting, ExpertCapacityIsTheCeilingOfTheFactorTimesTheBalancedShare) {
  EXPECT_EQ(expert_capacity(32, 2, 4, 0.25), 4);   // 0.25 x 64 / 4
  EXPECT_EQ(expert_capacity(10, 1, 3, 1.0), 4);    // ceil(3.33)
  EXPECT_EQ(expert_capacity(32, 2, 2, 0.25), 8);   // moe_test.cpp's hand count
  EXPECT_EQ(expert_capacity(4, 1, 8, 0.1), 1);     // at least one
  EXPECT_EQ(expert_capacity(32, 2, 4, 0.0), 0);    // no limit
}

TEST(MoeRouting, LoadBalancingLossIsExpertsTimesSumOfShareTimesMeanProbability) {
  const Routing r = route(logits(), 2, 2);
  // Assignments before capacity: e0 3, e1 3, e2 2 of 8. Mean probabilities from the softmax rows.
  const double a = std::exp(3.0), b = std::exp(2.0), one = 1.0, z = a + b + one;
  const double p0 = (a + a + a + one) / z / 4, p1 = (b + one + b + a) / z / 4, p2 = (one + b + one + b) / z / 4;
  const double expected = 3.0 * (3.0 / 8 * p0 + 3.0 / 8 * p1 + 2.0 / 8 * p2);
  EXPECT_NEAR(load_balancing_loss(r).item<double>(), expected, 1e-6);
  // Perfect balance: two tokens, two experts, top-1, opposite choices: f = P = (1/2, 1/2) -> 1.
  const Routing balanced = route(at::tensor({1.0f, -1.0f, -1.0f, 1.0f}).view({2, 2}), 1, 0);
  EXPECT_NEAR(load_balancing_loss(balanced).item<double>(), 1.0, 1e-6);
}

TEST(MoeRouting, TheLoadBalancingGradientReachesTheRouterScaledByItsWeight) {
  const int64_t h = 8, f = 4, experts = 3;
  at::manual_seed(7);
  // 7 tokens x top-2 = 14 assignments over 3 experts: the shares f cannot all be 1/3, where
  // experts x sum f P would be constant (sum P = 1) and its gradient zero.
  const at::Tensor x = at::randn({1, 7, h});
  std::vector<at::Tensor> base{at::randn({experts, h})};
  for (int e = 0; e < experts; ++e) {
    base.push_back(at::randn({f, h}) * 0.3);
    base.push_back(at::randn({f, h}) * 0.3);
    base.push_back(at::randn({h, f}) * 0.3);
  }
  costmodel::MoeSpec spec;
  spec.experts = experts;
  spec.top_k = 2;
  const auto router_grad = [&](double scale, bool aux_only) {
    std::vector<at::Tensor> p;
    for (const at::Tensor& t : base) p.push_back(t.clone().requires_grad_(true));
    if (aux_only) {
      const Routing r = route(at::linear(x.reshape({-1, h}), p[0]), 2, 0);
      torch::autograd::backward({load_balancing_loss(r)});
    } else {
      torch::autograd::backward({moe_mlp(spec, x, p, MoeRun{scale, nullptr}).sum()});
    }
    return p[0].grad().clone();
  };
  const at::Tensor with = router_grad(0.5, false), without = router_grad(0.0, false), aux = router_grad(0.0, true);
  EXPECT_TRUE(at::allclose(with - without, 0.5 * aux, 1e-5, 1e-6)) << (with - without) << aux;
  EXPECT_GT(aux.abs().max().item<double>(), 1e-4);  // the loss does depend on the router
}

}  // namespace
}  // namespace trainplan::executor
