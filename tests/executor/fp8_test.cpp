// fp8 training's casts and GEMMs (executor/src/model/fp8.hpp) and the fused paths that take them
// (fused_ops.hpp linear_into, norm_linears, swiglu_down with fp8), on CPU (LibTorch's _scaled_mm
// runs there) and, where a CUDA device is visible, on it (cuBLASLt's fp8 GEMM and
// cuda_kernels.cu's fp8_cast). Two references for each GEMM:
//  - the float32 product of the dequantised fp8 operands (data x inverse scale): what the scaled
//    GEMM must compute, up to float32 accumulation and the bf16 rounding of its output (2^-9
//    relative, here 0.01 of the largest value, which also covers fast accumulation);
//  - the float32 product of the original operands: fp8 rounds each operand to 3 mantissa bits
//    (e4m3: a relative error uniform within +-2^-4, standard deviation 2^-4 / sqrt(3) = 0.036) or
//    2 (e5m2: 0.072), so a product of two e4m3 operands is off by about 0.05 of its typical size,
//    and one with an e5m2 gradient by about 0.08; the test bounds the largest error at 0.25 of
//    the largest value and the root-mean-square error at 0.12 of the root-mean-square value, and
//    requires it to be above 0.005 (the GEMM did round to fp8).

#include <cmath>
#include <vector>

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "fp8.hpp"
#include "fused_ops.hpp"
#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
#include "cuda_kernels.hpp"
#endif

namespace trainplan::executor {
namespace {

struct Fp8 : ::testing::TestWithParam<at::DeviceType> {
  void SetUp() override {
    if (GetParam() == at::kCUDA && !at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  }
  [[nodiscard]] at::TensorOptions bf16() const { return at::TensorOptions().dtype(at::kBFloat16).device(GetParam()); }
};

double max_error(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / b.to(at::kDouble).abs().max().item<double>();
}
double rms_error(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor d = a.to(at::kDouble) - b.to(at::kDouble);
  return std::sqrt(d.pow(2).mean().item<double>() / b.to(at::kDouble).pow(2).mean().item<double>());
}
at::Tensor dequantised(const fp8::Cast& c) { return c.data.to(at::kFloat) * c.inverse_scale; }

// The checks of one GEMM result against both references (see the top of the file).
void expect_fp8_product(const at::Tensor& got, const at::Tensor& of_dequantised, const at::Tensor& exact, const char* what) {
  EXPECT_LT(max_error(got, of_dequantised), 0.01) << what << ": not the product of its fp8 operands";
  EXPECT_LT(max_error(got, exact), 0.25) << what;
  const double rms = rms_error(got, exact);
  EXPECT_LT(rms, 0.12) << what;
  EXPECT_GT(rms, 0.005) << what << ": no fp8 rounding";
}

TEST_P(Fp8, CastScalesTheLargestValueToTheTypesMaximum) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({48, 80}, bf16()) * 3;
  for (const at::ScalarType type : {fp8::kForwardType, fp8::kGradientType}) {
    const fp8::Cast c = fp8::cast(x, type);
    const double max = fp8::max_of(type);
    EXPECT_DOUBLE_EQ(c.data.to(at::kFloat).abs().max().item<double>(), max);  // amax x (max / amax), exactly representable
    EXPECT_NEAR(c.inverse_scale.item<double>(), x.to(at::kFloat).abs().max().item<double>() / max, 1e-6 * c.inverse_scale.item<double>());
    // Values come back within fp8's rounding: half an ulp, 2^-4 (e4m3) or 2^-3 (e5m2) relative.
    const double ulp = type == fp8::kForwardType ? std::pow(2.0, -3) : std::pow(2.0, -2);
    const at::Tensor back = dequantised(c);
    const at::Tensor big = x.to(at::kFloat).abs() > 0.1;  // away from fp8's subnormals
    EXPECT_LE(((back - x.to(at::kFloat)).abs() / x.to(at::kFloat).abs()).masked_select(big).max().item<double>(), ulp / 2 + 1e-6);
  }
  // A given amax sets the scale (a recomputed tensor cast as its forward was); values above it saturate.
  const fp8::Cast half = fp8::cast(x, fp8::kForwardType, fp8::absolute_max(x) / 2);
  EXPECT_DOUBLE_EQ(half.data.to(at::kFloat).abs().max().item<double>(), 448.0);
  // An all-zero tensor casts to zeros (the amax floor of 1e-12 keeps the scale finite).
  const fp8::Cast zeros = fp8::cast(at::zeros({16, 16}, bf16()), fp8::kForwardType);
  EXPECT_EQ(zeros.data.to(at::kFloat).abs().max().item<double>(), 0.0);
  EXPECT_TRUE(std::isfinite(zeros.inverse_scale.item<double>()));
}

TEST_P(Fp8, ScaledGemmMatchesFloat32Reference) {
  at::manual_seed(5);
  const at::Tensor x = at::randn({64, 128}, bf16()), w = at::randn({96, 128}, bf16()) * 0.05;
  const fp8::Cast xc = fp8::cast(x, fp8::kForwardType);
  at::Tensor w_amax;
  const at::Tensor y = fp8::forward(xc, w, w_amax);
  ASSERT_EQ(y.scalar_type(), at::kBFloat16);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{64, 96}));
  const fp8::Cast wc = fp8::cast(w, fp8::kForwardType, w_amax);
  expect_fp8_product(y, dequantised(xc).mm(dequantised(wc).t()), x.to(at::kFloat).mm(w.to(at::kFloat).t()), "forward");
  // Dimensions that are not multiples of 16 are refused with the shapes named.
  EXPECT_THROW((void)fp8::forward(fp8::cast(at::randn({8, 128}, bf16()), fp8::kForwardType), w, w_amax), std::invalid_argument);
}

TEST_P(Fp8, LinearIntoGradientsAreTheFp8Products) {
  at::manual_seed(7);
  const at::Tensor x = at::randn({2, 32, 128}, bf16()).requires_grad_(true), w = (at::randn({64, 128}, bf16()) * 0.05).requires_grad_(true);
  const at::Tensor g = at::randn({2, 32, 64}, bf16());
  const at::Tensor y = linear_into(x, w, at::Tensor(), /*fp8=*/true);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 32, 64}));
  const std::vector<at::Tensor> grads = torch::autograd::grad({y}, {x, w}, {g});
  const at::Tensor x32 = x.detach().reshape({-1, 128}).to(at::kFloat), w32 = w.detach().to(at::kFloat), g32 = g.reshape({-1, 64}).to(at::kFloat);
  const fp8::Cast gc = fp8::cast(g.reshape({-1, 64}), fp8::kGradientType), xc = fp8::cast(x.detach().reshape({-1, 128}), fp8::kForwardType);
  const fp8::Cast wc = fp8::cast(w.detach(), fp8::kForwardType);
  expect_fp8_product(grads[0].reshape({-1, 128}), dequantised(gc).mm(dequantised(wc)), g32.mm(w32), "input gradient");
  expect_fp8_product(grads[1], dequantised(gc).t().mm(dequantised(xc)), g32.t().mm(x32), "weight gradient");
  // Into a float32 sum: the same gradient added, none returned.
  const at::Tensor sum = at::ones({64, 128}, bf16().dtype(at::kFloat));
  const at::Tensor y2 = linear_into(x, w, sum, /*fp8=*/true);
  const std::vector<at::Tensor> grads2 = torch::autograd::grad({y2}, {x, w}, {g}, std::nullopt, false, /*allow_unused=*/true);
  EXPECT_FALSE(grads2[1].defined());
  EXPECT_LT(max_error(sum - 1, grads[1].to(at::kFloat)), 0.01);
}

TEST_P(Fp8, FusedPathsInFp8MatchTheirBf16Paths) {
  // norm_linears and swiglu_down in fp8 against the same functions in bf16: the fp8 rounding of
  // each GEMM's operands (see the top) and nothing else, for the outputs and every gradient.
  at::manual_seed(11);
  const int64_t h = 128, f = 256;
  const at::Tensor x = at::randn({1, 64, h}, bf16()).requires_grad_(true), nw = (1 + 0.1 * at::randn({h}, bf16())).requires_grad_(true);
  const at::Tensor wq = (at::randn({h, h}, bf16()) * 0.05).requires_grad_(true), wa = (at::randn({16, h}, bf16()) * 0.05).requires_grad_(true);
  const at::Tensor probe_q = at::randn({1, 64, h}, bf16()), probe_a = at::randn({1, 64, 16}, bf16());
  std::vector<std::vector<at::Tensor>> runs;
  for (const std::size_t fp8_weights : {std::size_t{0}, std::size_t{1}}) {  // wa (a LoRA A matrix) stays bf16
    const std::vector<at::Tensor> out = norm_linears(x, nw, 1e-5, {wq, wa}, {}, {}, false, {}, fp8_weights);
    std::vector<at::Tensor> r = torch::autograd::grad({(out[0] * probe_q).sum() + (out[1] * probe_a).sum()}, {x, nw, wq, wa});
    r.insert(r.begin(), out.begin(), out.end());
    runs.push_back(r);
  }
  const char* names[] = {"q output", "A output", "x gradient", "norm weight gradient", "q weight gradient", "A weight gradient"};
  for (std::size_t k = 0; k < runs[0].size(); ++k) {
    const double rms = rms_error(runs[1][k], runs[0][k]);
    EXPECT_LT(rms, 0.12) << names[k];
    if (k == 1) EXPECT_EQ(rms, 0.0) << names[k] << ": the bf16 weight's output must not change";
    else if (k != 5) EXPECT_GT(rms, 0.005) << names[k] << ": no fp8 rounding";
  }
  const at::Tensor gate = at::randn({64, f}, bf16()).requires_grad_(true), up = at::randn({64, f}, bf16()).requires_grad_(true);
  const at::Tensor down = (at::randn({h, f}, bf16()) * 0.05).requires_grad_(true), probe = at::randn({64, h}, bf16());
  std::vector<std::vector<at::Tensor>> mlp;
  for (const bool fp8 : {false, true}) {
    const at::Tensor y = swiglu_down(gate, up, down, {}, fp8);
    std::vector<at::Tensor> r = torch::autograd::grad({(y * probe).sum()}, {gate, up, down});
    r.insert(r.begin(), y);
    mlp.push_back(r);
  }
  for (std::size_t k = 0; k < mlp[0].size(); ++k) {
    const double rms = rms_error(mlp[1][k], mlp[0][k]);
    EXPECT_LT(rms, 0.12) << "swiglu_down " << k;
    EXPECT_GT(rms, 0.005) << "swiglu_down " << k << ": no fp8 rounding";
  }
}

#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
TEST_P(Fp8, CastKernelEqualsTheLibTorchPath) {
  // cuda_kernels.cu's fp8_cast (on the GPU, or its per-thread work on the host) against the ATen
  // path's float32 scale, saturation and round-to-nearest-even: bit for bit, both fp8 types,
  // with a tail of 5 values after the 8-value chunks.
  at::manual_seed(13);
  const at::Tensor x = at::randn({1029}, bf16().device(at::kCPU)) * 7;
  const at::Tensor amax = fp8::absolute_max(x) * 0.75;  // some values saturate
  for (const at::ScalarType type : {fp8::kForwardType, fp8::kGradientType}) {
    const fp8::Cast want = fp8::cast(x, type, amax);  // on the CPU: the ATen path
    at::Tensor got;
    if (GetParam() == at::kCUDA) {
      got = fp8::cast(x.cuda(), type, amax.cuda()).data.cpu();
    } else {
      got = at::empty_like(want.data);
      cuda_kernels::fp8_cast_on_host(x.data_ptr(), static_cast<uint8_t*>(got.data_ptr()), amax.item<float>(),
                                     static_cast<float>(fp8::max_of(type)), type == fp8::kGradientType, x.numel(), /*wide=*/true);
    }
    EXPECT_TRUE(at::equal(got.view(at::kByte), want.data.view(at::kByte))) << c10::toString(type);
  }
  // fp8_cast_transpose: both layouts in one pass, over a shape with partial 32 x 32 tiles.
  const at::Tensor m = at::randn({70, 45}, bf16().device(at::kCPU)) * 3;
  const at::Tensor m_amax = fp8::absolute_max(m) * 0.75;
  for (const at::ScalarType type : {fp8::kForwardType, fp8::kGradientType}) {
    const fp8::Cast want = fp8::cast(m, type, m_amax, fp8::Layout::kBoth);
    ASSERT_TRUE(at::equal(want.transposed.view(at::kByte), want.data.t().contiguous().view(at::kByte)));
    at::Tensor rows, transposed;
    if (GetParam() == at::kCUDA) {
      const fp8::Cast both = fp8::cast(m.cuda(), type, m_amax.cuda(), fp8::Layout::kBoth);
      rows = both.data.cpu();
      transposed = both.transposed.cpu();
      const fp8::Cast only = fp8::cast(m.cuda(), type, m_amax.cuda(), fp8::Layout::kTransposed);
      EXPECT_FALSE(only.data.defined());
      EXPECT_TRUE(at::equal(only.transposed.cpu().view(at::kByte), want.transposed.view(at::kByte)));
      EXPECT_NEAR(only.inverse_scale.item<double>(), want.inverse_scale.item<double>(), 0.0);
    } else {
      rows = at::empty_like(want.data);
      transposed = at::empty_like(want.transposed);
      cuda_kernels::fp8_cast_transpose_on_host(m.data_ptr(), static_cast<uint8_t*>(rows.data_ptr()), static_cast<uint8_t*>(transposed.data_ptr()),
                                               m_amax.item<float>(), static_cast<float>(fp8::max_of(type)), type == fp8::kGradientType, 70, 45);
    }
    EXPECT_TRUE(at::equal(rows.view(at::kByte), want.data.view(at::kByte))) << c10::toString(type);
    EXPECT_TRUE(at::equal(transposed.view(at::kByte), want.transposed.view(at::kByte))) << c10::toString(type);
  }
}
#endif

INSTANTIATE_TEST_SUITE_P(Devices, Fp8, ::testing::Values(at::kCPU, at::kCUDA),
                         [](const ::testing::TestParamInfo<at::DeviceType>& i) { return i.param == at::kCPU ? "Cpu" : "Cuda"; });

}  // namespace
}  // namespace trainplan::executor
