#pragma once
// Plan search: enumerates every valid parallel layout for a PlanRequest (the fields the user did
// not fix), estimates each with the cost model, and ranks those that fit.
//
// Pruned, because they can never win: sequence parallelism off when tp > 1 (same traffic, more
// memory and time), GPipe unless asked for (1F1B has the same bubble and less memory), and
// CPU offload unless no plan fits without it.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/result.hpp"

namespace trainplan::planner {

enum class Objective {
  kThroughput,  // most tokens per second
  kTime,        // least wall-clock time for the run (throughput with goodput)
  kCost,        // least dollars for the run
};

struct SearchOptions {
  Objective objective = Objective::kThroughput;
  int top = 10;  // ranked plans kept
  // Called now and then with the fraction done (0..1). Optional.
  std::function<void(double)> progress;
  // Threads that estimate plans (the caller's plus threads - 1 more). The result is the same for
  // any count: plans of equal score are ranked by their layout. Called back from any of them:
  // `progress` and `should_stop` are called under one lock, never at once.
  int threads = 1;
  // Asked as often as `progress` is called; when it returns true the search stops and returns the
  // error kSearchStopped. Optional. Lets an interactive caller drop a search whose inputs changed.
  std::function<bool()> should_stop;
  // Plans needing more than (1 - memory_headroom) x HBM capacity are "tight": they fit, but are
  // ranked after every plan with room (costmodel::EstimateOptions).
  double memory_headroom = costmodel::kDefaultMemoryHeadroom;
  // Rank distinct layouts (same_layout: tp, pp, dp, cp, ep, ZeRO stage and shard group, recompute,
  // offload): each layout's variants (micro-batch, virtual stages, schedule) fold under its best,
  // and `top` counts layouts. false: every variant is ranked on its own (`planner --all-variants`).
  bool distinct_layouts = true;
};

// Variants of one layout kept under its best (SearchResult::variants).
inline constexpr int kFoldedVariantsKept = 8;

// The message of the error a search stopped by SearchOptions::should_stop returns.
inline constexpr const char* kSearchStopped = "search stopped";

struct Candidate {
  costmodel::Plan plan;
  costmodel::Estimate estimate;
};

// The best variant of one (tp, cp, pp) shape, and why it loses to the recommendation.
struct Alternative {
  Candidate candidate;
  std::string shape;   // "tp=8 pp=2 cp=1"
  std::string reason;  // "stage 0 needs 91.3 GiB > 80.0 GiB ..." or "12% slower: bubble +0.41 s"
};

// The other fitting variants of a ranked plan's layout (micro-batch, virtual stages, schedule).
struct FoldedVariants {
  std::vector<Candidate> best;  // best first, at most kFoldedVariantsKept - 1
  std::int64_t count = 0;       // how many fit, `best` included
};

struct SearchResult {
  std::vector<Candidate> ranked;          // fitting plans, best first, tight ones after the others (at most options.top)
  // variants[i]: ranked[i]'s layout's other variants (empty without distinct_layouts).
  std::vector<FoldedVariants> variants;
  std::vector<Alternative> alternatives;  // other shapes, best first
  std::int64_t evaluated = 0;             // plans estimated
  std::int64_t fitting = 0;               // plans that fit
  double seconds = 0;                     // wall time of the search
  bool offload_considered = false;        // offload was searched because nothing fit without it
};

// Whether two plans have one layout: tp, pp, dp, cp, ep, sequence parallelism, ZeRO stage and
// shard group, recompute (and its layer count), optimizer and parameter offload. Micro-batch,
// virtual stages and schedule are variants of a layout.
[[nodiscard]] bool same_layout(const costmodel::ParallelConfig& a, const costmodel::ParallelConfig& b);
// The layout as words: "tp=1 pp=2 dp=4 cp=1 zero=1 recompute=none" (ep, a shard group, offload
// only when they are used).
[[nodiscard]] std::string layout_text(const costmodel::ParallelConfig& p);

// Fails only on requests no plan can satisfy structurally (an error naming the rule);
// a search whose plans all run out of memory returns an empty `ranked` and the alternatives.
[[nodiscard]] costmodel::Result<SearchResult> search(const costmodel::PlanRequest& request, const SearchOptions& options = {});

// Why the fixed values of `request.parallel` cannot all hold, one sentence per broken rule, each
// naming the values involved as `prefix` + "key=value" (prefix "--fix " for the CLI) and the
// rule: "--fix tp=8 x --fix pp=8 = 64 > 32 GPUs", "--fix tp=3: tp must divide the model's
// attention heads (32)", "--fix schedule=interleaved needs pp > 1, but --fix pp=1". Checks the
// values against each other, the GPU count, the model (heads, kv_heads, ffn_hidden, layers,
// experts), seq_len and the global batch. Empty: no such conflict (the search may still find no
// plan, e.g. when none fits in memory).
[[nodiscard]] std::vector<std::string> constraint_conflicts(const costmodel::PlanRequest& request, const std::string& prefix);

// Estimates one fixed plan, after validate_plan.
[[nodiscard]] costmodel::Result<Candidate> evaluate(const costmodel::Plan& plan, const costmodel::EstimateOptions& options = {});

// The runnable plan of a request read from `file`: its layout (costmodel::unset_layout_fields)
// must be fixed, other open fields take costmodel::plan_with_defaults' defaults, the same rule
// as the executor's; errors name the file. An open layout is an error that names the fields and
// says how to fix them: `planner search FILE --save-plan FIXED`.
[[nodiscard]] costmodel::Result<costmodel::Plan> fixed_plan(const costmodel::PlanRequest& request, const std::string& file);
// load_plan_file, then fixed_plan.
[[nodiscard]] costmodel::Result<costmodel::Plan> load_fixed_plan(const std::string& path);

// Score to minimise for an objective.
[[nodiscard]] double objective_score(const costmodel::Estimate& e, Objective objective);
[[nodiscard]] const char* objective_name(Objective o);

}  // namespace trainplan::planner
