// The executor's fused paths (executor/src/model/fused_ops.hpp) against the plain ATen composition they
// replace (executor/src/model/model.cpp's reference path), on CPU: forward values and the gradients of
// every input. In float64 the two must agree to rounding (1e-12 relative: the same arithmetic in
// another order); in bfloat16 to a few units of bf16's rounding (2^-8 relative per operation).
// The same comparisons run in bf16 on a GPU, where the fused paths take executor/src/
// cuda_kernels.cu's kernels (when built with them); they skip where no CUDA device is visible.

#include <cmath>
#include <vector>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "cpu_memory.hpp"
#include "fused_ops.hpp"

namespace trainplan::executor {
namespace {

at::Tensor leaf(at::Tensor t) { return t.detach().requires_grad_(true); }

// max |a - b| / max(max |b|, tiny)
double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(b.to(at::kDouble).abs().max().item<double>(), 1e-30);
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / scale;
}

// Gradients of sum(out * probe) with respect to `inputs`, for a fixed random probe.
std::vector<at::Tensor> gradients(const at::Tensor& out, const std::vector<at::Tensor>& inputs, const at::Tensor& probe) {
  return torch::autograd::grad({(out * probe).sum()}, inputs);
}

at::Tensor rotate_half(const at::Tensor& x) {  // as model.cpp's apply_rotary
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

struct Where {
  at::ScalarType dtype;
  at::DeviceType device;
};

struct Dtypes : ::testing::TestWithParam<Where> {
  void SetUp() override {
    if (GetParam().device == at::kCUDA && !at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  }
  [[nodiscard]] double tolerance() const { return GetParam().dtype == at::kDouble ? 1e-12 : 4 * std::pow(2.0, -8); }
  [[nodiscard]] at::TensorOptions options() const { return at::TensorOptions().dtype(GetParam().dtype).device(GetParam().device); }
};

TEST_P(Dtypes, NormLinearsMatchNormThenLinears) {
  at::manual_seed(1);
  // Widths 16 and 2056 (= 8 x 257: on a GPU the norm kernel's second chunk of columns, held by
  // one thread of 256) over 37 rows; 6144 (its four-chunk variant, the last chunk partial) over
  // 1100 rows (more rows than its 1024 blocks: a block reduces a second row with the same
  // shared memory).
  for (const auto& [rows, h] : {std::pair<int64_t, int64_t>{37, 16}, {37, 2056}, {1100, 6144}}) {
    const at::Tensor x = leaf(at::randn({1, rows, h}, options())), nw = leaf(1 + 0.1 * at::randn({h}, options()));
    const at::Tensor w1 = leaf(at::randn({12, h}, options()) * 0.2), w2 = leaf(at::randn({4, h}, options()) * 0.2);
    const std::vector<at::Tensor> fused = norm_linears(x, nw, 1e-5, {w1, w2});
    const at::Tensor normed = at::rms_norm(x, {h}, nw, 1e-5);
    const std::vector<at::Tensor> plain = {at::linear(normed, w1), at::linear(normed, w2)};
    const at::Tensor p1 = at::randn({1, rows, 12}, options()), p2 = at::randn({1, rows, 4}, options());
    for (std::size_t i = 0; i < 2; ++i) EXPECT_LE(relative_error(fused[i], plain[i]), tolerance()) << "output " << i << ", h " << h;
    const auto gf = torch::autograd::grad({(fused[0] * p1).sum() + (fused[1] * p2).sum()}, {x, nw, w1, w2});
    const auto gp = torch::autograd::grad({(plain[0] * p1).sum() + (plain[1] * p2).sum()}, {x, nw, w1, w2});
    const char* names[] = {"x", "norm weight", "w1", "w2"};
    for (std::size_t i = 0; i < gf.size(); ++i) EXPECT_LE(relative_error(gf[i], gp[i]), tolerance()) << names[i] << ", h " << h;
  }
}

// `residual`: x comes back last, the same memory (a view, no copy), and the gradient the residual
// stream gives it is added to the norm's input gradient (on a GPU inside the norm kernel), as
// autograd adds the two uses of x in the plain composition: x + branch after the norm, and the
// norm. The same widths as above; then a stream whose linears take no gradient.
TEST_P(Dtypes, NormLinearsHandTheResidualStreamOnAndAddItsGradient) {
  at::manual_seed(3);
  for (const auto& [rows, h] : {std::pair<int64_t, int64_t>{37, 16}, {37, 2056}, {1100, 6144}}) {
    const at::Tensor x = leaf(at::randn({1, rows, h}, options())), nw = leaf(1 + 0.1 * at::randn({h}, options()));
    const at::Tensor w1 = leaf(at::randn({12, h}, options()) * 0.2), w2 = leaf(at::randn({4, h}, options()) * 0.2);
    const std::vector<at::Tensor> fused = norm_linears(x, nw, 1e-5, {w1, w2}, {}, {}, /*residual=*/true);
    ASSERT_EQ(fused.size(), 3U);
    EXPECT_EQ(fused[2].data_ptr(), x.data_ptr()) << "the stream is x itself";
    EXPECT_TRUE(at::equal(fused[2], x));
    const at::Tensor normed = at::rms_norm(x, {h}, nw, 1e-5);
    const std::vector<at::Tensor> plain = {at::linear(normed, w1), at::linear(normed, w2)};
    const at::Tensor p1 = at::randn({1, rows, 12}, options()), p2 = at::randn({1, rows, 4}, options());
    const at::Tensor branch = at::randn({1, rows, h}, options()), p3 = at::randn({1, rows, h}, options());
    const auto gf = torch::autograd::grad({(fused[0] * p1).sum() + (fused[1] * p2).sum() + ((fused[2] + branch) * p3).sum()}, {x, nw, w1, w2});
    const auto gp = torch::autograd::grad({(plain[0] * p1).sum() + (plain[1] * p2).sum() + ((x + branch) * p3).sum()}, {x, nw, w1, w2});
    const char* names[] = {"x", "norm weight", "w1", "w2"};
    for (std::size_t i = 0; i < gf.size(); ++i) EXPECT_LE(relative_error(gf[i], gp[i]), tolerance()) << names[i] << ", h " << h;
    // The norm's own share alone must not match: the stream's gradient was added.
    EXPECT_GT(relative_error(gf[0], gp[0] - p3), 10 * tolerance()) << "h " << h;
  }
  const at::Tensor x = leaf(at::randn({2, 8, 16}, options())), nw = leaf(1 + 0.1 * at::randn({16}, options()));
  const at::Tensor w = leaf(at::randn({4, 16}, options()) * 0.2), probe = at::randn({2, 8, 16}, options());
  const std::vector<at::Tensor> fused = norm_linears(x, nw, 1e-5, {w}, {}, {}, /*residual=*/true);
  const auto g = torch::autograd::grad({(fused[1] * probe).sum()}, {x});
  EXPECT_TRUE(at::equal(g[0], probe)) << "only the stream took a gradient";
}

// `branch`: the norm's input is x + branch (on a GPU one kernel with the norm), the stream handed
// on is that sum, and x and the branch both get its gradient, as from the plain composition's add.
TEST_P(Dtypes, NormLinearsOfASumTakeTheResidualAddInTheNorm) {
  at::manual_seed(4);
  for (const auto& [rows, h] : {std::pair<int64_t, int64_t>{37, 16}, {37, 2056}, {1100, 6144}}) {
    const at::Tensor x = leaf(at::randn({1, rows, h}, options())), branch = leaf(at::randn({1, rows, h}, options()));
    const at::Tensor nw = leaf(1 + 0.1 * at::randn({h}, options()));
    const at::Tensor w1 = leaf(at::randn({12, h}, options()) * 0.2), w2 = leaf(at::randn({4, h}, options()) * 0.2);
    const std::vector<at::Tensor> fused = norm_linears(x, nw, 1e-5, {w1, w2}, {}, {}, /*residual=*/true, branch);
    ASSERT_EQ(fused.size(), 3U);
    const at::Tensor sum = x + branch;
    EXPECT_TRUE(at::equal(fused[2], sum)) << "the stream is the rounded sum, h " << h;
    const at::Tensor normed = at::rms_norm(sum, {h}, nw, 1e-5);
    const std::vector<at::Tensor> plain = {at::linear(normed, w1), at::linear(normed, w2)};
    for (std::size_t i = 0; i < 2; ++i) EXPECT_LE(relative_error(fused[i], plain[i]), tolerance()) << "output " << i << ", h " << h;
    const at::Tensor p1 = at::randn({1, rows, 12}, options()), p2 = at::randn({1, rows, 4}, options());
    const at::Tensor p3 = at::randn({1, rows, h}, options());
    const auto gf = torch::autograd::grad({(fused[0] * p1).sum() + (fused[1] * p2).sum() + (fused[2] * p3).sum()}, {x, branch, nw, w1, w2});
    const auto gp = torch::autograd::grad({(plain[0] * p1).sum() + (plain[1] * p2).sum() + (sum * p3).sum()}, {x, branch, nw, w1, w2});
    const char* names[] = {"x", "branch", "norm weight", "w1", "w2"};
    for (std::size_t i = 0; i < gf.size(); ++i) EXPECT_LE(relative_error(gf[i], gp[i]), tolerance()) << names[i] << ", h " << h;
  }
  const at::Tensor x = at::randn({2, 8, 16}, options()), nw = at::ones({16}, options()), w = at::randn({4, 16}, options());
  EXPECT_THROW((void)norm_linears(x, nw, 1e-5, {w}, {}, {}, true, at::randn({2, 8, 8}, options())), std::invalid_argument);
  EXPECT_THROW((void)norm_linears(x, at::ones({8}, options()), 1e-5, {w}), std::invalid_argument);  // the kernel would read past it
}

TEST_P(Dtypes, RotaryMatchesRotateHalf) {
  at::manual_seed(2);
  // Head sizes 8 and 12 (the CUDA kernel's element-wise path) and 16 and 64 (its 8-wide path:
  // half a head a multiple of 8, as Llama's 64 and 128).
  for (const int64_t dim : {8, 12, 16, 64}) {
    // [batch, heads, seq, head_dim] as a transposed view of [batch, seq, heads, head_dim], as in model.cpp.
    const at::Tensor x = leaf(at::randn({2, 6, 3, dim}, options())).transpose(1, 2);
    const at::Tensor angles = at::outer(at::arange(6, at::kDouble), at::rand({dim / 2}, at::kDouble)).to(GetParam().device);
    const at::Tensor cos = at::cat({angles, angles}, -1).cos().to(GetParam().dtype), sin = at::cat({angles, angles}, -1).sin().to(GetParam().dtype);
    const at::Tensor fused = rotary_embedding(x, cos, sin);
    const at::Tensor plain = x * cos + rotate_half(x) * sin;
    EXPECT_LE(relative_error(fused, plain), tolerance()) << "head_dim " << dim;
    const at::Tensor probe = at::randn(plain.sizes(), options());
    const at::Tensor base = x;  // the view's base leaf receives the gradient through the view
    EXPECT_LE(relative_error(gradients(fused, {base}, probe)[0], gradients(plain, {base}, probe)[0]), tolerance()) << "head_dim " << dim;
  }
}

// Gradient-accumulation fusion: each weight's gradient lands in its float32 sum (on top of what
// an earlier micro-batch left there), equal to the plain path's gradient, and backward returns
// none for the weight; every other input's gradient is unchanged.
struct Sums {
  at::TensorOptions options;
  std::vector<at::Tensor> earlier, sums;
  // A sum per shape, float32 (float64 for float64 weights), holding an earlier gradient.
  Sums(const at::TensorOptions& weights, const std::vector<std::vector<int64_t>>& shapes)
      : options(weights.dtype(weights.dtype() == at::kDouble ? at::kDouble : at::kFloat)) {
    for (const auto& shape : shapes) {
      earlier.push_back(0.01 * at::randn(shape, options));
      sums.push_back(earlier.back().clone());
    }
  }
  [[nodiscard]] at::Tensor added(std::size_t i) const { return sums[i] - earlier[i]; }
};

TEST_P(Dtypes, NormLinearsAddTheWeightGradientsIntoTheirSums) {
  at::manual_seed(11);
  const at::Tensor x = leaf(at::randn({2, 8, 16}, options())), nw = leaf(1 + 0.1 * at::randn({16}, options()));
  const at::Tensor w1 = leaf(at::randn({12, 16}, options()) * 0.2), w2 = leaf(at::randn({4, 16}, options()) * 0.2);
  const at::Tensor w3 = leaf(at::randn({4, 16}, options()) * 0.2);
  Sums s(options(), {{12, 16}, {4, 16}, {4, 16}, {16}});
  const std::vector<at::Tensor> fused = norm_linears(x, nw, 1e-5, {w1, w2, w3}, {s.sums[0], s.sums[1], s.sums[2]}, s.sums[3]);
  const at::Tensor normed = at::rms_norm(x, {16}, nw, 1e-5);
  const std::vector<at::Tensor> plain = {at::linear(normed, w1), at::linear(normed, w2), at::linear(normed, w3)};
  std::vector<at::Tensor> probes;
  at::Tensor lf = at::zeros({}, options()), lp = at::zeros({}, options());
  for (std::size_t i = 0; i < 3; ++i) {
    probes.push_back(at::randn(plain[i].sizes(), options()));
    lf = lf + (fused[i] * probes[i]).sum();
    lp = lp + (plain[i] * probes[i]).sum();
  }
  const auto gf = torch::autograd::grad({lf}, {x, nw, w1, w2, w3}, {}, false, false, /*allow_unused=*/true);
  const auto gp = torch::autograd::grad({lp}, {x, nw, w1, w2, w3});
  EXPECT_LE(relative_error(gf[0], gp[0]), tolerance()) << "x";
  EXPECT_FALSE(gf[1].defined()) << "the norm weight's gradient came out of backward";
  EXPECT_LE(relative_error(s.added(3), gp[1]), tolerance()) << "norm weight in its sum";
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(gf[2 + i].defined()) << "weight " << i << " came out of backward";
    EXPECT_LE(relative_error(s.added(i), gp[2 + i]), tolerance()) << "weight " << i << " in its sum";
  }
  EXPECT_THROW((void)norm_linears(x, nw, 1e-5, {w1, w2}, {s.sums[0]}), std::invalid_argument);  // one sum per weight
  EXPECT_THROW((void)norm_linears(x, nw, 1e-5, {w1}, {s.sums[1]}), std::invalid_argument);       // the weight's shape
}

TEST_P(Dtypes, LinearIntoAndSwigluDownAddTheWeightGradientIntoItsSum) {
  at::manual_seed(12);
  const at::Tensor a = leaf(at::randn({2, 5, 24}, options())), w = leaf(at::randn({10, 24}, options()) * 0.2);
  const at::Tensor gate = leaf(at::randn({2, 5, 24}, options())), up = leaf(at::randn({2, 5, 24}, options()));
  Sums s(options(), {{10, 24}, {10, 24}});
  const at::Tensor probe = at::randn({2, 5, 10}, options());
  const auto check = [&](const at::Tensor& fused, const at::Tensor& plain, const std::vector<at::Tensor>& inputs, std::size_t sum,
                         const char* what) {
    EXPECT_LE(relative_error(fused, plain), tolerance()) << what;
    std::vector<at::Tensor> with_weight = inputs;
    with_weight.push_back(w);
    const auto gf = torch::autograd::grad({(fused * probe).sum()}, with_weight, {}, false, false, /*allow_unused=*/true);
    const auto gp = torch::autograd::grad({(plain * probe).sum()}, with_weight);
    for (std::size_t i = 0; i < inputs.size(); ++i) EXPECT_LE(relative_error(gf[i], gp[i]), tolerance()) << what << " input " << i;
    EXPECT_FALSE(gf.back().defined()) << what;
    EXPECT_LE(relative_error(s.added(sum), gp.back()), tolerance()) << what << ": the weight's gradient in its sum";
  };
  check(linear_into(a, w, s.sums[0]), at::linear(a, w), {a}, 0, "linear_into");
  check(swiglu_down(gate, up, w, s.sums[1]), at::linear(at::silu(gate) * up, w), {gate, up}, 1, "swiglu_down");
  EXPECT_THROW((void)linear_into(a, w, at::zeros({10, 24}, options().dtype(at::kInt))), std::invalid_argument);
}

TEST_P(Dtypes, EmbeddingIntoScattersRepeatedRowsIntoTheSum) {
  at::manual_seed(13);
  const at::Tensor table = leaf(at::randn({10, 8}, options()));
  // Rows 3 and 7 repeat within and across sequences; rows 0, 2, 4, 6, 8, 9 are never used.
  const at::Tensor tokens = at::tensor({3, 7, 3, 1, 5, 7, 7, 3}, at::TensorOptions().dtype(at::kLong)).view({2, 4}).to(GetParam().device);
  Sums s(options(), {{10, 8}});
  const at::Tensor fused = embedding_into(table, tokens, s.sums[0]);
  const at::Tensor plain = at::embedding(table, tokens);
  EXPECT_TRUE(at::equal(fused, plain));
  const at::Tensor probe = at::randn(plain.sizes(), options());
  const auto gf = torch::autograd::grad({(fused * probe).sum()}, {table}, {}, false, false, /*allow_unused=*/true);
  const auto gp = torch::autograd::grad({(plain * probe).sum()}, {table});
  EXPECT_FALSE(gf[0].defined());
  EXPECT_LE(relative_error(s.added(0), gp[0]), tolerance());
  // Unused rows keep exactly what the earlier micro-batch left.
  EXPECT_TRUE(at::equal(s.sums[0][0], s.earlier[0][0]));
}

// The product alone (a LoRA-adapted down projection's input): silu(gate) is not kept, and the
// gradient flowing in is not overwritten (autograd may hand the same tensor to others).
TEST_P(Dtypes, SwigluMatchesSiluTimesUpAndLeavesItsGradientAlone) {
  at::manual_seed(8);
  const at::Tensor gate = leaf(at::randn({2, 5, 24}, options())), up = leaf(at::randn({2, 5, 24}, options()));
  const at::Tensor fused = swiglu(gate, up), plain = at::silu(gate) * up;
  EXPECT_LE(relative_error(fused, plain), tolerance());
  const at::Tensor probe = at::randn(plain.sizes(), options()), kept = probe.clone();
  const auto gf = torch::autograd::grad({fused}, {gate, up}, {probe}), gp = torch::autograd::grad({plain}, {gate, up}, {probe});
  EXPECT_TRUE(at::equal(probe, kept));
  EXPECT_LE(relative_error(gf[0], gp[0]), tolerance()) << "gate";
  EXPECT_LE(relative_error(gf[1], gp[1]), tolerance()) << "up";
}

TEST_P(Dtypes, SwigluDownMatchesSiluTimesUpThenDown) {
  at::manual_seed(3);
  const at::Tensor gate = leaf(at::randn({2, 5, 24}, options())), up = leaf(at::randn({2, 5, 24}, options()));
  const at::Tensor down = leaf(at::randn({10, 24}, options()) * 0.2);
  const at::Tensor fused = swiglu_down(gate, up, down);
  const at::Tensor plain = at::linear(at::silu(gate) * up, down);
  EXPECT_LE(relative_error(fused, plain), tolerance());
  const at::Tensor probe = at::randn(plain.sizes(), options());
  const auto gf = gradients(fused, {gate, up, down}, probe), gp = gradients(plain, {gate, up, down}, probe);
  const char* names[] = {"gate", "up", "down"};
  for (std::size_t i = 0; i < gf.size(); ++i) EXPECT_LE(relative_error(gf[i], gp[i]), tolerance()) << names[i];
}

TEST_P(Dtypes, ChunkedCrossEntropyMatchesFloat32CrossEntropyOfTheLogits) {
  at::manual_seed(4);
  const int64_t n = 40, h = 16, vocab = 50;
  const at::Tensor x = leaf(at::randn({n, h}, options())), w = leaf(at::randn({vocab, h}, options()) * 0.3);
  const at::Tensor targets = at::randint(0, vocab, {n}, at::TensorOptions().dtype(at::kLong).device(GetParam().device));
  // Chunks of 16 rows: 16 + 16 + 8, so the last chunk is partial.
  const at::Tensor fused = linear_cross_entropy(x, w, targets, 16) * 0.25;  // a multiplier, as the engine's
  // The loss is float32 on both paths (model.cpp: logits .to(kFloat)), so float64 inputs agree to
  // float32 rounding (2^-24 per operation; 1e-6 leaves room for the sums over 50 logits).
  const at::Tensor plain = at::cross_entropy_loss(at::linear(x, w).to(at::kFloat), targets) * 0.25;
  // On a GPU, cuBLAS may round a chunk's logits other than the whole matrix's (bf16 logits:
  // 2^-8 relative each, averaging out over the tokens): 1e-3.
  const double tol = GetParam().dtype == at::kDouble ? 1e-6 : tolerance();
  const double loss_tol = GetParam().device == at::kCUDA ? 1e-3 : 1e-6;
  EXPECT_NEAR(fused.item<double>(), plain.item<double>(), loss_tol * plain.item<double>());
  const auto gf = torch::autograd::grad({fused}, {x, w}), gp = torch::autograd::grad({plain}, {x, w});
  EXPECT_LE(relative_error(gf[0], gp[0]), tol) << "x";
  EXPECT_LE(relative_error(gf[1], gp[1]), tol) << "weight";
}

INSTANTIATE_TEST_SUITE_P(FusedOps, Dtypes,
                         ::testing::Values(Where{at::kDouble, at::kCPU}, Where{at::kBFloat16, at::kCPU}, Where{at::kBFloat16, at::kCUDA}),
                         [](const auto& info) {
                           return std::string(info.param.device == at::kCUDA ? "Cuda" : "Cpu") +
                                  (info.param.dtype == at::kDouble ? "Float64" : "BFloat16");
                         });

TEST(FusedOps, CrossEntropyChunksKeepLogitsWithin1GiB) {
  // Llama 3's vocabulary: 1 GiB / (128256 x 4 bytes) = 2093 rows, down to a multiple of 64; in
  // bf16 (the CUDA kernel) 4186 -> 4160.
  EXPECT_EQ(cross_entropy_chunk_tokens(128256, 4), 2048);
  EXPECT_EQ(cross_entropy_chunk_tokens(128256, 2), 4160);
  // GPT-2's: 1 GiB / (50257 x 4) = 5341 -> 5312.
  EXPECT_EQ(cross_entropy_chunk_tokens(50257, 4), 5312);
  EXPECT_EQ(cross_entropy_chunk_tokens(int64_t{1} << 40, 4), 64);  // never fewer than 64 rows
}

TEST_P(Dtypes, ChunkedCrossEntropyAddsTheWeightGradientIntoAGivenSum) {
  at::manual_seed(5);
  const int64_t n = 40, h = 16, vocab = 50;
  const double multiplier = 0.25;
  const at::Tensor x = leaf(at::randn({n, h}, options())), w = leaf(at::randn({vocab, h}, options()) * 0.3);
  const at::Tensor targets = at::randint(0, vocab, {n}, at::TensorOptions().dtype(at::kLong).device(GetParam().device));
  // The sum already holds an earlier micro-batch's gradient: the new one is added to it.
  const at::Tensor earlier = 0.01 * at::randn({vocab, h}, options().dtype(at::kFloat));
  at::Tensor sum = earlier.clone();
  const at::Tensor fused = linear_cross_entropy(x, w, targets, 16, sum, multiplier) * multiplier;
  const at::Tensor plain = at::cross_entropy_loss(at::linear(x, w).to(at::kFloat), targets) * multiplier;
  const auto gf = torch::autograd::grad({fused}, {x, w}, {}, false, false, /*allow_unused=*/true);
  const auto gp = torch::autograd::grad({plain}, {x, w});
  EXPECT_FALSE(gf[1].defined()) << "the weight's gradient went into the sum, not out of backward";
  const double tol = GetParam().dtype == at::kDouble ? 1e-6 : tolerance();
  EXPECT_LE(relative_error(gf[0], gp[0]), tol) << "x";
  EXPECT_LE(relative_error(sum - earlier, gp[1].to(at::kFloat)), tol) << "weight gradient in the sum";
  EXPECT_THROW((void)linear_cross_entropy(x, w, targets, 16, at::zeros({vocab, h + 1}, options().dtype(at::kFloat))),
               std::invalid_argument);
}

// fp16 loss scaling: the engine multiplies the loss by 65536 / accumulation. The logits' gradient
// (softmax - one_hot) / n must be scaled before it is rounded to fp16, as the reference path's
// backward scales it: unscaled, p / n for a 4000-way softmax over 64 tokens is about 4e-6 / 64 =
// 6e-8, the smallest fp16 subnormal, and most entries would flush to zero.
TEST(FusedOps, TheLossScaleIsAppliedBeforeTheSixteenBitRounding) {
  at::manual_seed(6);
  const int64_t n = 64, h = 32, vocab = 4000;
  const double multiplier = 65536.0;
  const auto f16 = at::TensorOptions().dtype(at::kHalf);
  const at::Tensor x = leaf(at::randn({n, h}, f16)), w = leaf(at::randn({vocab, h}, f16) * 0.1);
  const at::Tensor targets = at::randint(0, vocab, {n}, at::kLong);
  const at::Tensor fused = linear_cross_entropy(x, w, targets, 16, {}, multiplier) * multiplier;
  const at::Tensor plain = at::cross_entropy_loss(at::linear(x, w).to(at::kFloat), targets) * multiplier;
  const auto gf = torch::autograd::grad({fused}, {x, w}), gp = torch::autograd::grad({plain}, {x, w});
  ASSERT_TRUE(at::isfinite(gf[0]).all().item<bool>());
  // fp16 rounds to 2^-11 relative; a few roundings on each side.
  EXPECT_LE(relative_error(gf[0], gp[0]), 8 * std::pow(2.0, -11)) << "x";
  EXPECT_LE(relative_error(gf[1], gp[1]), 8 * std::pow(2.0, -11)) << "weight";
}

// The ATen path keeps one chunk of 16-bit logits, as the CUDA kernel does, and turns them into
// their gradient in place, 16 bf16 rows at a time through float32 (the cost model counts the
// chunk in the compute dtype: compute.cpp ends_cost). By hand, n = 256 rows, vocab 4096: the bf16
// logits are 256 x 4096 x 2 = 2 MiB, a float32 block of 16 rows 256 KiB; x's gradient 256 x 16 x 2
// = 8 KiB, the weight's float32 gradient 4096 x 16 x 4 = 256 KiB, the GEMMs' own CPU buffers a
// few hundred KiB more. Before (log-softmax widened to float32 from a float32 copy) the chunk
// took 2 + 4 + 4 MiB.
TEST(FusedOps, SixteenBitLogitsStayInTheirDtypeOnTheCpuPath) {
  using trainplan::executor::cpu_allocated_bytes;
  using trainplan::executor::cpu_peak_allocated_bytes;
  trainplan::executor::install_cpu_memory_counter();
  // The CPU GEMMs' buffers grow with the threads and differ by CPU (over the inputs on the lent
  // H100 machine's CPU: 6.9 MB on 16 threads, 3.4 MB on 2; under 3.1 MB on the development VM's
  // 2): 2 threads, and a bound of twice the logits (4 MiB), which the old path's 10 MiB exceeds.
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  at::manual_seed(9);
  const int64_t n = 256, h = 16, vocab = 4096;
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  const at::Tensor x = leaf(at::randn({n, h}, bf16)), w = leaf(at::randn({vocab, h}, bf16) * 0.3);
  const at::Tensor targets = at::randint(0, vocab, {n}, at::kLong);
  const double logits = n * vocab * 2.0;
  const double base = cpu_allocated_bytes();
  trainplan::executor::cpu_reset_peak();
  const at::Tensor fused = linear_cross_entropy(x, w, targets);
  const double peak = cpu_peak_allocated_bytes() - base;
  at::set_num_threads(threads);
  EXPECT_GE(peak, logits);
  EXPECT_LE(peak, 2 * logits) << "bytes over the inputs at the loss's peak";
  // And still the reference's values: bf16 logits, float32 log-softmax (2^-8 per rounding).
  const at::Tensor plain = at::cross_entropy_loss(at::linear(x, w).to(at::kFloat), targets);
  EXPECT_NEAR(fused.item<double>(), plain.item<double>(), 1e-5 * plain.item<double>());
  const auto gf = torch::autograd::grad({fused}, {x, w}), gp = torch::autograd::grad({plain}, {x, w});
  EXPECT_LE(relative_error(gf[0], gp[0]), 4 * std::pow(2.0, -8)) << "x";
  EXPECT_LE(relative_error(gf[1], gp[1]), 4 * std::pow(2.0, -8)) << "weight";
}

// A multiplier that is no power of two (accumulation 3) reaches every gradient exactly as the
// reference path applies it, the weight's in the sum included.
TEST(FusedOps, AMultiplierOfOneThirdScalesEveryGradientAlike) {
  at::manual_seed(7);
  const int64_t n = 48, h = 16, vocab = 40;
  const double multiplier = 1.0 / 3.0;
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  const at::Tensor x = leaf(at::randn({n, h}, bf16)), w = leaf(at::randn({vocab, h}, bf16) * 0.3);
  const at::Tensor targets = at::randint(0, vocab, {n}, at::kLong);
  at::Tensor sum = at::zeros({vocab, h}, at::kFloat);
  const at::Tensor fused = linear_cross_entropy(x, w, targets, 16, sum, multiplier) * multiplier;
  const at::Tensor plain = at::cross_entropy_loss(at::linear(x, w).to(at::kFloat), targets) * multiplier;
  const auto gf = torch::autograd::grad({fused}, {x}), gp = torch::autograd::grad({plain}, {x, w});
  EXPECT_LE(relative_error(gf[0], gp[0]), 4 * std::pow(2.0, -8)) << "x";
  EXPECT_LE(relative_error(sum, gp[1].to(at::kFloat)), 4 * std::pow(2.0, -8)) << "weight, in the sum";
}

TEST(FusedOps, KernelsChoiceIsParsedOrRefusedByName) {
  EXPECT_EQ(parse_kernels("fused"), Kernels::kFused);
  EXPECT_EQ(parse_kernels("reference"), Kernels::kReference);
  EXPECT_STREQ(kernels_name(Kernels::kFused), "fused");
  try {
    (void)parse_kernels("triton");
    FAIL() << "accepted an unknown choice";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("expected fused or reference, got \"triton\""), std::string::npos);
  }
}

}  // namespace
}  // namespace trainplan::executor
