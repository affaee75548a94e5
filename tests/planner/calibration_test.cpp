// Accuracy against published runs. Each table is read from tests/data (copied from
// shared/data/calibration with its citation) and reproduced by the cost model's mechanisms
// through the planner's validation (trainplan/planner/validate.hpp, the code `planner validate`
// runs); no table value is fed back into the model. The printed tables are the validation record.

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "test_support.hpp"
#include "trainplan/costmodel/compute.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/planner/validate.hpp"

namespace trainplan {
namespace {

using namespace costmodel;
using testing::data_path;
using testing::read_csv;

double num(const std::map<std::string, std::string>& row, const std::string& key) { return std::stod(row.at(key)); }

// The table of a validation that must run; an error fails the test loudly.
planner::ValidationTable checked(costmodel::Result<planner::ValidationTable> table) {
  if (!table) throw std::runtime_error(table.error().message);
  return std::move(table).value();
}

void print(const planner::ValidationTable& table) {
  std::printf("\n%s", planner::render_validation({table}, planner::Format::kText).c_str());
}

// The rows' published figures are the file's, in its order: the validation read the right column.
void expect_published(const planner::ValidationTable& table, const std::vector<double>& published) {
  ASSERT_EQ(table.rows.size(), published.size()) << table.id;
  for (std::size_t i = 0; i < published.size(); ++i) EXPECT_DOUBLE_EQ(table.rows[i].published, published[i]) << table.rows[i].label;
}

// The predicted figure of the row labelled `label`; fails the test when there is none.
double find_predicted(const planner::ValidationTable& table, const std::string& label) {
  for (const auto& row : table.rows) {
    if (row.label == label) return row.predicted;
  }
  ADD_FAILURE() << table.id << ": no row \"" << label << "\"";
  return 0;
}

double mean_abs_error(const planner::ValidationTable& table) {
  double sum = 0;
  for (const auto& row : table.rows) sum += std::fabs(row.error);
  return sum / static_cast<double>(table.rows.size());
}

// ZeRO (Rajbhandari et al. 2020), Table 1: model-state memory per device in GB (1e9 bytes) for
// mixed-precision Adam (K = 12) with P_os, P_os+g, P_os+g+p.
TEST(ZeroTable1, ModelStatesWithinOnePercent) {
  const auto table = checked(planner::validate_zero2020_table1());
  print(table);
  std::vector<double> published;
  for (const auto& row : read_csv(data_path("zero2020_table1.csv"))) {
    for (const char* model : {"m7_5B", "m128B", "m1T"}) {
      for (const char* stage : {"_Pos", "_Pos_g", "_Pos_g_p"}) published.push_back(num(row, std::string(model) + stage));
    }
  }
  expect_published(table, published);
  for (const auto& row : table.rows) {
    // The paper rounds to 3 significant digits (e.g. 1.88 for 1.875); allow that rounding.
    EXPECT_NEAR(row.predicted, row.published, 0.01 * row.published + 0.005) << row.label;
  }
  EXPECT_EQ(table.rows.size(), 6u * 9u);
}

// Korthikanti et al. 2022, Table 2: activation bytes per transformer layer (16-bit activations,
// GPT block with dropout, attention scores materialised).
TEST(KorthikantiTable2, ActivationFormulasReproducedExactly) {
  struct Case { long long s, b, h; int a, t; };
  const Case cases[] = {{2048, 1, 12288, 96, 8}, {2048, 4, 6144, 64, 8}, {2048, 1, 20480, 128, 8}, {2048, 1, 25600, 160, 8},
                        {1024, 2, 4096, 32, 4}, {4096, 1, 8192, 64, 2}};
  for (const Case& k : cases) {
    const ModelSpec m = testing::gpt_model("k", 1, k.h, k.a, k.s);
    const HardwareProfile hw = testing::cluster("dgx-a100-80g");
    LayerSetting s;
    s.micro_batch = static_cast<double>(k.b);
    s.seq_len = static_cast<double>(k.s);
    s.precision = Precision::kFp16;
    s.stack = Stack::kMegatronTe;
    s.dropout = true;
    s.attention = AttentionKernel::kStandard;
    const double sbh = static_cast<double>(k.s) * k.b * k.h;
    const double as_h = static_cast<double>(k.a) * k.s / k.h;
    const double t = k.t;
    const auto bytes = [&](int tp, bool sp, Recompute r) {
      LayerSetting x = s;
      x.tp = tp;
      x.sequence_parallel = sp;
      x.recompute = r;
      x.tp_group = {tp, tp};
      return transformer_layer_cost(m, hw, x).activation_bytes;
    };
    // The paper leaves out the two LayerNorms' float32 mean and 1/sigma, 16 bytes a token (of the
    // sequence shard under SP), which the cost model counts.
    const double stats = 16.0 * static_cast<double>(k.s) * k.b;
    EXPECT_DOUBLE_EQ(bytes(1, false, Recompute::kNone), sbh * (34 + 5 * as_h) + stats);
    EXPECT_DOUBLE_EQ(bytes(k.t, false, Recompute::kNone), sbh * (10 + 24 / t + 5 * as_h / t) + stats);
    EXPECT_DOUBLE_EQ(bytes(k.t, true, Recompute::kNone), sbh / t * (34 + 5 * as_h) + stats / t);
    EXPECT_DOUBLE_EQ(bytes(k.t, false, Recompute::kSelective), sbh * (10 + 24 / t) + stats);
    EXPECT_DOUBLE_EQ(bytes(k.t, true, Recompute::kSelective), 34 * sbh / t + stats / t);
    EXPECT_DOUBLE_EQ(bytes(1, false, Recompute::kFull), 2 * sbh);
  }
}

// Narayanan et al. 2021, Table 1: achieved hardware TFLOP/s per GPU, 1.7B-1T GPT on A100-80GB,
// full recompute, interleaved schedule, micro-batch (and interleaving) searched.
TEST(MegatronTable1, HardwareTflopsWithin15PercentAndMeanWithin8) {
  const auto table = checked(planner::validate_megatron2021_table1());
  print(table);
  std::vector<double> published;
  for (const auto& row : read_csv(data_path("megatron2021_table1.csv"))) published.push_back(num(row, "tflops_per_gpu"));
  expect_published(table, published);
  for (const auto& row : table.rows) {
    EXPECT_TRUE(row.fits) << row.label << ": " << row.note;
    EXPECT_LE(std::fabs(row.error), 0.15) << row.label;
  }
  ASSERT_EQ(table.rows.size(), 10u);
  EXPECT_LE(mean_abs_error(table), 0.08);
}

// Korthikanti et al. 2022, Table 3: iteration time with full recompute, and with sequence
// parallelism plus selective recompute, at the paper's batch and micro-batch.
TEST(KorthikantiTable3, IterationTimesWithin15Percent) {
  const auto table = checked(planner::validate_korthikanti2022_table3());
  print(table);
  std::vector<double> published;
  for (const auto& row : read_csv(data_path("korthikanti2022.csv"))) {
    if (row.at("iter_s_full_recompute").empty()) continue;  // the dp=8 row has no Table 3 entry
    published.push_back(num(row, "iter_s_full_recompute"));
    published.push_back(num(row, "iter_s_sp_plus_selective"));
  }
  expect_published(table, published);
  for (const auto& row : table.rows) {
    EXPECT_TRUE(row.fits) << row.label << ": " << row.note;
    EXPECT_LE(std::fabs(row.error), 0.15) << row.label;
  }
  EXPECT_EQ(table.rows.size(), 8u);
}

// Korthikanti et al. 2022, Table 4: forward and backward milliseconds of one layer of the 22B
// model (tp 8, micro-batch 4) under each recompute and sequence-parallel setting. The layer alone,
// without the step's pipeline, data-parallel traffic, embedding, loss and optimizer around it.
TEST(KorthikantiTable4, LayerTimesWithin10Percent) {
  const auto table = checked(planner::validate_korthikanti2022_table4());
  print(table);
  std::vector<double> published;
  for (const auto& row : read_csv(data_path("korthikanti2022_table4_layer.csv"))) {
    published.push_back(num(row, "fwd_ms"));
    published.push_back(num(row, "bwd_ms"));
  }
  expect_published(table, published);
  ASSERT_EQ(table.rows.size(), 10u);
  for (const auto& row : table.rows) EXPECT_LE(std::fabs(row.error), 0.10) << row.label;
  EXPECT_LE(mean_abs_error(table), 0.05);
  const auto ms = [&](const char* label) { return find_predicted(table, label); };
  // The paper's forward is the same 7.7 ms whatever is recomputed: recompute runs in backward.
  EXPECT_DOUBLE_EQ(ms("full recompute: forward"), ms("no recompute: forward"));
  EXPECT_DOUBLE_EQ(ms("selective recompute: forward"), ms("no recompute: forward"));
  // Sequence parallelism makes the forward faster (7.2 against 7.7 ms): the norms and dropouts
  // run on 1/t of the tokens, at the same communication volume.
  EXPECT_LT(ms("sequence parallelism: forward"), ms("no recompute: forward"));
  // Full recompute adds about one forward to the backward (19.5 - 11.9 = 7.6 of 7.7 ms);
  // selective recompute a fraction of it (13.2 - 11.9 = 1.3 ms).
  const double full_extra = ms("full recompute: backward") - ms("no recompute: backward");
  EXPECT_NEAR(full_extra / ms("no recompute: forward"), 7.6 / 7.7, 0.05);
  const double selective_extra = ms("selective recompute: backward") - ms("no recompute: backward");
  EXPECT_GT(selective_extra, 0);
  EXPECT_LT(selective_extra, 0.25 * full_extra);
}

// FSDP runs of Llama-family models on A100 (TinyLlama README; PyTorch/IBM blog "Maximizing
// training throughput using PyTorch FSDP", Table 1): tokens/s per GPU within 15% (relative).
TEST(FsdpRunsA100, ThroughputWithin15Percent) {
  const auto table = checked(planner::validate_fsdp_runs_a100());
  print(table);
  std::vector<double> published;
  for (const auto& row : read_csv(data_path("fsdp_runs_a100.csv"))) published.push_back(std::stod(row.at("tokens_per_s_per_gpu")));
  expect_published(table, published);
  for (const auto& row : table.rows) {
    EXPECT_TRUE(row.fits) << row.label << ": " << row.note;
    EXPECT_LE(std::fabs(row.error), 0.15) << row.label;
  }
  EXPECT_EQ(table.rows.size(), 5u);
}

// torchtitan's A100 runs (64 x A100-80GB, FSDP; docs/performance.md, older version): tokens/s per
// GPU within 15% (relative) of what it measured. Every row is optimistic today (docs/accuracy.md).
TEST(TorchtitanA100, ThroughputWithin15Percent) {
  const auto table = checked(planner::validate_torchtitan_a100());
  print(table);
  std::vector<double> published;
  for (const auto& row : read_csv(data_path("torchtitan_a100.csv"))) published.push_back(num(row, "tokens_per_s_per_gpu"));
  expect_published(table, published);
  for (const auto& row : table.rows) {
    EXPECT_TRUE(row.fits) << row.label << ": " << row.note;
    EXPECT_LE(std::fabs(row.error), 0.15) << row.label;
  }
  EXPECT_EQ(table.rows.size(), 8u);
}

// torchtitan's community benchmarks on 500 W H100 and on H200 (benchmarks/ of pytorch/torchtitan
// b5bcd76c6, tests/data/torchtitan_h100_h200.csv): every run predicted, and the peak reserved
// memory the Trainy H200 runs logged (47.96 and 46.97 GiB at step 100, FSDP2 + compile, fp8, local
// batch 2 of 8K tokens) within 10%, the fit boundary of item 4 of issue 32. The file's "Memory(GiB)"
// is read as torchtitan's max_reserved_gib, the figure its console line prints (an assumption: the
// run also logged max_active to Weights & Biases). The step times are
// printed, not bounded: the 500 W clock is not published (docs/accuracy.md).
TEST(TorchtitanH100H200, EveryRunIsPredictedAndThePeakReservedMemoryWithin10Percent) {
  const auto table = checked(planner::validate_torchtitan_h100_h200());
  print(table);
  ASSERT_EQ(table.rows.size(), 8u);  // 6 runs, 2 of them with memory
  int memory_rows = 0;
  for (const auto& row : table.rows) {
    EXPECT_GT(row.predicted, 0) << row.label;
    EXPECT_TRUE(row.fits) << row.label << ": these runs ran";
    if (row.label.find("reserved GiB") == std::string::npos) continue;
    ++memory_rows;
    EXPECT_NEAR(row.predicted / row.published, 1.0, 0.10) << row.label;
  }
  EXPECT_EQ(memory_rows, 2);
  EXPECT_DOUBLE_EQ(table.rows[4].published, 10938);  // the first H200 run's tokens/s per GPU, as the file prints it
}

// torchao's float8 README (pytorch/ao torchao/float8/README.md at b79503772^, "e2e training
// benchmarks", tests/data/torchao_float8_h100.csv): torchtitan Llama 3 8B on 8 H100, seq 8192,
// local batch 1, FSDP2 under torch.compile, op-level selective checkpointing, launched through
// run_train.sh (expandable segments): 6150 tokens/s per GPU and 47.65 GiB peak reserved in bf16,
// 7689.5 and 47.77 in tensorwise fp8 with the fp8 all-gather. Both runs ran, so both must fit; the
// reserve is held within 10%, as the H200 runs' above: the torchtitan of these runs (March 2025)
// ran its loss eagerly on fp32 logits (the CSV's loss column; without it the model was 13-15%
// low). The throughput is printed, not bounded: 34-43% optimistic, a gap not yet found
// (docs/accuracy.md).
TEST(TorchaoFloat8H100, BothRunsFitAndThePeakReservedMemoryWithin10Percent) {
  const auto table = checked(planner::validate_torchao_float8_h100());
  print(table);
  ASSERT_EQ(table.rows.size(), 4u);
  EXPECT_DOUBLE_EQ(table.rows[0].published, 6150);
  EXPECT_DOUBLE_EQ(table.rows[3].published, 47.77);
  for (const auto& row : table.rows) {
    EXPECT_TRUE(row.fits) << row.label << ": these runs ran";
    if (row.label.find("reserved GiB") != std::string::npos) {
      EXPECT_NEAR(row.predicted / row.published, 1.0, 0.10) << row.label;
    }
  }
  // fp8 with the fp8 all-gather over bf16: published 7689.5 / 6150 = 1.25 times; the model's
  // speed-up within 15% of it, whatever the absolute gap (1.33 on 2026-11-29).
  EXPECT_NEAR((table.rows[2].predicted / table.rows[0].predicted) / (7689.5 / 6150.0), 1.0, 0.15);
}

}  // namespace
}  // namespace trainplan
