// `planner validate`: the published tables and measurements predicted row by row, MAPE per table,
// the report in text, Markdown and `trainplan/validation/v1` JSON, the embedded copies of
// tests/data, and the command line (exit 0 when it ran, 2 naming the file on bad input).

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "test_support.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/planner/published_data.hpp"
#include "trainplan/planner/search.hpp"
#include "trainplan/planner/validate.hpp"

namespace trainplan {
namespace {

using testing::Outcome;
using testing::quote;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
const char* const kPublishedIds[] = {"h100_executor_runs", "h100_stacks_mb4", "h200_stack_runs", "megatron2021_table1", "korthikanti2022_table3",
                                     "korthikanti2022_table4", "zero2020_table1", "fsdp_runs_a100",
                                     "torchtitan_a100", "torchtitan_h100_h200", "torchao_float8_h100", "llama3_405b_h100", "nemo_h100_fp8", "nccl_tests_published"};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json measurement_json() { return nlohmann::json::parse(read_file(testing::data_path("tinyllama-4x-zero2.measurement.json"))); }

// The estimate of the fixed plan the test measurement was made for (by the executor before its
// fused paths: trainplan-reference).
costmodel::Estimate estimate_of_test_plan(costmodel::Stack stack = costmodel::Stack::kTrainplanReference) {
  auto plan = planner::load_fixed_plan(testing::data_path("tinyllama-4x-zero2.plan.json"));
  if (!plan) throw std::runtime_error(plan.error().message);
  costmodel::Plan p = *plan;
  p.training.stack = stack;
  return testing::checked_estimate(p);
}

const planner::ValidationRow* find_row(const planner::ValidationTable& table, const std::string& label) {
  for (const auto& row : table.rows) {
    if (row.label == label) return &row;
  }
  return nullptr;
}

TEST(ValidationRow, ErrorIsPredictedOverPublishedLessOne) {
  const planner::ValidationRow row = planner::validation_row("1.7B", 137, 149.2, "mb=2 v=1");
  EXPECT_DOUBLE_EQ(row.error, 149.2 / 137 - 1);
  EXPECT_EQ(row.label, "1.7B");
  EXPECT_EQ(row.note, "mb=2 v=1");
  EXPECT_DOUBLE_EQ(planner::validation_row("x", 200, 180).error, -0.1);
}

// Hand-checked: errors +10%, -10%, +12% give MAPE (0.10 + 0.10 + 0.12) / 3 = 0.10666... and worst 0.12.
TEST(ValidationTable, MapeIsTheMeanAbsoluteErrorOfItsRows) {
  planner::ValidationTable table;
  table.rows = {planner::validation_row("a", 100, 110), planner::validation_row("b", 200, 180), planner::validation_row("c", 50, 56)};
  planner::summarise(table);
  EXPECT_NEAR(table.mape, 0.32 / 3, 1e-12);
  EXPECT_NEAR(table.max_abs_error, 0.12, 1e-12);

  planner::ValidationTable empty;
  planner::summarise(empty);
  EXPECT_EQ(empty.mape, 0);
  EXPECT_EQ(empty.max_abs_error, 0);
}

// A made-up table of `rows`, summarised.
planner::ValidationTable made_up_table(const std::string& id, const std::string& title, std::vector<planner::ValidationRow> rows,
                                       const std::string& missing = "") {
  planner::ValidationTable t;
  t.id = id;
  t.title = title;
  t.quantity = "seconds";
  t.source = "made up";
  t.missing = missing;
  t.rows = std::move(rows);
  planner::summarise(t);
  return t;
}

TEST(ValidationReport, TextAndMarkdownEndWithTheSummaryOfEveryTable) {
  const planner::ValidationTable a =
      made_up_table("a_table", "Table A", {planner::validation_row("row one", 100, 110, "plan x"), planner::validation_row("row two", 200, 180)});
  const planner::ValidationTable b = made_up_table("b_table", "Table B", {planner::validation_row("only row", 4, 5)});

  const std::string text = planner::render_validation({a, b}, planner::Format::kText);
  EXPECT_NE(text.find("row one"), std::string::npos) << text;
  EXPECT_NE(text.find("+10.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("2 rows, MAPE 10.0%, worst +10.0% (row one)."), std::string::npos) << text;
  const auto summary = text.find("Summary\n");
  ASSERT_NE(summary, std::string::npos) << text;
  EXPECT_NE(text.find("Table A", summary), std::string::npos) << text;
  EXPECT_NE(text.find("+25.0%", summary), std::string::npos) << text;  // Table B's worst

  const std::string md = planner::render_validation({a, b}, planner::Format::kMarkdown);
  EXPECT_NE(md.find("## Table A (seconds)"), std::string::npos) << md;
  EXPECT_NE(md.find("| row one "), std::string::npos) << md;
  const auto md_summary = md.find("## Summary");
  ASSERT_NE(md_summary, std::string::npos) << md;
  EXPECT_NE(md.find("| Table B ", md_summary), std::string::npos) << md;
  EXPECT_NE(md.find("25.0%", md_summary), std::string::npos) << md;
}

// Issue 32's rule for every published table: within 10% MAPE, or the summary says which
// mechanism is still missing (ValidationTable::missing, the summary's last column).
TEST(ValidationReport, EveryTableAboveTenPercentSaysWhatIsStillMissing) {
  auto tables = planner::validate_published();
  ASSERT_TRUE(tables.ok()) << tables.error().message;
  for (const auto& t : *tables) {
    if (t.mape > planner::kValidationMapeGoal) {
      EXPECT_FALSE(t.missing.empty()) << t.id << ": MAPE " << t.mape;
    }
  }
  const planner::ValidationTable off = made_up_table("off", "Off", {planner::validation_row("r", 100, 150)}, "the mechanism X");
  const planner::ValidationTable close = made_up_table("close", "Close", {planner::validation_row("r", 100, 105)}, "nothing to say");
  const std::string md = planner::render_validation({off, close}, planner::Format::kMarkdown);
  const auto summary = md.find("## Summary");
  ASSERT_NE(summary, std::string::npos) << md;
  EXPECT_NE(md.find("still missing (MAPE above 10%)", summary), std::string::npos) << md;
  EXPECT_NE(md.find("the mechanism X", summary), std::string::npos) << md;
  EXPECT_EQ(md.find("nothing to say", summary), std::string::npos) << md;  // within 10%: not said
}

TEST(ValidationReport, JsonHasEveryPublishedTableAndMapeIsTheMeanOfItsRows) {
  auto tables = planner::validate_published();
  ASSERT_TRUE(tables.ok()) << tables.error().message;
  const nlohmann::json j = nlohmann::json::parse(planner::render_validation(*tables, planner::Format::kJson));
  EXPECT_EQ(j.at("schema"), "trainplan/validation/v1");
  ASSERT_EQ(j.at("tables").size(), std::size(kPublishedIds));
  ASSERT_EQ(j.at("summary").size(), std::size(kPublishedIds));
  for (std::size_t i = 0; i < std::size(kPublishedIds); ++i) {
    const auto& t = j.at("tables")[i];
    SCOPED_TRACE(kPublishedIds[i]);
    EXPECT_EQ(t.at("id"), kPublishedIds[i]);
    for (const char* key : {"title", "quantity", "source"}) EXPECT_FALSE(t.at(key).get<std::string>().empty()) << key;
    ASSERT_FALSE(t.at("rows").empty());
    double sum = 0, worst = 0;
    for (const auto& row : t.at("rows")) {
      const double published = row.at("published"), predicted = row.at("predicted"), error = row.at("error");
      EXPECT_NEAR(error, predicted / published - 1, 1e-12) << row.at("label");
      EXPECT_FALSE(row.at("label").get<std::string>().empty());
      EXPECT_TRUE(row.at("note").is_string());
      sum += std::fabs(error);
      worst = std::max(worst, std::fabs(error));
    }
    EXPECT_NEAR(t.at("mape").get<double>(), sum / static_cast<double>(t.at("rows").size()), 1e-12);
    EXPECT_NEAR(t.at("max_abs_error").get<double>(), worst, 1e-12);
    const auto& s = j.at("summary")[i];
    EXPECT_EQ(s.at("id"), kPublishedIds[i]);
    EXPECT_EQ(s.at("rows"), t.at("rows").size());
    EXPECT_EQ(s.at("mape"), t.at("mape"));
    EXPECT_EQ(s.at("max_abs_error"), t.at("max_abs_error"));
  }
}

TEST(PublishedData, EmbeddedTablesAreTheFilesInTestsData) {
  std::set<std::string> names;
  for (const auto& document : planner::embedded_published_data()) names.insert(document.name);
  for (const char* name : {"megatron2021_table1", "korthikanti2022", "zero2020_table1", "fsdp_runs_a100", "torchtitan_a100"}) {
    SCOPED_TRACE(name);
    ASSERT_EQ(names.count(name), 1u);
    auto text = planner::published_data_text(name);
    ASSERT_TRUE(text.ok()) << text.error().message;
    EXPECT_EQ(*text, read_file(testing::data_path(std::string(name) + ".csv")));
  }
  auto vela = planner::published_data_text("ibm-vela-a100-80g");
  ASSERT_TRUE(vela.ok());
  EXPECT_EQ(*vela, read_file(testing::data_path("ibm-vela-a100-80g.json")));
  auto unknown = planner::published_data_text("no-such-table");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("no-such-table"), std::string::npos);
  EXPECT_NE(unknown.error().message.find("megatron2021_table1"), std::string::npos) << "the error lists the names there are";
}

TEST(PublishedData, CsvSkipsCommentsKeepsEmptyCellsAndRejectsExtraCells) {
  auto rows = planner::parse_csv("# a comment\na,b,c\n1,,3\n4,5,\n\n6\n", "t.csv");
  ASSERT_TRUE(rows.ok()) << rows.error().message;
  ASSERT_EQ(rows->size(), 3u);
  EXPECT_EQ((*rows)[0].line, 3);
  EXPECT_EQ((*rows)[0].cells.at("b"), "");
  EXPECT_EQ((*rows)[0].cells.at("c"), "3");
  EXPECT_EQ((*rows)[1].cells.at("c"), "");
  EXPECT_EQ((*rows)[2].cells.at("a"), "6");
  EXPECT_EQ((*rows)[2].cells.at("c"), "");
  auto bad = planner::parse_csv("a,b\n1,2\n1,2,3\n", "t.csv");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "t.csv: line 3: 3 cells, the header has 2");
}

TEST(ValidateMeasurement, TheTestMeasurementGivesStepTimeAndThroughputAgainstItsPlansEstimate) {
  const std::string file = testing::data_path("tinyllama-4x-zero2.measurement.json");
  auto table = planner::validate_measurement_file(file);
  ASSERT_TRUE(table.ok()) << table.error().message;
  EXPECT_EQ(table->id, "measurement:tinyllama-4x-zero2.measurement.json");
  EXPECT_EQ(table->reference, "measured");
  EXPECT_EQ(table->source, file + ": measured on cpu, 4 ranks; predicted for dgx-h100, tp1 pp1 dp4 zero2");
  ASSERT_EQ(table->rows.size(), 2u) << "measured on CPU: no memory totals";
  const costmodel::Estimate e = estimate_of_test_plan();
  const auto* step = find_row(*table, "step seconds");
  ASSERT_NE(step, nullptr);
  EXPECT_DOUBLE_EQ(step->published, 2.5);
  EXPECT_DOUBLE_EQ(step->predicted, e.time.step.value());
  EXPECT_DOUBLE_EQ(step->error, e.time.step.value() / 2.5 - 1);
  const auto* tokens = find_row(*table, "tokens/s");
  ASSERT_NE(tokens, nullptr);
  EXPECT_DOUBLE_EQ(tokens->published, 6553.6);
  EXPECT_NEAR(tokens->predicted, e.throughput.tokens_per_second, 1e-9 * e.throughput.tokens_per_second);
  EXPECT_NEAR(table->mape, (std::fabs(step->error) + std::fabs(tokens->error)) / 2, 1e-12);
}

TEST(ValidateMeasurement, GpuMemoryIsComparedAsPeakAllocatedAndReserved) {
  nlohmann::json m = measurement_json();
  m["memory"]["total_bytes"] = 20.0 * kGiB;
  m["memory"]["reserved_bytes"] = 24.0 * kGiB;
  auto table = planner::validate_measurement(m, "gpu.measurement.json");
  ASSERT_TRUE(table.ok()) << table.error().message;
  ASSERT_EQ(table->rows.size(), 4u);
  const costmodel::Estimate e = estimate_of_test_plan();
  const auto* allocated = find_row(*table, "peak allocated GiB");
  ASSERT_NE(allocated, nullptr);
  EXPECT_DOUBLE_EQ(allocated->published, 20.0);
  EXPECT_NEAR(allocated->predicted, e.memory.total.value() / kGiB, 1e-9);
  const auto* reserved = find_row(*table, "peak reserved GiB");
  ASSERT_NE(reserved, nullptr);
  EXPECT_DOUBLE_EQ(reserved->published, 24.0);
  EXPECT_NEAR(reserved->predicted, e.memory.reserved.value() / kGiB, 1e-9);
}

// A model that is no preset travels as `model_document`; an error in it names that key (it said
// /model/layers, the rebuilt plan's pointer, once).
TEST(ValidateMeasurement, AnErrorInTheModelDocumentNamesIt) {
  nlohmann::json m = measurement_json();
  m["model_document"] = nlohmann::json::parse(read_file(testing::data_path("../../samples/models/tiny-llama.json")));
  m["model_document"]["layers"] = -1;
  auto table = planner::validate_measurement(m, "m.json");
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.error().message.rfind("m.json: /model_document/layers: must be in [1, ", 0), 0u) << table.error().message;
}

TEST(ValidateMeasurement, APlanTheCostModelSaysDoesNotFitIsStillPredictedAndSaysSo) {
  nlohmann::json m = measurement_json();
  m["model"] = "llama3-70b";  // 70B with ZeRO-2 on 4 GPUs: the replicated bf16 weights alone need 140 GB per GPU
  auto table = planner::validate_measurement(m, "70b.measurement.json");
  ASSERT_TRUE(table.ok()) << table.error().message;
  ASSERT_EQ(table->rows.size(), 2u);
  for (const auto& row : table->rows) {
    EXPECT_FALSE(row.fits) << row.label;
    EXPECT_EQ(row.note.rfind("does not fit: ", 0), 0u) << row.note;
    EXPECT_GT(row.predicted, 0) << row.label;
  }
}

TEST(ValidateMeasurement, TheStackOfTrainingIsPassedToThePlanAndDefaultsToTheExecutors) {
  nlohmann::json m = measurement_json();
  m["training"]["stack"] = "torch-compile";
  auto table = planner::validate_measurement(m, "compiled.measurement.json");
  ASSERT_TRUE(table.ok()) << table.error().message;
  const auto* step = find_row(*table, "step seconds");
  ASSERT_NE(step, nullptr);
  const double compiled = estimate_of_test_plan(costmodel::Stack::kTorchCompile).time.step.value();
  EXPECT_DOUBLE_EQ(step->predicted, compiled);
  const double executor = estimate_of_test_plan(costmodel::Stack::kTrainplan).time.step.value();
  EXPECT_NE(compiled, executor) << "the stack must change the estimate for this test to mean anything";
  // A measurement without `stack` (the executor's, before it wrote one; its old `kernels` key is
  // ignored) ran the executor before its fused paths: trainplan-reference.
  m["training"].erase("stack");
  m["training"]["kernels"] = "fused";
  auto legacy = planner::validate_measurement(m, "legacy.measurement.json");
  ASSERT_TRUE(legacy.ok()) << legacy.error().message;
  const double reference = estimate_of_test_plan(costmodel::Stack::kTrainplanReference).time.step.value();
  EXPECT_DOUBLE_EQ(find_row(*legacy, "step seconds")->predicted, reference);
  // "trainplan" with environment.kernels "reference": the plain path too; "fused": trainplan.
  m["training"]["stack"] = "trainplan";
  m["environment"]["kernels"] = "reference";
  auto plain = planner::validate_measurement(m, "plain.measurement.json");
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_DOUBLE_EQ(find_row(*plain, "step seconds")->predicted, reference);
  m["environment"]["kernels"] = "fused";
  auto fused = planner::validate_measurement(m, "fused.measurement.json");
  ASSERT_TRUE(fused.ok()) << fused.error().message;
  EXPECT_DOUBLE_EQ(find_row(*fused, "step seconds")->predicted, executor);
}

TEST(ValidateMeasurement, BadDocumentsAreErrorsNamingTheFileAndThePointer) {
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> change;
    std::string fragment;
  };
  const Case cases[] = {
      {"negative step time", [](nlohmann::json& m) { m["time"]["step_seconds"] = -1; }, "/time/step_seconds: must be a number >= 0"},
      {"no time section", [](nlohmann::json& m) { m.erase("time"); }, "/time: is required"},
      {"unknown model preset", [](nlohmann::json& m) { m["model"] = "no-such-model"; }, "/model"},
      {"unknown cluster preset", [](nlohmann::json& m) { m["cluster"] = "no-such-cluster"; }, "/cluster"},
      {"bad reserved bytes", [](nlohmann::json& m) { m["memory"]["reserved_bytes"] = "lots"; }, "/memory/reserved_bytes: must be a number >= 0"},
      {"layout that is not the GPU count", [](nlohmann::json& m) { m["parallel"]["dp"] = 8; }, "/parallel: tp x pp x dp x cp = 8 ranks, but the run had 4 GPUs"},
      {"unknown training key", [](nlohmann::json& m) { m["training"]["sequence_length"] = 2048; }, "/training/sequence_length"},
      {"wrong schema", [](nlohmann::json& m) { m["schema"] = "trainplan/estimate/v1"; }, "/schema"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    nlohmann::json m = measurement_json();
    c.change(m);
    auto table = planner::validate_measurement(m, "dir/bad.measurement.json");
    ASSERT_FALSE(table.ok());
    EXPECT_EQ(table.error().message.rfind("dir/bad.measurement.json: ", 0), 0u) << table.error().message;
    EXPECT_NE(table.error().message.find(c.fragment), std::string::npos) << table.error().message;
  }
}

class ValidateCli : public testing::PlannerCliTest {};

TEST_F(ValidateCli, MarkdownRunsFromAnyDirectoryAndEndsWithTheSummary) {
  const Outcome r = run("validate --format md", "cd " + quote(dir_.string()) + " && ");
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_TRUE(r.err.empty()) << r.err;
  EXPECT_EQ(r.out.rfind("# trainplan validation", 0), 0u) << r.out;
  const auto summary = r.out.find("## Summary");
  ASSERT_NE(summary, std::string::npos) << r.out;
  for (const char* title : {"Megatron-LM 2021, Table 1", "Korthikanti 2022, Table 3", "ZeRO 2020, Table 1", "FSDP runs on A100", "torchtitan on A100"}) {
    EXPECT_NE(r.out.find("## " + std::string(title)), std::string::npos) << title;
    EXPECT_NE(r.out.find("| " + std::string(title), summary), std::string::npos) << title;
  }
}

TEST_F(ValidateCli, JsonWithAMeasurementAddsItsTableAfterThePublishedOnes) {
  const Outcome r = run("validate --format json " + quote(testing::data_path("tinyllama-4x-zero2.measurement.json")));
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.at("tables").size(), std::size(kPublishedIds) + 1);
  const auto& last = j.at("tables").back();
  EXPECT_EQ(last.at("id"), "measurement:tinyllama-4x-zero2.measurement.json");
  EXPECT_EQ(last.at("rows").size(), 2u);
}

TEST_F(ValidateCli, ABadMeasurementExitsTwoNamingTheFileAndPointer) {
  nlohmann::json m = measurement_json();
  m["throughput"]["tokens_per_second"] = -3;
  const auto bad = write("bad.measurement.json", m.dump());
  const auto malformed = write("malformed.measurement.json", "{\"schema\": ");
  expect_bad_inputs({
      {"negative throughput", "validate " + quote(bad.string()), bad.string() + ": /throughput/tokens_per_second: must be a number >= 0"},
      {"malformed JSON", "validate " + quote(malformed.string()), malformed.string() + ": line"},
      {"missing file", "validate " + quote((dir_ / "missing.json").string()), "missing.json"},
  });
  EXPECT_EQ(run("validate --format csv").exit_code, 2) << "validate writes text, json or md";
}

// Our runs of the exports on one H200 (bench/gpu/stacks-h200, tests/data/h200-stacks): every run
// gives a step and a reserve row. torchtitan's six steps are within 11% with its cuDNN attention
// priced (the one-GPU autocast copies, not modelled, are most of what remains: 87 ms of the eager
// 8K step's 1.016 s), its reserves within 17% (compiled activations over-predicted by 13 GiB at 8K).
// DeepSpeed's Hugging Face Llama (cuDNN attention, as it ran; LlamaRMSNorm priced op by op): its
// reserve within 5%, its step within 12% (the GPU idles 41 of its 589 ms, ZeRO-3's Python hooks
// around every submodule, not priced).
// torchtitan's one-GPU runs train the fp32 module under autocast (fsdp2's AutocastUse::kOneGpu)
// and Accelerate's DDP does always (hf-ddp): steps within 6% (the compiled fp8 one -5.4%: its
// casts are not yet attributed kernel by kernel), reserves within 8% (the eager 8K runs' -6.9% and
// +5.8%: which freed blocks their allocator reuses); DeepSpeed's ZeRO-3 step within 12%
// (its hooks' host time is not priced), its reserve within 5%.
TEST(H200StackRuns, EveryRunHasAStepAndAReserveWithinTheirBounds) {
  const auto table = planner::validate_h200_stack_runs();
  ASSERT_TRUE(table) << table.error().message;
  ASSERT_EQ(table->rows.size(), 16u);
  int titan_steps = 0, accelerate = 0;
  for (const auto& row : table->rows) {
    SCOPED_TRACE(row.label);
    const bool step = row.label.find("step seconds") != std::string::npos;
    if (row.label.rfind("deepspeed-", 0) == 0) {
      EXPECT_LE(std::abs(row.error), step ? 0.12 : 0.05);
    }
    if (row.label.rfind("accelerate (hf-ddp)", 0) == 0) {
      ++accelerate;
      EXPECT_LE(std::abs(row.error), step ? 0.06 : 0.08);
    }
    if (row.label.rfind("titan-", 0) != 0) continue;
    if (step) ++titan_steps;
    EXPECT_LE(std::abs(row.error), step ? 0.06 : 0.08);
  }
  EXPECT_EQ(titan_steps, 6);
  EXPECT_EQ(accelerate, 2);
}

// Published nccl-tests rows (tests/data/nccl_tests_published.csv) where the buffer is large
// enough for bandwidth to rule (1 GiB and up) and NCCL ran a ring or tree (NVLS off or absent):
// 8 A100s (ml-engineering: 8.20 ms at 1 GiB, 128.0 ms at 16 GiB), 8 H200s with NVLS off (16 GiB:
// all-reduce, all-gather, reduce-scatter) and 2 p4de nodes (51.4 ms at 2 GiB, a tree), each
// within 10%.
// Every bandwidth-bound row (1 GiB and more): ring, tree, and NVLS / NVLS-tree on the p5 (H100
// nodes with NVLink SHARP on, at the NVLS bus bandwidth ml-engineering measured on another
// 8xH100 node) within 10%.
TEST(NcclTestsTable, BandwidthBoundRowsWithinTenPercent) {
  auto table = planner::validate_nccl_tests();
  ASSERT_TRUE(table) << table.error().message;
  int checked = 0, nvls = 0;
  for (const auto& row : table->rows) {
    if (row.label.find("GiB") == std::string::npos) continue;
    EXPECT_LE(std::fabs(row.error), 0.10) << row.label;
    ++checked;
    if (row.note.rfind("nvls", 0) == 0) ++nvls;
  }
  EXPECT_EQ(checked, 9);
  EXPECT_EQ(nvls, 3);
}

// aws-ofi-nccl reports 75 us of latency on p4d/p4de (src/platform-aws.cpp), which NCCL adds to
// each network step: a 2-node tree all-reduce of 8 bytes (LL) costs 6.8 + 2 x (7 x 0.6 + 1 x
// (5.0 + 75)) = 175.2 us, against 164.3 us printed by AWS's sample; NCCL's InfiniBand figure alone
// gave 25.2 us.
TEST(NcclTestsTable, EfaPluginLatencyOnEveryNetworkStep) {
  auto table = planner::validate_nccl_tests();
  ASSERT_TRUE(table) << table.error().message;
  bool found = false;
  for (const auto& row : table->rows) {
    if (row.label != "aws-p4d, 16 GPUs / 2 nodes, all_reduce 8 B") continue;
    found = true;
    EXPECT_NEAR(row.predicted, 175.2, 0.05);
    EXPECT_NEAR(row.error, 175.2 / 164.3 - 1, 1e-3);
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace trainplan
