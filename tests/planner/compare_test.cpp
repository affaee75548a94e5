// Comparing an estimate with a measurement: the rows, the relative differences, the report in
// text, Markdown and JSON, the lenient reading of measurement documents and its errors, and the
// `planner compare` command line.
//
// tests/data/tinyllama-4x-zero2.plan.json is TinyLlama 1.1B (1,100,048,384 parameters) in bf16
// with AdamW, dp 4, ZeRO-2. Its estimate per GPU, by hand (ZeRO paper accounting):
//   weights    2 B x 1,100,048,384            = 2,200,096,768 B (not sharded by ZeRO-2)
//   gradients  4 B (fp32 reduce) x N / 4       = 1,100,048,384 B
//   optimizer  12 B (m, v, fp32 master) x N / 4 = 3,300,145,152 B
// The measurement beside it has weights 2x, gradients 1x and optimizer states 0.75x those.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "test_support.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/planner/compare.hpp"
#include "trainplan/planner/search.hpp"

namespace trainplan {
namespace {

using planner::Comparison;
using planner::ComparisonRow;
using planner::PerformanceDocument;
using planner::Section;
using testing::quote;

const std::string kPlanFile = testing::data_path("tinyllama-4x-zero2.plan.json");
const std::string kMeasurementFile = testing::data_path("tinyllama-4x-zero2.measurement.json");

Comparison sample_comparison() {
  auto predicted = planner::load_prediction_file(kPlanFile);
  if (!predicted) throw std::runtime_error(predicted.error().message);
  auto measured = planner::load_measurement_file(kMeasurementFile);
  if (!measured) throw std::runtime_error(measured.error().message);
  return planner::compare(*predicted, *measured);
}

const ComparisonRow* find_row(const Comparison& c, const std::string& key) {
  const auto it = std::find_if(c.rows.begin(), c.rows.end(), [&](const ComparisonRow& r) { return r.key == key; });
  return it == c.rows.end() ? nullptr : &*it;
}

// The line of a text report that starts (after indentation) with `label`.
std::string line_of(const std::string& report, const std::string& label) {
  const auto at = report.find("\n  " + label + " ");
  if (at == std::string::npos) return "";
  const auto end = report.find('\n', at + 1);
  return report.substr(at + 1, end - at - 1);
}

TEST(Compare, ModelStatesMatchTheHandDerivedEstimate) {
  const Comparison c = sample_comparison();
  struct Expected {
    const char* key;
    double predicted, measured, relative_difference;
  };
  const Expected expected[] = {
      {"weights_bytes", 2200096768.0, 4400193536.0, 1.0},
      {"gradients_bytes", 1100048384.0, 1100048384.0, 0.0},
      {"optimizer_bytes", 3300145152.0, 2475108864.0, -0.25},
  };
  for (const auto& e : expected) {
    SCOPED_TRACE(e.key);
    const ComparisonRow* row = find_row(c, e.key);
    ASSERT_NE(row, nullptr);
    EXPECT_EQ(row->section, Section::kMemory);
    EXPECT_DOUBLE_EQ(row->predicted, e.predicted);
    ASSERT_TRUE(row->measured.has_value());
    EXPECT_DOUBLE_EQ(*row->measured, e.measured);
    ASSERT_TRUE(row->relative_difference.has_value());
    EXPECT_NEAR(*row->relative_difference, e.relative_difference, 1e-12);
  }
}

TEST(Compare, WeightsMeasuredAtTwiceTheEstimateReadPlusOneHundredPercent) {
  const std::string text = planner::render_comparison(sample_comparison(), planner::Format::kText);
  // 2,200,096,768 B = 2.05 GiB; twice that is 4.10 GiB.
  const std::string weights = line_of(text, "weights");
  EXPECT_NE(weights.find("2.05"), std::string::npos) << weights;
  EXPECT_NE(weights.find("4.10"), std::string::npos) << weights;
  EXPECT_NE(weights.find("+100.0%"), std::string::npos) << weights;
  EXPECT_NE(line_of(text, "gradients").find("+0.0%"), std::string::npos) << text;
  EXPECT_NE(line_of(text, "optimizer states").find("-25.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("memory per GPU (GiB)"), std::string::npos) << text;
}

TEST(Compare, QuantitiesTheMeasurementLacksReadNotMeasured) {
  const Comparison c = sample_comparison();
  const ComparisonRow* mfu = find_row(c, "mfu");
  ASSERT_NE(mfu, nullptr);
  EXPECT_FALSE(mfu->measured.has_value());
  EXPECT_FALSE(mfu->relative_difference.has_value());
  const std::string text = planner::render_comparison(c, planner::Format::kText);
  EXPECT_NE(line_of(text, "MFU").find("not measured"), std::string::npos) << text;
  EXPECT_NE(line_of(text, "activations").find("not measured"), std::string::npos) << text;
}

TEST(Compare, PartsThePlanDoesNotHaveAreLeftOut) {
  // dp only: no pipeline bubble, no tensor-parallel traffic, predicted 0 and not measured.
  const Comparison c = sample_comparison();
  EXPECT_EQ(find_row(c, "bubble_seconds"), nullptr);
  EXPECT_EQ(find_row(c, "tp_comm_seconds"), nullptr);
  EXPECT_NE(find_row(c, "step_seconds"), nullptr);
}

// Context parallelism's bytes (issue 13): the estimate's and the executor's
// communication.cp_bytes_sent_per_step side by side, in MiB; a plan without CP shows no row.
TEST(Compare, ContextParallelBytesSentAreComparedInMebibytes) {
  EXPECT_EQ(find_row(sample_comparison(), "cp_bytes_sent_per_step"), nullptr);
  PerformanceDocument predicted, measured;
  predicted.communication["cp_bytes_sent_per_step"] = 48.0 * 1048576;
  measured.communication["cp_bytes_sent_per_step"] = 49.0 * 1048576;
  const Comparison c = planner::compare(predicted, measured);
  const ComparisonRow* row = find_row(c, "cp_bytes_sent_per_step");
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->section, Section::kCommunication);
  ASSERT_TRUE(row->relative_difference.has_value());
  EXPECT_NEAR(*row->relative_difference, 1.0 / 48.0, 1e-12);
  const std::string text = planner::render_comparison(c, planner::Format::kText);
  EXPECT_NE(text.find("bytes sent per step, busiest rank (MiB)"), std::string::npos) << text;
  const std::string line = line_of(text, "context parallelism");
  EXPECT_NE(line.find("48.00"), std::string::npos) << text;
  EXPECT_NE(line.find("49.00"), std::string::npos) << text;
  EXPECT_NE(line.find("+2.1%"), std::string::npos) << text;
}

TEST(Compare, HeaderNamesPlanModelLayoutWorldSizeAndDevice) {
  const std::string text = planner::render_comparison(sample_comparison(), planner::Format::kText);
  EXPECT_NE(text.find("Plan         tinyllama-4x-zero2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Model        tinyllama-1.1b\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Layout       tp1 pp1 dp4 zero2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("World size   4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Device       cpu"), std::string::npos) << text;
  EXPECT_NE(text.find("3 steps, loss 10.4 -> 9.8"), std::string::npos) << text;
}

TEST(Compare, DifferentModelAndLayoutGiveWarningsAndStillCompare) {
  PerformanceDocument predicted, measured;
  predicted.model = "llama3-8b";
  measured.model = "tinyllama-1.1b";
  predicted.layout = planner::ParallelLayout{1, 1, 4, 1, 1, 2};
  measured.layout = planner::ParallelLayout{2, 1, 2, 1, 1, 2};
  predicted.memory["weights_bytes"] = 100;
  measured.memory["weights_bytes"] = 150;
  const Comparison c = planner::compare(predicted, measured);
  ASSERT_EQ(c.warnings.size(), 2u);
  EXPECT_NE(c.warnings[0].find("llama3-8b"), std::string::npos) << c.warnings[0];
  EXPECT_NE(c.warnings[1].find("tp1 pp1 dp4 zero2"), std::string::npos) << c.warnings[1];
  EXPECT_NE(c.warnings[1].find("tp2 pp1 dp2 zero2"), std::string::npos) << c.warnings[1];
  const std::string text = planner::render_comparison(c, planner::Format::kText);
  EXPECT_NE(text.find("warning: model differs"), std::string::npos) << text;
  EXPECT_NE(line_of(text, "weights").find("+50.0%"), std::string::npos) << text;
}

TEST(Compare, AnEstimateForAnotherStackThanTheExecutorsSaysSo) {
  auto loaded_prediction = planner::load_prediction_file(kPlanFile);
  auto loaded_measurement = planner::load_measurement_file(kMeasurementFile);
  ASSERT_TRUE(loaded_prediction.ok() && loaded_measurement.ok());
  planner::PerformanceDocument predicted = *loaded_prediction, measured = *loaded_measurement;
  EXPECT_EQ(measured.stack, "trainplan-reference") << "a measurement without training.stack ran the executor before its fused paths";
  const auto stack_warnings = [](const Comparison& c) {
    std::vector<std::string> out;
    for (const auto& w : c.warnings) {
      if (w.find("stack") != std::string::npos) out.push_back(w);
    }
    return out;
  };
  predicted.stack = "trainplan-reference";
  EXPECT_TRUE(stack_warnings(planner::compare(predicted, measured)).empty());
  predicted.stack = "megatron-te";
  const auto warnings = stack_warnings(planner::compare(predicted, measured));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings.front(), "software stack differs: the estimate is for megatron-te, the measurement ran trainplan-reference");
  predicted.stack = "trainplan";  // the fused paths against the plain path: a different stack too
  EXPECT_EQ(stack_warnings(planner::compare(predicted, measured)).size(), 1u);
}

// The estimate's reserve is for its plan's allocator (training.allocator); a GPU run records the
// one it ran (environment.allocator_conf, absent for PyTorch's default): a difference is said.
TEST(Compare, AnAllocatorOtherThanTheEstimatesSaysSo) {
  PerformanceDocument predicted, measured;
  measured.device = "NVIDIA H100 80GB HBM3";
  measured.environment["executor_commit"] = "abc";
  const auto allocator_warnings = [&] {
    std::vector<std::string> out;
    for (const auto& w : planner::compare(predicted, measured).warnings) {
      if (w.find("allocator") != std::string::npos) out.push_back(w);
    }
    return out;
  };
  EXPECT_TRUE(allocator_warnings().empty());
  measured.environment["allocator_conf"] = "expandable_segments: True";
  auto warnings = allocator_warnings();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings.front(), "allocator differs: the estimate's reserved memory is for PyTorch's caching allocator, the run's was "
                              "expandable-segments (PYTORCH_ALLOC_CONF=expandable_segments: True)");
  predicted.allocator = "expandable-segments";
  EXPECT_TRUE(allocator_warnings().empty());
  measured.environment.erase("allocator_conf");
  warnings = allocator_warnings();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings.front().find("the run's was caching (no PYTORCH_ALLOC_CONF)"), std::string::npos) << warnings.front();
  measured.device = "cpu";  // no reserved memory to compare
  EXPECT_TRUE(allocator_warnings().empty());
}

TEST(Compare, ClosingLineNamesTheLargestDeviation) {
  PerformanceDocument predicted, measured;
  predicted.memory["weights_bytes"] = 1073741824;  // 1 GiB
  measured.memory["weights_bytes"] = 1610612736;   // 1.5 GiB: +50%
  predicted.time["step_seconds"] = 2.0;
  measured.time["step_seconds"] = 1.0;             // -50%
  predicted.time["optimizer_seconds"] = 0.5;
  measured.time["optimizer_seconds"] = 0.2;        // -60%: the largest in size
  const Comparison c = planner::compare(predicted, measured);
  ASSERT_NE(c.largest_deviation(), nullptr);
  EXPECT_EQ(c.largest_deviation()->key, "optimizer_seconds");
  const std::string text = planner::render_comparison(c, planner::Format::kText);
  EXPECT_NE(text.find("Largest deviation: time optimizer step, -60.0%: measured 200.00 ms against 500.00 ms predicted."),
            std::string::npos)
      << text;
}

TEST(Compare, NothingMeasuredSaysSo) {
  PerformanceDocument predicted, measured;
  predicted.time["step_seconds"] = 2.0;
  const Comparison c = planner::compare(predicted, measured);
  EXPECT_EQ(c.largest_deviation(), nullptr);
  EXPECT_NE(planner::render_comparison(c, planner::Format::kText).find("Nothing the estimate predicts was measured."), std::string::npos);
}

TEST(Compare, MarkdownPrintsPipeTables) {
  const std::string md = planner::render_comparison(sample_comparison(), planner::Format::kMarkdown);
  EXPECT_EQ(md.rfind("# trainplan comparison", 0), 0u) << md;
  EXPECT_NE(md.find("| memory per GPU (GiB) | predicted |"), std::string::npos) << md;
  EXPECT_NE(md.find("|----------------------|----------:|"), std::string::npos) << md;
  EXPECT_NE(md.find("+100.0% |"), std::string::npos) << md;
}

TEST(Compare, JsonIsAComparisonDocument) {
  const auto j = nlohmann::json::parse(planner::render_comparison(sample_comparison(), planner::Format::kJson));
  EXPECT_EQ(j.at("schema"), "trainplan/comparison/v1");
  EXPECT_EQ(j.at("name"), "tinyllama-4x-zero2");
  EXPECT_EQ(j.at("parallel"), "tp1 pp1 dp4 zero2");
  EXPECT_EQ(j.at("world_size"), 4);
  const auto& rows = j.at("rows");
  const auto row = [&](const std::string& key) {
    for (const auto& r : rows) if (r.at("key") == key) return r;
    return nlohmann::json();
  };
  const auto weights = row("weights_bytes");
  EXPECT_EQ(weights.at("section"), "memory");
  EXPECT_DOUBLE_EQ(weights.at("predicted").get<double>(), 2200096768.0);
  EXPECT_DOUBLE_EQ(weights.at("measured").get<double>(), 4400193536.0);
  EXPECT_DOUBLE_EQ(weights.at("relative_difference").get<double>(), 1.0);
  const auto mfu = row("mfu");
  EXPECT_EQ(mfu.at("section"), "throughput");
  EXPECT_TRUE(mfu.at("measured").is_null());
  EXPECT_TRUE(mfu.at("relative_difference").is_null());
}

TEST(Compare, EstimateDocumentAndPlanFileGiveTheSameRows) {
  auto plan = planner::load_fixed_plan(kPlanFile);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  const auto estimate = costmodel::estimate_to_json(*plan, costmodel::estimate(*plan));
  auto from_estimate = planner::read_performance_document(estimate, "estimate.json", planner::kEstimateSchema);
  ASSERT_TRUE(from_estimate.ok()) << from_estimate.error().message;
  auto from_plan = planner::load_prediction_file(kPlanFile);
  ASSERT_TRUE(from_plan.ok()) << from_plan.error().message;
  for (Section s : planner::kSections) EXPECT_EQ(from_estimate->quantities(s), from_plan->quantities(s)) << planner::section_name(s);
  EXPECT_EQ(from_estimate->name, "tinyllama-4x-zero2");
  EXPECT_EQ(from_estimate->world_size, 4);
}

TEST(Compare, PipelineTraceOfTheSampleMeasurementIsShownBesideTheSchedule) {
  // samples/measurements/tiny-llama-pp4.measurement.json: a real executor run (its `source` holds
  // the command) of samples/plans/tiny-llama-pp4.json, 4 stages under 1F1B with 8 micro-batches.
  auto measured = planner::load_measurement_file(testing::source_path("samples/measurements/tiny-llama-pp4.measurement.json"));
  ASSERT_TRUE(measured) << measured.error().message;
  ASSERT_TRUE(measured->trace);
  const planner::Trace& t = *measured->trace;
  EXPECT_EQ(t.stages, 4);
  EXPECT_EQ(t.micro_batches, 8);
  EXPECT_EQ(t.schedule, "1f1b");
  // 1F1B: stage s holds p - s micro-batches (Narayanan et al. 2021, §2.2.1), as predicted.
  EXPECT_EQ(t.peak_in_flight, (std::vector<double>{4, 3, 2, 1}));
  EXPECT_EQ(t.predicted_in_flight, t.peak_in_flight);
  // Every stage ran 8 forwards and 8 backwards in the traced step.
  for (int stage = 0; stage < 4; ++stage) {
    const auto passes = std::count_if(t.events.begin(), t.events.end(), [&](const planner::TraceEvent& e) {
      return e.stage == stage && (e.kind == "forward" || e.kind == "backward");
    });
    EXPECT_EQ(passes, 16) << "stage " << stage;
  }
  auto predicted = planner::load_prediction_file(testing::source_path("samples/plans/tiny-llama-pp4.json"));
  ASSERT_TRUE(predicted) << predicted.error().message;
  const std::string text = planner::render_comparison(planner::compare(*predicted, *measured), planner::Format::kText);
  EXPECT_NE(text.find("Pipeline: 1f1b, 4 stages, 8 micro-batches; closed-form bubble (p-1)/(v m) = 0.375"), std::string::npos) << text;
  EXPECT_NE(text.find("4 3 2 1   4 3 2 1"), std::string::npos) << text;
}

TEST(ChromeTrace, OneNamedProcessPerRankAndOneCompleteEventPerRecordedEvent) {
  planner::Trace t;
  t.step = 3;
  t.stages = 2;
  t.virtual_stages = 2;
  t.micro_batches = 4;
  t.schedule = "interleaved";
  t.bubble_fraction = 0.1;
  t.predicted_bubble_fraction = 0.08;
  t.events = {{0, 0, "forward", 2, 1, 0.0015, 0.0040}, {1, 1, "recv", 2, 1, 0.0, 0.0015}, {1, 1, "optimizer", -1, 0, 0.01, 0.0125}};
  const nlohmann::json j = planner::chrome_trace(t);
  const auto& events = j.at("traceEvents");
  ASSERT_EQ(events.size(), 2u * 2u + 3u);  // name and sort index per rank, then the three events
  EXPECT_EQ(events[0].at("args").at("name"), "rank 0, stage 0");
  EXPECT_EQ(events[2].at("args").at("name"), "rank 1, stage 1");
  // Microseconds: the forward of micro-batch 2, chunk 1, from 1.5 ms for 2.5 ms.
  const auto& f = events[4];
  EXPECT_EQ(f.at("ph"), "X");
  EXPECT_EQ(f.at("name"), "F2.c1");
  EXPECT_EQ(f.at("pid"), 0);
  EXPECT_NEAR(f.at("ts").get<double>(), 1500.0, 1e-9);
  EXPECT_NEAR(f.at("dur").get<double>(), 2500.0, 1e-9);
  EXPECT_EQ(events[5].at("name"), "recv 2.c1");
  EXPECT_EQ(events[6].at("name"), "optimizer");
  EXPECT_EQ(j.at("otherData").at("schedule"), "interleaved");
  EXPECT_EQ(j.at("otherData").at("predicted_bubble_fraction"), 0.08);
}

TEST(Compare, ATraceEventEndingBeforeItStartsIsAnErrorNamingIt) {
  nlohmann::json doc = {{"schema", "trainplan/measurement/v1"}, {"memory", nlohmann::json::object()},
                        {"time", nlohmann::json::object()}, {"throughput", nlohmann::json::object()},
                        {"trace", {{"stages", 2}, {"events", {{{"kind", "forward"}, {"start", 2.0}, {"end", 1.0}}}}}}};
  auto read = planner::read_performance_document(doc, "m.json", planner::kMeasurementSchema);
  ASSERT_FALSE(read);
  EXPECT_NE(read.error().message.find("m.json: /trace/events/0/end: must not be before start"), std::string::npos) << read.error().message;
}

TEST(SectionKeys, CoverEveryPredictedQuantityOfTheEstimateDocument) {
  const costmodel::Plan plan = testing::make_plan("llama3-8b", "dgx-h100", 8, 4096, 64);
  const auto estimate = costmodel::estimate_to_json(plan, testing::checked_estimate(plan));
  const std::pair<Section, std::string> suffixes[] = {
      {Section::kMemory, "_bytes"}, {Section::kTime, "_seconds"}, {Section::kThroughput, ""}, {Section::kCommunication, "_per_step"}};
  for (const auto& [section, suffix] : suffixes) {
    std::vector<std::string> in_document;
    for (const auto& [key, value] : estimate.at(planner::section_name(section)).items()) {
      const bool quantity = key.size() > suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0;
      if (quantity && key != "capacity_bytes") in_document.push_back(key);
    }
    std::vector<std::string> listed = planner::section_keys(section);
    std::sort(in_document.begin(), in_document.end());
    std::sort(listed.begin(), listed.end());
    EXPECT_EQ(listed, in_document) << planner::section_name(section);
  }
}

TEST(ParallelLayout, TextNamesCpAndEpOnlyWhenUsed) {
  EXPECT_EQ((planner::ParallelLayout{1, 1, 4, 1, 1, 2}.text()), "tp1 pp1 dp4 zero2");
  EXPECT_EQ((planner::ParallelLayout{8, 2, 4, 2, 4, 1}.text()), "tp8 pp2 dp4 cp2 ep4 zero1");
}

TEST(MeasurementDocument, UnknownKeysAreIgnored) {
  auto m = planner::load_measurement_file(kMeasurementFile);  // has executor_version and memory.peak_reserved_bytes
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->device, "cpu");
  EXPECT_EQ(m->memory.size(), 3u);
  EXPECT_EQ(m->losses, (std::vector<double>{10.4, 10.1, 9.8}));
}

TEST(MeasurementDocument, NullLossesReadAsNotANumber) {
  // nlohmann::json, like most JSON writers, writes a NaN loss as null.
  const auto json = nlohmann::json::parse(R"({"schema": "trainplan/measurement/v1", "memory": {}, "time": {}, "throughput": {},
                                             "losses": [10.5, null]})");
  auto m = planner::read_performance_document(json, "m.json", planner::kMeasurementSchema);
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_EQ(m->losses.size(), 2u);
  EXPECT_EQ(m->losses[0], 10.5);
  EXPECT_TRUE(std::isnan(m->losses[1]));
}

// A mixture-of-experts run's `moe` object is read and shown beside what the cost model assumes:
// balanced routing, at most 1 - capacity factor of the routed copies dropped. The numbers are the
// executor's ep2 run of moe_test.cpp (4 experts, top-2, capacity factor 1, the last step).
TEST(Compare, AnExpertRunShowsTokensDroppedAndLoadImbalance) {
  const auto json = nlohmann::json::parse(R"({"schema": "trainplan/measurement/v1", "memory": {}, "time": {}, "throughput": {},
      "communication": {"ep_bytes_sent_per_step": 433344, "ep_bytes_sent_per_step_mean": 406208},
      "moe": {"experts": 4, "top_k": 2, "capacity_factor": 1, "assignments_per_step": 2048, "tokens_dropped_per_step": 233,
              "dropped_fraction": 0.131640625, "load_imbalance": 1.121, "aux_loss": 1.0114896930754185}})");
  auto m = planner::read_performance_document(json, "m.json", planner::kMeasurementSchema);
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_TRUE(m->moe.has_value());
  EXPECT_EQ(m->moe->experts, 4);
  EXPECT_EQ(m->moe->tokens_dropped_per_step, 233.0);
  PerformanceDocument predicted;
  predicted.communication["ep_bytes_sent_per_step"] = 393408;
  const Comparison c = planner::compare(predicted, *m);
  const std::string text = planner::render_comparison(c, planner::Format::kText);
  EXPECT_NE(text.find("Mixture of experts: 4 experts, top-2, capacity factor 1; the last step over every rank and layer"), std::string::npos) << text;
  EXPECT_NE(line_of(text, "dropped by capacity").find("233 (11.4%; run 13.2%)"), std::string::npos) << text;
  EXPECT_NE(line_of(text, "dropped by capacity").find("at most 0.0%"), std::string::npos) << text;
  EXPECT_NE(line_of(text, "load imbalance").find("1.121"), std::string::npos) << text;
  EXPECT_NE(line_of(text, "expert parallelism").find("+10.2%"), std::string::npos) << text;  // 433344 / 393408
  const nlohmann::json doc = planner::comparison_to_json(c);
  EXPECT_EQ(doc.at("moe").at("tokens_dropped_per_step"), 233.0);
  EXPECT_EQ(planner::comparison_to_json(planner::compare(predicted, predicted)).at("moe"), nullptr);
}

TEST(MeasurementDocument, ErrorsNameTheFileAndThePointer) {
  struct Case {
    const char* what;
    std::string text;
    std::string message;  // expected in full
  };
  const std::string ok_sections = R"("memory": {}, "time": {}, "throughput": {})";
  const Case cases[] = {
      {"negative bytes", R"({"schema": "trainplan/measurement/v1", "memory": {"weights_bytes": -1}, "time": {}, "throughput": {}})",
       "m.json: /memory/weights_bytes: must be a number >= 0 (got -1)"},
      {"bytes as text", R"({"schema": "trainplan/measurement/v1", "memory": {"weights_bytes": "2 GB"}, "time": {}, "throughput": {}})",
       "m.json: /memory/weights_bytes: must be a number >= 0"},
      {"wrong schema", R"({"schema": "trainplan/estimate/v1", )" + ok_sections + "}",
       "m.json: /schema: must be \"trainplan/measurement/v1\" (got \"trainplan/estimate/v1\")"},
      {"no schema", "{" + ok_sections + "}", "m.json: /schema: is required (\"trainplan/measurement/v1\")"},
      {"no time", R"({"schema": "trainplan/measurement/v1", "memory": {}, "throughput": {}})", "m.json: /time: is required (a JSON object)"},
      {"throughput not an object", R"({"schema": "trainplan/measurement/v1", "memory": {}, "time": {}, "throughput": 3})",
       "m.json: /throughput: must be a JSON object"},
      {"tp zero", R"({"schema": "trainplan/measurement/v1", "parallel": {"tp": 0}, )" + ok_sections + "}",
       "m.json: /parallel/tp: must be an integer in [1, 16777216] (got 0)"},
      {"loss as text", R"({"schema": "trainplan/measurement/v1", "losses": [1, "x"], )" + ok_sections + "}",
       "m.json: /losses/1: must be a number (or null for NaN)"},
      {"top level array", "[]", "m.json: /: must be a JSON object"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto json = costmodel::parse_json_text(c.text, "m.json");
    ASSERT_TRUE(json.ok()) << json.error().message;
    auto m = planner::read_performance_document(*json, "m.json", planner::kMeasurementSchema);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.error().message, c.message);
  }
}

// tests/data/tinyllama-4x-zero2-oom.measurement.json: the same plan run out of memory on rank 0,
// in backward of micro-batch 3 of step 1, asking for 15 GiB with 60 GiB allocated and 69 GiB
// reserved (round figures, so the text below is exact); no step completed.
const std::string kOomMeasurementFile = testing::data_path("tinyllama-4x-zero2-oom.measurement.json");

TEST(MeasurementDocument, AnOutOfMemoryRunLoadsWithoutTimeOrThroughput) {
  auto m = planner::load_measurement_file(kOomMeasurementFile);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->status, "out_of_memory");
  ASSERT_TRUE(m->out_of_memory.has_value());
  EXPECT_EQ(m->out_of_memory->requested_bytes, 15.0 * 1073741824.0);
  EXPECT_EQ(m->out_of_memory->allocated_bytes, 60.0 * 1073741824.0);
  EXPECT_EQ(m->out_of_memory->reserved_bytes, 69.0 * 1073741824.0);
  EXPECT_FALSE(m->out_of_memory->process_peak_resident_bytes.has_value());  // null in the file
  EXPECT_EQ(m->out_of_memory->phase, "backward");
  EXPECT_EQ(m->out_of_memory->micro_batch, 3);
  EXPECT_EQ(m->out_of_memory->step, 1);
  EXPECT_TRUE(m->time.empty());
  EXPECT_EQ(m->memory.at("weights_bytes"), 2200096768.0);
  EXPECT_EQ(m->environment.at("nccl_version"), "2.28.9");
  EXPECT_EQ(m->environment.at("sm_clock_max_mhz"), "1980");
}

// A real out-of-memory document: the fused executor on one H100 80GB at micro-batch 64 (issue 12;
// bench/gpu/oom/, command in bench/results.md). Its environment has a boolean (cuda_kernels).
TEST(MeasurementDocument, TheH100OutOfMemoryRunLoadsWithItsEnvironment) {
  auto m = planner::load_measurement_file(testing::data_path("h100-fused/oom-mb64.measurement.json"));
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->status, "out_of_memory");
  ASSERT_TRUE(m->out_of_memory.has_value());
  EXPECT_EQ(m->out_of_memory->requested_bytes, 2.0 * 1073741824.0);  // "Tried to allocate 2.00 GiB"
  EXPECT_EQ(m->out_of_memory->phase, "forward");
  EXPECT_EQ(m->out_of_memory->micro_batch, 0);
  EXPECT_EQ(m->out_of_memory->step, 1);
  EXPECT_EQ(m->environment.at("cuda_kernels"), "true");
  EXPECT_EQ(m->environment.at("kernels"), "fused");
  EXPECT_EQ(m->environment.at("gpu_name"), "NVIDIA H100 80GB HBM3");
}

TEST(MeasurementDocument, OlderDocumentsWithoutStatusOrEnvironmentReadAsOk) {
  auto m = planner::load_measurement_file(kMeasurementFile);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->status, "ok");
  EXPECT_FALSE(m->out_of_memory.has_value());
  EXPECT_TRUE(m->environment.empty());
}

TEST(MeasurementDocument, StatusAndOutOfMemoryErrorsNameThePointer) {
  const struct {
    std::string text, message;
  } cases[] = {
      {R"({"schema": "trainplan/measurement/v1", "status": "crashed", "memory": {}, "time": {}, "throughput": {}})",
       "m.json: /status: must be \"ok\", \"out_of_memory\" or \"diverged\" (got \"crashed\")"},
      {R"({"schema": "trainplan/measurement/v1", "status": "diverged", "memory": {}, "time": {}, "throughput": {}})",
       "m.json: /diverged: is required (a JSON object)"},
      {R"({"schema": "trainplan/measurement/v1", "status": "diverged", "diverged": {"step": 3, "quantity": "lr"}, "memory": {}, "time": {}, "throughput": {}})",
       "m.json: /diverged/quantity: must be \"loss\" or \"grad_norm\" (got \"lr\")"},
      // Numbers no run produces: once compared as "+inf%" and calibrated on.
      {R"({"schema": "trainplan/measurement/v1", "memory": {}, "time": {"step_seconds": 1e308}, "throughput": {}})",
       "m.json: /time/step_seconds: is not a plausible value (got 1e+308, at most 1e+07)"},
      {R"({"schema": "trainplan/measurement/v1", "memory": {}, "time": {"step_seconds": 0}, "throughput": {}})",
       "m.json: /time/step_seconds: must be > 0 seconds (got 0)"},
      {R"({"schema": "trainplan/measurement/v1", "status": "out_of_memory", "memory": {}})",
       "m.json: /out_of_memory: is required (a JSON object)"},
      {R"({"schema": "trainplan/measurement/v1", "status": "out_of_memory", "memory": {}, "out_of_memory": {"requested_bytes": 1}})",
       "m.json: /out_of_memory/phase: is required (forward, backward, data_parallel_wait, pipeline_receive, optimizer or step)"},
      {R"({"schema": "trainplan/measurement/v1", "status": "out_of_memory", "out_of_memory": {"phase": "forward"}})",
       "m.json: /memory: is required (a JSON object)"},
      {R"({"schema": "trainplan/measurement/v1", "memory": {}, "throughput": {}, "status": "ok"})", "m.json: /time: is required (a JSON object)"},
      {R"({"schema": "trainplan/measurement/v1", "memory": {}, "time": {}, "throughput": {}, "environment": {"gpu_name": [1]}})",
       "m.json: /environment/gpu_name: must be a string, a number or true/false"},
  };
  for (const auto& c : cases) {
    auto m = planner::read_performance_document(nlohmann::json::parse(c.text), "m.json", planner::kMeasurementSchema);
    ASSERT_FALSE(m.ok()) << c.text;
    EXPECT_EQ(m.error().message, c.message);
  }
}

Comparison out_of_memory_comparison(std::optional<bool> predicted_fits) {
  auto loaded = planner::load_prediction_file(kPlanFile);
  if (!loaded) throw std::runtime_error(loaded.error().message);
  PerformanceDocument predicted = *loaded;
  if (predicted_fits) predicted.fits = *predicted_fits;
  auto measured = planner::load_measurement_file(kOomMeasurementFile);
  if (!measured) throw std::runtime_error(measured.error().message);
  return planner::compare(predicted, *measured);
}

TEST(Compare, AnOutOfMemoryRunIsShownAgainstThePredictedFit) {
  const Comparison c = out_of_memory_comparison(std::nullopt);
  ASSERT_TRUE(c.predicted.fits.has_value());
  ASSERT_TRUE(*c.predicted.fits);  // TinyLlama on 4 H100s with ZeRO-2 fits by the estimate
  const double required = c.predicted.memory.at("required_bytes");
  char predicted_gib[32];
  std::snprintf(predicted_gib, sizeof(predicted_gib), "%.2f GiB", required / 1073741824.0);
  const std::string expected = std::string("predicted fits at ") + predicted_gib +
                               "; ran out of memory at 69.00 GiB (reserved), asking for 15.00 GiB in backward, micro-batch 3 of step 1";
  ASSERT_TRUE(c.out_of_memory.has_value());
  EXPECT_EQ(*c.out_of_memory, expected);
  EXPECT_EQ(c.out_of_memory_predicted, false);
  const std::string text = planner::render_comparison(c, planner::Format::kText);
  EXPECT_NE(text.find("Out of memory: " + expected + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Environment  LibTorch 2.11.0, CUDA 13.0, NCCL 2.28.9, executor 0123456789abcdef"), std::string::npos) << text;
  EXPECT_NE(planner::render_comparison(c, planner::Format::kMarkdown).find("**Out of memory:** " + expected), std::string::npos);
  EXPECT_NE(planner::render_comparison(c, planner::Format::kHtml).find("ran out of memory at 69.00 GiB (reserved)"), std::string::npos);
  const nlohmann::json j = planner::comparison_to_json(c);
  EXPECT_EQ(j.at("status"), "out_of_memory");
  EXPECT_EQ(j.at("out_of_memory").at("summary"), expected);
  EXPECT_EQ(j.at("out_of_memory").at("predicted_out_of_memory"), false);
  EXPECT_EQ(j.at("out_of_memory").at("reserved_bytes"), 69.0 * 1073741824.0);
  EXPECT_EQ(j.at("out_of_memory").at("micro_batch"), 3);
  // The model states still compare; time was not measured.
  ASSERT_NE(find_row(c, "weights_bytes"), nullptr);
  EXPECT_TRUE(find_row(c, "weights_bytes")->measured.has_value());
  ASSERT_NE(find_row(c, "step_seconds"), nullptr);
  EXPECT_FALSE(find_row(c, "step_seconds")->measured.has_value());
}

TEST(Compare, AnOutOfMemoryRunTheEstimateSaidWouldNotFitSaysThePredictionWasRight) {
  const Comparison c = out_of_memory_comparison(false);
  ASSERT_TRUE(c.out_of_memory.has_value());
  EXPECT_EQ(c.out_of_memory->rfind("predicted does not fit at ", 0), 0u) << *c.out_of_memory;
  EXPECT_NE(c.out_of_memory->find("of step 1: the prediction was right"), std::string::npos) << *c.out_of_memory;
  EXPECT_EQ(c.out_of_memory_predicted, true);
}

TEST(Compare, AnOkRunHasNoOutOfMemoryLine) {
  const Comparison c = sample_comparison();
  EXPECT_FALSE(c.out_of_memory.has_value());
  EXPECT_EQ(planner::render_comparison(c, planner::Format::kText).find("Out of memory"), std::string::npos);
  EXPECT_TRUE(planner::comparison_to_json(c).at("out_of_memory").is_null());
}

TEST(MeasurementDocument, MalformedJsonNamesFileLineAndColumn) {
  auto json = costmodel::parse_json_text("{\n  \"schema\": \"trainplan/measurement/v1\",\n  \"memory\": {,\n}", "m.json");
  ASSERT_FALSE(json.ok());
  EXPECT_EQ(json.error().message.rfind("m.json: line 3, column 14: malformed JSON", 0), 0u) << json.error().message;
}

class CompareCli : public testing::PlannerCliTest {};

TEST_F(CompareCli, ComparesAPlanWithAMeasurement) {
  const auto r = run("compare " + quote(kPlanFile) + " " + quote(kMeasurementFile));
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(line_of(r.out, "weights").find("+100.0%"), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST_F(CompareCli, AnEstimateFromEvaluateComparesLikeItsPlan) {
  const auto evaluated = run("evaluate " + quote(kPlanFile) + " --format json");
  ASSERT_EQ(evaluated.exit_code, 0) << evaluated.all();
  const auto estimate = write("estimate.json", evaluated.out);
  const auto from_estimate = run("compare " + quote(estimate.string()) + " " + quote(kMeasurementFile) + " --format json");
  const auto from_plan = run("compare " + quote(kPlanFile) + " " + quote(kMeasurementFile) + " --format json");
  ASSERT_EQ(from_estimate.exit_code, 0) << from_estimate.all();
  ASSERT_EQ(from_plan.exit_code, 0) << from_plan.all();
  EXPECT_EQ(nlohmann::json::parse(from_estimate.out).at("rows"), nlohmann::json::parse(from_plan.out).at("rows"));
}

TEST_F(CompareCli, TraceWritesTheSampleRunAsChromeTraceEvents) {
  // samples/measurements/tiny-llama-pp4.measurement.json: 4 ranks, 8 forwards and 8 backwards each.
  const auto r = run("trace " + quote(testing::source_path("samples/measurements/tiny-llama-pp4.measurement.json")));
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const auto j = nlohmann::json::parse(r.out);
  int processes = 0, passes = 0;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("name") == "process_name") ++processes;
    if (e.value("cat", "") == "forward" || e.value("cat", "") == "backward") ++passes;
  }
  EXPECT_EQ(processes, 4);
  EXPECT_EQ(passes, 4 * 16);
  const auto none = run("trace " + quote(kMeasurementFile));  // a data-parallel run measured without a trace
  EXPECT_EQ(none.exit_code, 2) << none.all();
  EXPECT_NE(none.err.find(kMeasurementFile + ": /trace: no events"), std::string::npos) << none.err;
}

TEST_F(CompareCli, BadInputExitsTwoNamingTheFile) {
  const auto malformed = write("malformed.json", "{\"schema\": \"trainplan/measurement/v1\", \"memory\": ");
  const auto wrong_schema = write("wrong-schema.json", R"({"schema": "trainplan/plan/v1", "memory": {}, "time": {}, "throughput": {}})");
  const auto negative = write("negative.json", R"({"schema": "trainplan/measurement/v1", "memory": {"weights_bytes": -5}, "time": {}, "throughput": {}})");
  const auto missing = (dir_ / "missing.json").string();
  const std::string plan = quote(kPlanFile);
  expect_bad_inputs({
      {"malformed measurement", "compare " + plan + " " + quote(malformed.string()), malformed.string() + ": line 1, column"},
      {"missing measurement", "compare " + plan + " " + quote(missing), missing + ": cannot open file"},
      {"wrong schema", "compare " + plan + " " + quote(wrong_schema.string()),
       wrong_schema.string() + ": /schema: must be \"trainplan/measurement/v1\""},
      {"negative bytes", "compare " + plan + " " + quote(negative.string()),
       negative.string() + ": /memory/weights_bytes: must be a number >= 0 (got -5)"},
      {"measurement given as the estimate", "compare " + quote(kMeasurementFile) + " " + quote(kMeasurementFile),
       kMeasurementFile + ": /schema: must be \"trainplan/estimate/v1\" or \"trainplan/plan/v1\""},
      {"plan request as the estimate", "compare " + quote(testing::source_path("samples/plans/llama3-70b-64xh100-auto.json")) + " " +
                                           quote(kMeasurementFile),
       "llama3-70b-64xh100-auto.json: /parallel: tp, pp, dp"},
  });
}

}  // namespace
}  // namespace trainplan
