// Plan search: ranking, fixed constraints, structurally impossible requests, models that fit
// nowhere, and the objectives.

#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_support.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/planner/inputs.hpp"
#include "trainplan/planner/search.hpp"

namespace trainplan {
namespace {

using namespace costmodel;
using planner::Objective;
using planner::SearchOptions;
using planner::SearchResult;

PlanRequest request(const std::string& model, const std::string& cluster, int gpus) {
  PlanRequest r;
  r.name = model + "-search-test";
  r.model = testing::model(model);
  r.model_ref = model;
  r.cluster = testing::cluster(cluster);
  r.cluster_ref = cluster;
  r.gpus = gpus;
  resolve_training_defaults(r.model, r.training);
  return r;
}

SearchResult run_search(const PlanRequest& r, SearchOptions options = {}) {
  auto result = planner::search(r, options);
  if (!result) throw std::runtime_error(result.error().message);
  return std::move(result).value();
}

TEST(Search, Llama70bOn64H100sRanksFittingPlansByThroughput) {
  const PlanRequest r = request("llama3-70b", "dgx-h100", 64);
  ASSERT_EQ(r.training.seq_len, 8192);
  ASSERT_EQ(r.training.global_batch, 512);  // 4 Mi tokens / 8192
  const SearchResult s = run_search(r);
  ASSERT_FALSE(s.ranked.empty());
  EXPECT_LE(s.ranked.size(), 10u);  // SearchOptions::top
  EXPECT_GT(s.evaluated, 1000);
  EXPECT_GE(s.fitting, static_cast<std::int64_t>(s.ranked.size()));
  EXPECT_LE(s.fitting, s.evaluated);
  EXPECT_FALSE(s.offload_considered);
  for (std::size_t i = 0; i < s.ranked.size(); ++i) {
    const auto& c = s.ranked[i];
    SCOPED_TRACE("rank " + std::to_string(i));
    EXPECT_TRUE(c.estimate.fits);
    EXPECT_LE(c.estimate.memory.total.value(), c.estimate.memory.capacity.value());
    EXPECT_EQ(c.plan.parallel.gpus(), 64);
    EXPECT_TRUE(validate_plan(c.plan).ok());
    if (i > 0) {
      EXPECT_GE(s.ranked[i - 1].estimate.throughput.tokens_per_second, c.estimate.throughput.tokens_per_second);
    }
  }
  // The recommendation's estimate is the cost model's for that plan, nothing cached or mixed up.
  const Estimate again = estimate(s.ranked.front().plan);
  EXPECT_DOUBLE_EQ(again.time.step.value(), s.ranked.front().estimate.time.step.value());
  EXPECT_DOUBLE_EQ(again.memory.total.value(), s.ranked.front().estimate.memory.total.value());
  // Each other shape is represented by its best variant: one that fits where any does, so
  // fitting alternatives exist here and come first.
  ASSERT_FALSE(s.alternatives.empty());
  EXPECT_TRUE(s.alternatives.front().candidate.estimate.fits) << s.alternatives.front().shape;
  for (std::size_t i = 1; i < s.alternatives.size(); ++i) {
    EXPECT_FALSE(!s.alternatives[i - 1].candidate.estimate.fits && s.alternatives[i].candidate.estimate.fits) << "fitting after non-fitting at " << i;
  }
  // Nothing among the alternatives that fits beats the recommendation.
  for (const auto& a : s.alternatives) {
    if (a.candidate.estimate.fits) {
      EXPECT_LE(a.candidate.estimate.throughput.tokens_per_second, s.ranked.front().estimate.throughput.tokens_per_second) << a.shape;
    }
    EXPECT_FALSE(a.reason.empty()) << a.shape;
  }
}

TEST(Search, IsDeterministic) {
  const PlanRequest r = request("llama3-8b", "dgx-a100-80g", 32);
  const SearchResult a = run_search(r), b = run_search(r);
  ASSERT_EQ(a.ranked.size(), b.ranked.size());
  EXPECT_EQ(a.evaluated, b.evaluated);
  for (std::size_t i = 0; i < a.ranked.size(); ++i) {
    EXPECT_EQ(parallel_to_json(a.ranked[i].plan.parallel), parallel_to_json(b.ranked[i].plan.parallel)) << i;
  }
}

TEST(Search, FixedTensorParallelismHoldsForEveryPlan) {
  PlanRequest r = request("llama3-70b", "dgx-h100", 64);
  r.parallel.tp = 8;
  const SearchResult s = run_search(r);
  ASSERT_FALSE(s.ranked.empty());
  for (const auto& c : s.ranked) EXPECT_EQ(c.plan.parallel.tp, 8);
  for (const auto& a : s.alternatives) EXPECT_EQ(a.candidate.plan.parallel.tp, 8) << a.shape;
}

TEST(Search, SeveralFixedFieldsHoldTogether) {
  PlanRequest r = request("llama3-70b", "dgx-h100", 64);
  r.parallel.pp = 4;
  r.parallel.recompute = Recompute::kFull;
  r.parallel.zero_stage = 1;
  const SearchResult s = run_search(r);
  ASSERT_FALSE(s.ranked.empty());
  for (const auto& c : s.ranked) {
    EXPECT_EQ(c.plan.parallel.pp, 4);
    EXPECT_EQ(c.plan.parallel.recompute, Recompute::kFull);
    EXPECT_EQ(c.plan.parallel.zero_stage, 1);
  }
}

// DeepSpeed's PipelineEngine runs TrainSchedule, one chunk per stage (runtime/pipe/schedule.py):
// no variant of any layout it is offered is interleaved; Megatron's search of the same request
// ranks interleaved variants first.
TEST(Search, OffersDeepspeedNoInterleavedPipeline) {
  const auto interleaved = [](Stack stack) {
    PlanRequest r = request("llama3-70b", "dgx-h100", 64);
    r.training.stack = stack;
    r.parallel.pp = 4;
    r.parallel.zero_stage = 1;
    SearchOptions all;
    all.distinct_layouts = false;
    all.top = 1000;
    const SearchResult s = run_search(r, all);
    EXPECT_FALSE(s.ranked.empty());
    int n = 0;
    for (const auto& c : s.ranked) n += c.plan.parallel.schedule == Schedule::kInterleaved || c.plan.parallel.virtual_stages > 1;
    for (const auto& a : s.alternatives) n += a.candidate.plan.parallel.virtual_stages > 1;
    return n;
  };
  EXPECT_EQ(interleaved(Stack::kDeepspeed), 0);
  EXPECT_GT(interleaved(Stack::kMegatronTe), 0);
}

TEST(Search, TensorParallelismThatDoesNotDivideHeadsIsAnError) {
  PlanRequest r = request("llama3-70b", "dgx-h100", 64);
  r.parallel.tp = 3;
  auto s = planner::search(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("tp(3)"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("heads (64)"), std::string::npos) << s.error().message;
}

TEST(Search, FixedAxesThatDoNotDivideTheGpusAreAnError) {
  PlanRequest r = request("llama3-70b", "dgx-h100", 64);
  r.parallel.pp = 5;
  auto s = planner::search(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("gpus(64)"), std::string::npos) << s.error().message;
}

// Fixed values that cannot hold together: the error names each value involved and the rule, not
// "no combination fits".
TEST(ConstraintConflicts, NameTheFixedValuesAndTheRuleTheyBreak) {
  struct Case {
    const char* what;
    std::string model;
    int gpus;
    std::vector<std::pair<const char*, const char*>> fixes;
    std::string conflict;  // expected among the conflicts; "" for none
  };
  const Case cases[] = {
      {"axes beyond the GPUs", "llama3-8b", 32, {{"tp", "8"}, {"pp", "8"}}, "--fix tp=8 x --fix pp=8 = 64 > 32 GPUs"},
      {"axes not dividing the GPUs", "llama3-8b", 48, {{"tp", "8"}, {"pp", "4"}}, "--fix tp=8 x --fix pp=4 = 32, which does not divide 48 GPUs"},
      {"all axes fixed, product short", "llama3-8b", 32, {{"tp", "2"}, {"pp", "2"}, {"dp", "2"}, {"cp", "1"}},
       "--fix tp=2 x --fix cp=1 x --fix pp=2 x --fix dp=2 = 8 != 32 GPUs (all of tp, cp, pp and dp are fixed; their product must be the GPU count)"},
      {"tp not dividing heads", "llama3-8b", 32, {{"tp", "3"}}, "--fix tp=3: tp must divide the model's attention heads (32)"},
      {"pp beyond layers", "llama3-8b", 64, {{"pp", "64"}}, "--fix pp=64: more pipeline stages than the model's 32 layers"},
      {"chunks beyond layers", "llama3-8b", 32, {{"pp", "16"}, {"v", "4"}}, "--fix pp=16 x --fix v=4 = 64 model chunks > the model's 32 layers"},
      {"interleaved without a pipeline", "llama3-8b", 32, {{"schedule", "interleaved"}, {"pp", "1"}},
       "--fix schedule=interleaved needs pp > 1, but --fix pp=1"},
      {"chunks under 1f1b", "llama3-8b", 32, {{"v", "2"}, {"schedule", "1f1b"}}, "--fix v=2 needs schedule=interleaved, but --fix schedule=1f1b"},
      {"micro-batch not dividing the batch", "llama3-8b", 32, {{"mb", "3"}},
       "--fix mb=3: the micro-batch must divide the global batch (512 sequences)"},
      {"dp x micro-batch beyond the batch", "llama3-8b", 32, {{"dp", "32"}, {"mb", "32"}},
       "--fix dp=32 x --fix mb=32 = 1024 sequences, which does not divide the global batch (512)"},
      {"hybrid shard under ZeRO-1", "llama3-8b", 32, {{"zero", "1"}, {"shard_group", "2"}}, "--fix shard_group=2 (hybrid sharding) needs zero=3, but --fix zero=1"},
      {"experts on a dense model", "llama3-8b", 32, {{"ep", "2"}}, "--fix ep=2: expert parallelism needs a mixture-of-experts model (llama3-8b has no experts)"},
      {"values that fit", "llama3-8b", 32, {{"tp", "8"}, {"pp", "4"}, {"mb", "1"}}, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    PlanRequest r = request(c.model, "dgx-h100", c.gpus);
    for (const auto& [key, value] : c.fixes) ASSERT_TRUE(planner::apply_constraint(key, value, r.parallel).ok()) << key;
    const std::vector<std::string> conflicts = planner::constraint_conflicts(r, "--fix ");
    if (c.conflict.empty()) {
      EXPECT_TRUE(conflicts.empty()) << conflicts.front();
    } else {
      EXPECT_NE(std::find(conflicts.begin(), conflicts.end(), c.conflict), conflicts.end())
          << "no \"" << c.conflict << "\" among: " << (conflicts.empty() ? std::string("(none)") : conflicts.front());
    }
  }
}

TEST(Search, ConflictingFixedValuesFailNamingThemNotNoCombinationFits) {
  PlanRequest r = request("llama3-8b", "dgx-h100", 32);
  r.parallel.schedule = Schedule::kInterleaved;
  r.parallel.pp = 1;
  auto s = planner::search(r);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message, "no valid plan: the fixed values conflict: schedule=interleaved needs pp > 1, but pp=1");
}

TEST(Search, AFixedMicroBatchAbove64IsSearched) {
  PlanRequest r = request("llama3-8b", "dgx-h100", 8);
  r.parallel.micro_batch = 128;
  r.parallel.tp = 8;
  r.training.seq_len = 512;
  const SearchResult s = run_search(r);
  EXPECT_GT(s.evaluated, 0);
  for (const auto& c : s.ranked) EXPECT_EQ(c.plan.parallel.micro_batch, 128);
}

// Llama 3 405B needs ~811 GB just for 16-bit weights; 8 A100 40GB hold 344 GB in all.
TEST(Search, ModelTooBigForTheClusterYieldsNoPlanButExplainedAlternatives) {
  const PlanRequest r = request("llama3-405b", "dgx-a100-40g", 8);
  const SearchResult s = run_search(r);
  EXPECT_TRUE(s.ranked.empty());
  EXPECT_EQ(s.fitting, 0);
  EXPECT_GT(s.evaluated, 0);
  EXPECT_TRUE(s.offload_considered) << "CPU offload is tried when nothing fits without it";
  ASSERT_FALSE(s.alternatives.empty());
  for (const auto& a : s.alternatives) {
    EXPECT_FALSE(a.candidate.estimate.fits) << a.shape;
    EXPECT_NE(a.reason.find("GiB"), std::string::npos) << a.shape << ": " << a.reason;
  }
  // Sorted by how close they come to fitting.
  for (std::size_t i = 1; i < s.alternatives.size(); ++i) {
    EXPECT_LE(s.alternatives[i - 1].candidate.estimate.memory.required.value(), s.alternatives[i].candidate.estimate.memory.required.value());
  }
}

TEST(Search, CostObjectiveRanksByDollars) {
  const PlanRequest r = request("llama3-8b", "dgx-h100", 64);
  SearchOptions options;
  options.objective = Objective::kCost;
  const SearchResult by_cost = run_search(r, options);
  ASSERT_GE(by_cost.ranked.size(), 2u);
  for (std::size_t i = 1; i < by_cost.ranked.size(); ++i) {
    EXPECT_LE(by_cost.ranked[i - 1].estimate.run.cost_usd, by_cost.ranked[i].estimate.run.cost_usd) << i;
  }
  const SearchResult by_throughput = run_search(r);
  ASSERT_FALSE(by_throughput.ranked.empty());
  EXPECT_LE(by_cost.ranked.front().estimate.run.cost_usd, by_throughput.ranked.front().estimate.run.cost_usd);
  EXPECT_GE(by_throughput.ranked.front().estimate.throughput.tokens_per_second, by_cost.ranked.front().estimate.throughput.tokens_per_second);
}

TEST(Search, TimeObjectiveRanksByWallTime) {
  const PlanRequest r = request("llama3-8b", "dgx-h100", 64);
  SearchOptions options;
  options.objective = Objective::kTime;
  const SearchResult s = run_search(r, options);
  ASSERT_GE(s.ranked.size(), 2u);
  for (std::size_t i = 1; i < s.ranked.size(); ++i) EXPECT_LE(s.ranked[i - 1].estimate.run.wall_time.value(), s.ranked[i].estimate.run.wall_time.value());
}

TEST(Search, TopLimitsTheRankedListAndProgressEndsAtOne) {
  const PlanRequest r = request("llama3-8b", "dgx-h100", 16);
  SearchOptions options;
  options.top = 3;
  std::vector<double> progress;
  options.progress = [&](double f) { progress.push_back(f); };
  const SearchResult s = run_search(r, options);
  EXPECT_EQ(s.ranked.size(), 3u);
  ASSERT_FALSE(progress.empty());
  EXPECT_DOUBLE_EQ(progress.back(), 1.0);
  for (double f : progress) {
    EXPECT_GE(f, 0.0);
    EXPECT_LE(f, 1.0);
  }
}

TEST(Search, ShouldStopEndsTheSearchWithTheStoppedError) {
  const PlanRequest r = request("llama3-70b", "dgx-h100", 64);
  SearchOptions options;
  int asked = 0;
  options.should_stop = [&] { return ++asked >= 3; };
  auto s = planner::search(r, options);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message, planner::kSearchStopped);
  EXPECT_EQ(asked, 3) << "stops at the first check that says so";

  options.should_stop = [] { return false; };
  EXPECT_TRUE(planner::search(r, options).ok());
}

// Split over threads, the search gives exactly the result of one thread: the same ranking (ties
// broken by the layout), the same alternatives and counts.
TEST(Search, ThreadsGiveTheResultOfOneThread) {
  struct Case {
    const char* model;
    const char* cluster;
    int gpus;
    Objective objective;
  };
  const Case cases[] = {{"llama3-70b", "dgx-h100", 64, Objective::kThroughput},
                        {"llama3-8b", "dgx-h100", 64, Objective::kCost},
                        {"mixtral-8x7b", "dgx-h100", 32, Objective::kTime},
                        {"llama3-405b", "dgx-a100-40g", 8, Objective::kThroughput}};  // nothing fits: the offload pass too
  for (const auto& c : cases) {
    const PlanRequest r = request(c.model, c.cluster, c.gpus);
    SearchOptions one;
    one.objective = c.objective;
    one.top = 20;
    const SearchResult a = run_search(r, one);
    for (int threads : {2, 3}) {
      SearchOptions many = one;
      many.threads = threads;
      std::vector<double> progress;
      many.progress = [&](double f) { progress.push_back(f); };
      const SearchResult b = run_search(r, many);
      EXPECT_EQ(b.evaluated, a.evaluated) << c.model;
      EXPECT_EQ(b.fitting, a.fitting) << c.model;
      EXPECT_EQ(b.offload_considered, a.offload_considered) << c.model;
      ASSERT_EQ(b.ranked.size(), a.ranked.size()) << c.model;
      for (std::size_t i = 0; i < a.ranked.size(); ++i) {
        EXPECT_EQ(parallel_to_json(b.ranked[i].plan.parallel), parallel_to_json(a.ranked[i].plan.parallel)) << c.model << " rank " << i;
        EXPECT_EQ(b.ranked[i].estimate.time.step.value(), a.ranked[i].estimate.time.step.value()) << c.model << " rank " << i;
      }
      ASSERT_EQ(b.alternatives.size(), a.alternatives.size()) << c.model;
      for (std::size_t i = 0; i < a.alternatives.size(); ++i) {
        EXPECT_EQ(b.alternatives[i].shape, a.alternatives[i].shape) << c.model;
        EXPECT_EQ(b.alternatives[i].reason, a.alternatives[i].reason) << c.model;
      }
      ASSERT_FALSE(progress.empty());
      EXPECT_DOUBLE_EQ(progress.back(), 1.0);
    }
  }
}

// The search prices each distinct layer setting, collective and pipeline split once
// (EstimateMemo) and writes the reasons of the plans it keeps only: every plan it returns must
// carry, bit for bit, the estimate estimate() gives that plan on its own.
void expect_own_estimate(const planner::Candidate& c, const std::string& where) {
  const Estimate e = estimate(c.plan);
  const Estimate& got = c.estimate;
  EXPECT_EQ(got.fits, e.fits) << where;
  EXPECT_EQ(got.tight, e.tight) << where;
  EXPECT_EQ(got.reasons, e.reasons) << where;
  EXPECT_EQ(got.time.step.value(), e.time.step.value()) << where;
  EXPECT_EQ(got.time.sustained_step.value(), e.time.sustained_step.value()) << where;
  EXPECT_EQ(got.time.clock.value(), e.time.clock.value()) << where;
  EXPECT_EQ(got.time.dp_comm_exposed.value(), e.time.dp_comm_exposed.value()) << where;
  EXPECT_EQ(got.time.dp_comm_total.value(), e.time.dp_comm_total.value()) << where;
  EXPECT_EQ(got.memory.required.value(), e.memory.required.value()) << where;
  EXPECT_EQ(got.memory.reserved.value(), e.memory.reserved.value()) << where;
  EXPECT_EQ(got.memory.activations.value(), e.memory.activations.value()) << where;
  EXPECT_EQ(got.pipeline.chunk_layers, e.pipeline.chunk_layers) << where;
  EXPECT_EQ(got.throughput.mfu, e.throughput.mfu) << where;
}

TEST(Search, EveryPlanReturnedCarriesItsOwnEstimate) {
  struct Case {
    const char* label;
    PlanRequest request;
    bool distinct_layouts;
  };
  std::vector<Case> cases;
  cases.push_back({"llama3-70b on 64 H100", request("llama3-70b", "dgx-h100", 64), true});
  cases.push_back({"llama3-70b on 64 H100, top plans", request("llama3-70b", "dgx-h100", 64), false});
  cases.push_back({"mixtral on 32 H100 (experts)", request("mixtral-8x7b", "dgx-h100", 32), true});
  cases.push_back({"405b on 8 A100 40GB (nothing fits: offload, reasons)", request("llama3-405b", "dgx-a100-40g", 8), true});
  // 126 layers: every 16-stage pipeline holds chunks of unequal layers, priced by their schedule.
  cases.push_back({"405b on 4096 H100 (chunks of unequal layers)", request("llama3-405b", "dgx-h100", 4096), true});
  cases.push_back({"405b on 4096 H100, top plans", request("llama3-405b", "dgx-h100", 4096), false});
  {
    PlanRequest r = request("llama3-8b", "dgx-h100", 16);  // DeepSpeed's per-tensor loops, LoRA
    r.training.stack = Stack::kDeepspeed;
    r.training.mode = TrainingMode::kLora;
    cases.push_back({"llama3-8b LoRA under DeepSpeed on 16 H100", r, true});
  }
  {
    PlanRequest r = request("llama3-8b", "dgx-h100", 16);  // the sustained clock: a second estimate per plan
    r.cluster.gpu.peak_clock_mhz = 1830;
    r.cluster.gpu.sustained_clock_mhz = 1525;
    cases.push_back({"llama3-8b on 16 H100 held to 1525 MHz", r, true});
  }
  {
    PlanRequest r = request("llama3-70b", "dgx-h100", 32);  // some layers of each stage recomputed: two layer settings
    r.parallel.recompute = Recompute::kFull;
    r.parallel.recompute_layers = 2;
    cases.push_back({"llama3-70b on 32 H100, 2 layers recomputed per stage", r, true});
  }
  for (const Case& c : cases) {
    SearchOptions options;
    options.distinct_layouts = c.distinct_layouts;
    options.top = 6;
    const SearchResult s = run_search(c.request, options);
    ASSERT_FALSE(s.ranked.empty() && s.alternatives.empty()) << c.label;
    for (std::size_t i = 0; i < s.ranked.size(); ++i) {
      expect_own_estimate(s.ranked[i], std::string(c.label) + ", rank " + std::to_string(i));
      for (const auto& v : s.variants[i].best) expect_own_estimate(v, std::string(c.label) + ", a variant of rank " + std::to_string(i));
    }
    for (const auto& a : s.alternatives) expect_own_estimate(a.candidate, std::string(c.label) + ", alternative " + a.shape);
  }
}

// The sweep prices a pipeline of unequal chunks by its schedule's lower bound and what it returns
// by the schedule run; no plan lost to the bound may be one the run ranks higher. Against every
// fitting plan priced by the run (an unfolded search of all of them) on 70B over 64 H100, where
// the run is up to 22% slower than the bound: the best plan of a top-1 search, folded or not, and
// the top 3 unfolded are the full ranking's first; each layout's folded variants are its best by
// the run, in order; and each alternative is its shape's best plan by the run.
TEST(Search, RanksByTheScheduleRunWhatTheSweepPricedByItsBound) {
  const PlanRequest r = request("llama3-70b", "dgx-h100", 64);
  SearchOptions every;
  every.distinct_layouts = false;
  every.top = 100000;
  const SearchResult full = run_search(r, every);
  ASSERT_EQ(static_cast<std::int64_t>(full.ranked.size()), full.fitting);
  // The bound and the run rank these plans differently: by the bound, the run's best is not first.
  {
    EstimateOptions bound;
    bound.exact_pipeline = false;
    const planner::Candidate* first_by_bound = nullptr;
    double best_bound = 0;
    for (const planner::Candidate& c : full.ranked) {
      if (c.estimate.tight) continue;
      const double tokens = estimate(c.plan, bound).throughput.tokens_per_second;
      if (first_by_bound == nullptr || tokens > best_bound) {
        first_by_bound = &c;
        best_bound = tokens;
      }
    }
    ASSERT_NE(first_by_bound, nullptr);
    EXPECT_GT(best_bound, full.ranked[0].estimate.throughput.tokens_per_second * 1.002);  // 72.6 K against 72.4 K
    EXPECT_NE(first_by_bound, &full.ranked[0]);
  }
  const auto same = [](const planner::Candidate& a, const planner::Candidate& b) {
    const ParallelConfig &x = a.plan.parallel, &y = b.plan.parallel;
    return planner::same_layout(x, y) && x.micro_batch == y.micro_batch && x.virtual_stages == y.virtual_stages && x.schedule == y.schedule &&
           x.ends_in_split == y.ends_in_split;
  };
  for (const bool distinct : {true, false}) {
    SearchOptions one;
    one.distinct_layouts = distinct;
    one.top = 1;
    const SearchResult s = run_search(r, one);
    ASSERT_EQ(s.ranked.size(), 1u);
    EXPECT_TRUE(same(s.ranked[0], full.ranked[0])) << "distinct " << distinct;
  }
  SearchOptions three;
  three.distinct_layouts = false;
  three.top = 3;
  const SearchResult unfolded = run_search(r, three);
  ASSERT_EQ(unfolded.ranked.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(same(unfolded.ranked[i], full.ranked[i])) << i;

  SearchOptions folded;
  folded.top = 10;
  const SearchResult f = run_search(r, folded);
  ASSERT_EQ(f.ranked.size(), 10u);
  for (std::size_t i = 0; i < f.ranked.size(); ++i) {
    std::vector<const planner::Candidate*> layout;  // the layout's plans in the full ranking's order
    for (const planner::Candidate& c : full.ranked) {
      if (planner::same_layout(c.plan.parallel, f.ranked[i].plan.parallel)) layout.push_back(&c);
    }
    ASSERT_FALSE(layout.empty());
    EXPECT_EQ(static_cast<std::size_t>(f.variants[i].count), layout.size()) << i;
    EXPECT_TRUE(same(f.ranked[i], *layout[0])) << i;
    for (std::size_t k = 0; k < f.variants[i].best.size(); ++k) {
      ASSERT_LT(k + 1, layout.size());
      EXPECT_TRUE(same(f.variants[i].best[k], *layout[k + 1])) << i << " variant " << k;
    }
  }
  int fitting_alternatives = 0;
  for (const auto& a : f.alternatives) {
    if (!a.candidate.estimate.fits) continue;
    ++fitting_alternatives;
    for (const planner::Candidate& c : full.ranked) {  // the shape's first plan in the full ranking
      if (c.plan.parallel.tp != a.candidate.plan.parallel.tp || c.plan.parallel.pp != a.candidate.plan.parallel.pp ||
          c.plan.parallel.cp != a.candidate.plan.parallel.cp) {
        continue;
      }
      EXPECT_TRUE(same(a.candidate, c)) << a.shape;
      break;
    }
  }
  EXPECT_GT(fitting_alternatives, 10);
}

// No place to fill: no plan, folded or not (SearchOptions::top 0), and no failure.
TEST(Search, TopZeroRanksNothing) {
  for (const bool distinct : {true, false}) {
    SearchOptions none;
    none.distinct_layouts = distinct;
    none.top = 0;
    const SearchResult s = run_search(request("llama3-8b", "dgx-h100", 8), none);
    EXPECT_TRUE(s.ranked.empty()) << distinct;
    EXPECT_TRUE(s.variants.empty()) << distinct;
    EXPECT_GT(s.fitting, 0) << distinct;
  }
}

// The search tries the pipeline split that counts the embedding and the loss as layers where the
// stack runs it (Megatron-Core): Llama 3 405B on 16 stages of 8 chunks can only be split that way
// (126 + 2 = 16 x 8), and a stack without it gets no such plan.
TEST(Search, CountsTheEmbeddingAndTheLossInThePipelineSplitWhereTheStackDoes) {
  PlanRequest r = request("llama3-405b", "dgx-h100", 1024);
  r.training.stack = Stack::kMegatronTe;
  r.parallel.tp = 8;
  r.parallel.pp = 16;
  r.parallel.virtual_stages = 8;
  const SearchResult s = run_search(r);
  ASSERT_FALSE(s.ranked.empty());
  for (const auto& c : s.ranked) {
    EXPECT_TRUE(c.plan.parallel.ends_in_split);
    EXPECT_EQ(c.estimate.pipeline.chunk_layers.front(), 0);
    // The drawn schedule's chunks: the first is the embedding alone, the last the loss alone
    // (128 chunks of one place each), each the share of its stage's time that its part of the
    // model takes; a stage's chunks add up to its time.
    const PipelineTimeline& t = c.estimate.pipeline;
    const int last = t.stages * t.virtual_stages - 1;
    EXPECT_NEAR(t.chunk_forward_seconds(0) / t.chunk_forward_seconds(t.stages), t.embedding_forward_seconds / t.layer_forward_seconds, 1e-12);
    EXPECT_NEAR(t.chunk_backward_seconds(last) / t.chunk_backward_seconds(last - t.stages), t.head_backward_seconds / t.layer_backward_seconds,
                1e-12);
    EXPECT_LT(t.chunk_forward_seconds(0), t.chunk_forward_seconds(t.stages));
    for (int stage : {0, t.stages - 1}) {
      double forward = 0;
      for (int chunk = 0; chunk < t.virtual_stages; ++chunk) forward += t.chunk_forward_seconds(chunk * t.stages + stage);
      EXPECT_NEAR(forward, t.forward_seconds[static_cast<std::size_t>(stage)], 1e-12 * forward) << "stage " << stage;
    }
  }
  // Unfixed virtual stages: both splits are searched, and the recommendation is the faster.
  PlanRequest open = r;
  open.parallel.virtual_stages.reset();
  const SearchResult both = run_search(open);
  ASSERT_FALSE(both.ranked.empty());
  PlanRequest without = open;
  without.parallel.ends_in_split = false;
  const SearchResult plain = run_search(without);
  ASSERT_FALSE(plain.ranked.empty());
  EXPECT_GE(both.ranked.front().estimate.throughput.tokens_per_second, plain.ranked.front().estimate.throughput.tokens_per_second);
  EXPECT_GT(both.evaluated, plain.evaluated);
  // Fixed on where layers + 2 do not split over the chunks: said so, not "no combination fits".
  PlanRequest uneven = r;
  uneven.parallel.virtual_stages = 7;
  uneven.parallel.ends_in_split = true;
  const auto odd = planner::search(uneven, {});
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.error().message.find("ends_in_split=on: the model's 126 layers + the embedding + the loss = 128 do not split evenly over pp=16 x v=7 = 112 model chunks"),
            std::string::npos)
      << odd.error().message;
  // Fixed on under a stack without it: refused, naming the stack.
  PlanRequest fsdp = r;
  fsdp.training.stack = Stack::kFsdp2;
  fsdp.parallel.ends_in_split = true;
  const auto refused = planner::search(fsdp, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("ends_in_split=on: the fsdp2 stack does not count the embedding and the loss"), std::string::npos)
      << refused.error().message;
}

// Plans of equal score are ranked by their layout, not by the order the search met them.
TEST(Search, EqualScoresAreRankedSimplerPlanFirst) {
  // A tie goes to the plan that is easier to run: no context, expert or pipeline parallelism
  // before them, then less tensor parallelism.
  const SearchResult s = run_search(request("llama3-8b", "dgx-h100", 64));
  int ties = 0;
  for (std::size_t i = 1; i < s.ranked.size(); ++i) {
    const double prev = s.ranked[i - 1].estimate.throughput.tokens_per_second, cur = s.ranked[i].estimate.throughput.tokens_per_second;
    EXPECT_GE(prev, cur);
    if (prev == cur) {
      ++ties;
      const auto& p = s.ranked[i - 1].plan.parallel;
      const auto& q = s.ranked[i].plan.parallel;
      EXPECT_LE(std::make_tuple(p.cp, p.ep, p.pp, p.tp), std::make_tuple(q.cp, q.ep, q.pp, q.tp));
    }
  }
  std::printf("ties among %zu ranked plans: %d\n", s.ranked.size(), ties);
}

TEST(Search, ATieBetweenContextAndDataParallelismGoesToDataParallelism) {
  // Llama 3 8B on 8 H100s: cp=8 and dp=8 are estimated alike here; the recommendation is the
  // plan without context parallelism, which every framework (and this project's executor) runs.
  const SearchResult s = run_search(request("llama3-8b", "dgx-h100", 8));
  ASSERT_FALSE(s.ranked.empty());
  const auto& best = s.ranked.front();
  for (const auto& other : s.ranked) {
    if (other.estimate.throughput.tokens_per_second < best.estimate.throughput.tokens_per_second) break;
    EXPECT_LE(best.plan.parallel.cp, other.plan.parallel.cp);
  }
  EXPECT_EQ(best.plan.parallel.cp, 1);
}

TEST(Search, ShortSequencesKeepThePlansWithoutContextParallelism) {
  // seq_len 512 < 1024: no context-parallel shard is long enough, but cp=1 is always a candidate.
  PlanRequest req = request("llama3-8b", "dgx-h100", 8);
  req.training.seq_len = 512;
  req.training.global_batch = 1024;
  const SearchResult s = run_search(req);
  ASSERT_FALSE(s.ranked.empty());
  EXPECT_EQ(s.ranked.front().plan.parallel.cp, 1);
}

TEST(ObjectiveScore, LowerIsBetterForEveryObjective) {
  Estimate fast, slow;
  fast.throughput.tokens_per_second = 2e5;
  slow.throughput.tokens_per_second = 1e5;
  fast.run.wall_time = Seconds(100);
  slow.run.wall_time = Seconds(200);
  fast.run.cost_usd = 10;
  slow.run.cost_usd = 20;
  for (Objective o : {Objective::kThroughput, Objective::kTime, Objective::kCost}) {
    EXPECT_LT(planner::objective_score(fast, o), planner::objective_score(slow, o)) << planner::objective_name(o);
  }
  EXPECT_STREQ(planner::objective_name(Objective::kCost), "cost");
}

TEST(Evaluate, RejectsAnInvalidPlanWithTheRule) {
  auto req = load_plan_file(testing::source_path("samples/plans/gpt3-175b-1024xa100.json"));
  ASSERT_TRUE(req.ok()) << req.error().message;
  Plan plan{req->name, req->model_ref, req->cluster_ref, req->model, req->cluster, req->gpus, req->training, req->parallel.fixed()};
  auto ok = planner::evaluate(plan);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_TRUE(ok->estimate.fits);
  plan.parallel.pp = 16;
  plan.parallel.dp = 8;
  plan.parallel.virtual_stages = 7;  // 16 stages x 7 chunks = 112 > 96 layers
  auto bad = planner::evaluate(plan);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("exceeds layers (96)"), std::string::npos) << bad.error().message;
}

}  // namespace
}  // namespace trainplan
