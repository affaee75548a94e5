// Kernel tables in hardware profiles and the rates read from them (kernels.hpp): measured points
// come out exactly, sizes between them are interpolated, unaligned GEMMs run at the measured
// slowdown; malformed tables are errors naming the JSON pointer.

#include <cmath>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "test_support.hpp"
#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/kernels.hpp"

namespace trainplan {
namespace {

using namespace costmodel;

const HardwareProfile& h100() {
  static const HardwareProfile hw = testing::cluster("dgx-h100");
  return hw;
}

// shared/data/measured/h100-llama3.2-1b/h100_kernels.csv
TEST(KernelRates, MeasuredGemmShapesComeOutExactly) {
  const KernelRates rates(h100().gpu, Dtype::kBf16);
  ASSERT_TRUE(rates.measured());
  EXPECT_NEAR(rates.gemm(8192, 28672, 8192), 5.281680e-03, 1e-9);       // gemm_ffn_up, h 8192 tp1
  EXPECT_NEAR(rates.gemm(16384, 2048, 16384), 1.543539e-03, 1e-9);      // gemm_qkvo, h 16384 tp8
  EXPECT_NEAR(rates.gemm(8192, 128256, 4096), 1.268381e-02, 1e-9);      // gemm_logits, vocab 128256
  // (4096, 2048, 2048) was measured three times (qkvo tp1, ffn_up and ffn_down tp4): the mean.
  EXPECT_NEAR(rates.gemm(4096, 2048, 2048), (4.932640e-05 + 5.394720e-05 + 5.370880e-05) / 3, 1e-9);
}

TEST(KernelRates, GemmBetweenMeasuredShapesLiesBetweenTheirRates) {
  const KernelRates rates(h100().gpu, Dtype::kBf16);
  // tokens 12288 between the measured 8192 and 16384 of (8192 out, 8192 in).
  const double t = rates.gemm(12288, 8192, 8192);
  const double rate = 2.0 * 12288 * 8192 * 8192 / t;
  const double rate_lo = 2.0 * 8192 * 8192 * 8192 / 1.539576e-03, rate_hi = 2.0 * 16384 * 8192 * 8192 / 3.433727e-03;
  EXPECT_GT(rate, 0.9 * std::min(rate_lo, rate_hi));
  EXPECT_LT(rate, 1.1 * std::max(rate_lo, rate_hi));
}

TEST(KernelRates, UnalignedVocabularyRunsAtTheMeasuredSlowdown) {
  const KernelRates rates(h100().gpu, Dtype::kBf16);
  // The measured 50257-column logits GEMMs ran at ~137 TFLOP/s where 32000 and 128256 ran at
  // 650-750: N not a multiple of 8 elements. One slowdown (the geometric mean over the three
  // unaligned samples) reproduces each within a few percent, and an unmeasured odd vocabulary
  // is several times slower than its padded neighbour.
  EXPECT_NEAR(rates.gemm(8192, 50257, 4096, 1, 2, /*aligned=*/false), 2.409012e-02, 0.03 * 2.409012e-02);
  EXPECT_FALSE(gemm_aligned(50257, 2));
  EXPECT_TRUE(gemm_aligned(50304, 2));
  EXPECT_GT(rates.gemm(8192, 50257, 3072, 1, 2, false), 3.0 * rates.gemm(8192, 50304, 3072));
}

// The token count is never a GEMM's leading dimension: a sequence of 2047 tokens runs at the
// rate of 2048, and only an odd vocabulary (the output layer's features) is slow.
TEST(KernelRates, OddTokenCountsRunAtTheAlignedRate) {
  auto plan_with_seq = [](std::int64_t seq, std::int64_t vocab) {
    Plan p = testing::make_plan("llama3.2-1b", "dgx-h100", 1, seq, 32);
    p.model.vocab = vocab;
    return testing::checked_estimate(p).time.step.value();
  };
  const double even = plan_with_seq(2048, 128256), odd = plan_with_seq(2047, 128256);
  EXPECT_NEAR(odd / even, 2047.0 / 2048.0, 0.02);
  EXPECT_GT(plan_with_seq(2048, 128257), 1.2 * even) << "an unaligned vocabulary slows the output layer's GEMMs";
}

TEST(KernelRates, BatchedGemmsShareTheWavesOfTheSMs) {
  const KernelRates rates(h100().gpu, Dtype::kBf16);
  // 32 small products (standard attention's QK^T of 32 heads) run in the waves of one launch,
  // nearly as fast per FLOP as one product of 32 times the rows.
  const double batched = rates.gemm(512, 512, 128, 32) - rates.latency();
  const double stacked = rates.gemm(512 * 32, 512, 128) - rates.latency();
  EXPECT_LT(batched, 1.5 * stacked);
}

TEST(KernelRates, AttentionAndElementwiseSamplesComeOutExactly) {
  const KernelRates rates(h100().gpu, Dtype::kBf16);
  // sdpa_fwd 8 x heads32, s 2048, d 128: 5.104512e-04 s; forward+backward 2.615894e-03 s.
  // Every sample of a shape is one rate (heads 16 and 32 are averaged), so within their spread.
  EXPECT_NEAR(rates.attention_forward(8 * 32, 2048, 2048, 128, true), 5.104512e-04, 0.05 * 5.104512e-04);
  EXPECT_NEAR(rates.attention_backward(8 * 32, 2048, 2048, 128, true), 2.615894e-03 - 5.104512e-04, 0.05 * 2.1e-3);
  // h100_elementwise.csv: rmsnorm of 16384 x 8192 elements, forward 2.7458e-04 s and backward
  // 6.8008e-04 s; of 8192 x 4096 and 16384 x 2048 (the same size, averaged) 6.7048e-05 and
  // 5.3474e-05 forward.
  EXPECT_NEAR(rates.op(ElementwiseOp::kRmsNorm, 16384.0 * 8192, false), 2.7458e-04, 1e-10);
  EXPECT_NEAR(rates.op(ElementwiseOp::kRmsNorm, 16384.0 * 8192, true), 6.8008e-04, 1e-10);
  EXPECT_NEAR(rates.op(ElementwiseOp::kRmsNorm, 8192.0 * 4096, false), (6.7048e-05 + 5.3474e-05) / 2, 1e-10);
  // Outside the samples: the nearest sample's time per element, plus the latency of each kernel.
  EXPECT_NEAR(rates.op(ElementwiseOp::kResidualAdd, 1.0, false), rates.latency(), 1e-9);
}

TEST(KernelRates, WithoutTablesTheDatasheetFiguresAndEfficienciesAnswer) {
  const HardwareProfile a100 = testing::cluster("dgx-a100-80g");
  ASSERT_EQ(a100.gpu.kernels, nullptr);
  const KernelRates rates(a100.gpu, Dtype::kBf16);
  EXPECT_FALSE(rates.measured());
  // A large, well-shaped GEMM: peak x gemm_efficiency x the shape's efficiency, + one latency.
  const double m = 8192, n = 12288, k = 12288;
  const double tiles = std::ceil(m / 128) * std::ceil(n / 128), waves = std::ceil(tiles / a100.gpu.sm_count);
  const double efficiency = a100.gpu.gemm_efficiency * tiles / (waves * a100.gpu.sm_count) * k / (k + 64);
  EXPECT_NEAR(rates.gemm(m, n, k), a100.gpu.min_kernel_time.value() + 2 * m * n * k / (312e12 * efficiency), 1e-9);
  EXPECT_NEAR(rates.copy_bandwidth(), a100.gpu.hbm_bandwidth.value() * a100.gpu.memory_efficiency, 1.0);
}

// --- bad tables ---

nlohmann::json h100_document() { return hwprofile_to_json(h100()); }

std::string error_of(const nlohmann::json& doc) {
  auto parsed = parse_hwprofile_text(doc.dump(), "bad.json");
  return parsed ? "" : parsed.error().message;
}

TEST(KernelTables, MalformedTablesAreErrorsNamingTheJsonPointer) {
  struct Case {
    const char* what;
    void (*edit)(nlohmann::json&);
    const char* message;
  };
  const Case cases[] = {
      {"missing GEMM rows", [](nlohmann::json& d) { d["gpu"]["kernels"]["gemm"].erase("rows"); }, "bad.json: /gpu/kernels/gemm/rows: missing"},
      {"missing attention table", [](nlohmann::json& d) { d["gpu"]["kernels"].erase("attention"); }, "bad.json: /gpu/kernels/attention:"},
      {"empty GEMM rows", [](nlohmann::json& d) { d["gpu"]["kernels"]["gemm"]["rows"] = nlohmann::json::array(); },
       "bad.json: /gpu/kernels/gemm/rows: must be a non-empty array of rows"},
      {"negative rate", [](nlohmann::json& d) { d["gpu"]["kernels"]["gemm"]["rows"][3][3] = -1.0; },
       "bad.json: /gpu/kernels/gemm/rows/3/3: must be a finite number > 0 (got -1)"},
      {"NaN as text", [](nlohmann::json& d) { d["gpu"]["kernels"]["attention"]["rows"][2][4] = "NaN"; },
       "bad.json: /gpu/kernels/attention/rows/2/4: must be a number"},
      {"non-monotonic rows", [](nlohmann::json& d) { std::swap(d["gpu"]["kernels"]["gemm"]["rows"][4], d["gpu"]["kernels"]["gemm"]["rows"][5]); },
       "bad.json: /gpu/kernels/gemm/rows/5: rows must be in strictly increasing (m, n, k) order"},
      {"repeated size", [](nlohmann::json& d) { d["gpu"]["kernels"]["elementwise"]["ops"]["rmsnorm"][1] = d["gpu"]["kernels"]["elementwise"]["ops"]["rmsnorm"][0]; },
       "bad.json: /gpu/kernels/elementwise/ops/rmsnorm/1: rows must be in strictly increasing (elements) order"},
      {"wrong columns", [](nlohmann::json& d) { d["gpu"]["kernels"]["gemm"]["columns"] = {"m", "k", "n", "seconds"}; },
       "bad.json: /gpu/kernels/gemm/columns: must be [m, n, k, seconds]"},
      {"zero copy bandwidth", [](nlohmann::json& d) { d["gpu"]["kernels"]["copy_gb_per_s"] = 0; }, "bad.json: /gpu/kernels/copy_gb_per_s:"},
      {"unknown op", [](nlohmann::json& d) { d["gpu"]["kernels"]["elementwise"]["ops"]["softmax"] = {{1, 1, 1}}; },
       "bad.json: /gpu/kernels/elementwise/ops/softmax: unknown key"},
  };
  for (const Case& c : cases) {
    nlohmann::json doc = h100_document();
    c.edit(doc);
    EXPECT_NE(error_of(doc).find(c.message), std::string::npos) << c.what << ": " << error_of(doc);
  }
}

class KernelTablesCli : public testing::PlannerCliTest {};

TEST_F(KernelTablesCli, APlannerGivenABadProfileExitsTwoNamingThePointer) {
  nlohmann::json doc = h100_document();
  doc["gpu"]["kernels"]["gemm"]["rows"][7][3] = -2.5;
  const auto path = write("bad-h100.json", doc.dump(1));
  testing::expect_bad_input(run("--model 8b --gpus 8 --cluster " + testing::quote(path.string())),
                            "/gpu/kernels/gemm/rows/7/3: must be a finite number > 0 (got -2.5)");
}

TEST(KernelTables, TheProfileRoundTripsThroughItsDocument) {
  auto back = parse_hwprofile_text(readable_json(h100_document()), "roundtrip.json");
  ASSERT_TRUE(back.ok()) << back.error().message;
  ASSERT_NE(back->gpu.kernels, nullptr);
  EXPECT_EQ(back->gpu.kernels->gemm.size(), h100().gpu.kernels->gemm.size());
  const KernelRates a(h100().gpu, Dtype::kBf16), b(back->gpu, Dtype::kBf16);
  EXPECT_DOUBLE_EQ(a.gemm(8192, 4096, 4096), b.gemm(8192, 4096, 4096));
  EXPECT_DOUBLE_EQ(a.op(ElementwiseOp::kSwiglu, 8192.0 * 14336, true), b.op(ElementwiseOp::kSwiglu, 8192.0 * 14336, true));
}

}  // namespace
}  // namespace trainplan
