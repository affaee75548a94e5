#include "trainplan/planner/search.hpp"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <mutex>
#include <thread>
#include <tuple>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>
#include <utility>

#include "trainplan/costmodel/stack.hpp"

namespace trainplan::planner {

using namespace trainplan::costmodel;

const char* objective_name(Objective o) {
  switch (o) {
    case Objective::kThroughput: return "throughput";
    case Objective::kTime: return "time";
    case Objective::kCost: return "cost";
  }
  return "?";
}

double objective_score(const Estimate& e, Objective objective) {
  switch (objective) {
    case Objective::kThroughput: return -e.throughput.tokens_per_second;
    case Objective::kTime: return e.run.wall_time.value();
    case Objective::kCost: return e.run.cost_usd;
  }
  return 0;
}

Result<Candidate> evaluate(const Plan& plan, const EstimateOptions& options) {
  auto valid = validate_plan(plan);
  if (!valid) return valid.error();
  return Candidate{plan, estimate(plan, options)};
}

Result<Plan> fixed_plan(const PlanRequest& request, const std::string& file) {
  const std::vector<std::string> open = unset_layout_fields(request.parallel);
  if (!open.empty()) {
    std::string names;
    for (const auto& n : open) names += (names.empty() ? "" : ", ") + n;
    return Error{file + ": /parallel: " + names + " not fixed (\"auto\" or omitted): this is a plan request; " +
                 "fix it first with `planner search " + file + " --save-plan FIXED.json` or `planner --model M --gpus N --save-plan FIXED.json`"};
  }
  auto plan = plan_with_defaults(request);
  if (!plan) return Error{file + ": " + plan.error().message};
  return plan;
}

Result<Plan> load_fixed_plan(const std::string& path) {
  auto request = load_plan_file(path);
  if (!request) return request.error();
  return fixed_plan(*request, path);
}

namespace {

std::vector<int> divisors(std::int64_t n, std::int64_t limit) {
  std::vector<int> out;
  for (std::int64_t d = 1; d <= std::min(n, limit); ++d) {
    if (n % d == 0) out.push_back(static_cast<int>(d));
  }
  return out;
}

template <typename T>
std::vector<T> fixed_or(const std::optional<T>& fixed, std::vector<T> all) {
  if (fixed) return {*fixed};
  return all;
}

std::string shape_of(const ParallelConfig& p) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "tp=%d pp=%d cp=%d", p.tp, p.pp, p.cp);
  return buf;
}

// The parallel layout as a tuple, to break ties between plans of equal score: the simpler plan
// first (no context, expert or pipeline parallelism before them, then less tensor parallelism,
// fewer virtual stages, a lower ZeRO stage, no offload, less recompute), so that a tie goes to
// the plan that is easier to run.
auto layout_key(const ParallelConfig& p) {
  return std::make_tuple(p.cp, p.ep, p.pp, p.tp, p.virtual_stages, p.zero_stage, static_cast<int>(p.offload_optimizer),
                         static_cast<int>(p.recompute), p.shard_group, p.sequence_parallel, static_cast<int>(p.schedule), p.dp,
                         p.micro_batch, p.ends_in_split);
}

// What same_layout compares, as one ordered key (a search folds variants by it).
auto fold_key(const ParallelConfig& p) {
  return std::make_tuple(p.tp, p.pp, p.dp, p.cp, p.ep, p.sequence_parallel, p.zero_stage, p.shard_group, static_cast<int>(p.recompute),
                         p.recompute_layers, static_cast<int>(p.offload_optimizer), static_cast<int>(p.offload_params));
}

// Whether plans of this request may count the embedding and the loss as a layer each of their
// pipeline split: the stack does so (Megatron-Core), the request leaves it open or asks for it, and
// fixes no first or last stage layers (validate_plan keeps the splits that come out even).
bool ends_may_split(const ParallelConstraints& c, const StackSpec& stack) {
  return c.ends_in_split.value_or(true) && stack.ends_in_pipeline_split && c.first_stage_layers == 0 && c.last_stage_layers == 0;
}

// The ranking: plans with memory to spare before tight ones, then the objective's score, ties
// broken by the layout, so that the ranking is one total order and does not depend on how the
// search was split over threads.
bool ranked_before(bool tight_a, double score_a, const ParallelConfig& pa, bool tight_b, double score_b, const ParallelConfig& pb) {
  if (tight_a != tight_b) return !tight_a;
  if (score_a != score_b) return score_a < score_b;
  return layout_key(pa) < layout_key(pb);
}
bool ranked_before(const Estimate& a, const ParallelConfig& pa, const Estimate& b, const ParallelConfig& pb, Objective objective) {
  return ranked_before(a.tight, objective_score(a, objective), pa, b.tight, objective_score(b, objective), pb);
}

// The time component that grew most against the best plan, for "why it loses".
std::string slower_reason(const Estimate& e, const Estimate& best) {
  const auto& a = e.time;
  const auto& b = best.time;
  const std::pair<const char*, double> parts[] = {
      {"compute", (a.compute - b.compute).value()},
      {"recompute", (a.recompute - b.recompute).value()},
      {"tensor-parallel comm", (a.tp_comm - b.tp_comm).value()},
      {"context-parallel comm", (a.cp_comm - b.cp_comm).value()},
      {"expert-parallel comm", (a.ep_comm - b.ep_comm).value()},
      {"pipeline p2p", (a.pp_comm - b.pp_comm).value()},
      {"pipeline bubble", (a.bubble - b.bubble).value()},
      {"exposed data-parallel comm", (a.dp_comm_exposed - b.dp_comm_exposed).value()},
      {"sharding copies", (a.dp_copies - b.dp_copies).value()},
      {"host-bound wait", (a.host_wait - b.host_wait).value()},
      {"optimizer", (a.optimizer - b.optimizer).value()},
      {"offload", (a.offload - b.offload).value()},
  };
  const auto* worst = std::max_element(std::begin(parts), std::end(parts),
                                       [](const auto& x, const auto& y) { return x.second < y.second; });
  const double slower = best.throughput.tokens_per_second / e.throughput.tokens_per_second - 1.0;
  if (slower < 5e-4) return "as fast as the recommended plan, which is simpler to run";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.0f%% slower: %s +%.3g s per step", 100.0 * slower, worst->first, worst->second);
  return buf;
}

}  // namespace

std::vector<std::string> constraint_conflicts(const PlanRequest& req, const std::string& prefix) {
  const ParallelConstraints& c = req.parallel;
  const ModelSpec& m = req.model;
  const std::int64_t gb = req.training.global_batch;
  const auto n = [](long long x) { return std::to_string(x); };
  const auto name = [&](const char* key, long long value) { return prefix + key + "=" + n(value); };
  std::vector<std::string> out;
  const StackSpec& stack = stack_spec(req.training.stack);

  // The mesh axes: each alone, then the product of those fixed, against the GPUs.
  const std::pair<const char*, std::optional<int>> axes[] = {{"tp", c.tp}, {"cp", c.cp}, {"pp", c.pp}, {"dp", c.dp}};
  long long product = 1;
  int fixed_axes = 0;
  std::string factors;
  for (const auto& [axis, value] : axes) {
    if (!value) continue;
    product *= *value;
    ++fixed_axes;
    factors += (factors.empty() ? "" : " x ") + name(axis, *value);
  }
  const std::string gpus = n(req.gpus) + " GPUs";
  if (fixed_axes == 4 && product != req.gpus) {
    out.push_back(factors + " = " + n(product) + " != " + gpus + " (all of tp, cp, pp and dp are fixed; their product must be the GPU count)");
  } else if (product > req.gpus) {
    out.push_back(factors + " = " + n(product) + " > " + gpus);
  } else if (req.gpus % product != 0) {
    out.push_back(factors + " = " + n(product) + ", which does not divide " + gpus);
  }

  if (c.tp) {
    const int tp = *c.tp;
    if (m.heads % tp != 0) out.push_back(name("tp", tp) + ": tp must divide the model's attention heads (" + n(m.heads) + ")");
    else if (m.kv_heads % tp != 0 && tp % m.kv_heads != 0) out.push_back(name("tp", tp) + ": tp and the model's kv_heads (" + n(m.kv_heads) + ") must divide one another");
    if (m.ffn_hidden % tp != 0) out.push_back(name("tp", tp) + ": tp must divide the model's ffn_hidden (" + n(m.ffn_hidden) + ")");
  }
  if (c.pp && *c.pp > m.layers) out.push_back(name("pp", *c.pp) + ": more pipeline stages than the model's " + n(m.layers) + " layers");
  if (c.virtual_stages && *c.virtual_stages > 1) {
    const int v = *c.virtual_stages;
    // The embedding and the loss may take a chunk's place each where the stack splits so.
    const bool ends_split = ends_may_split(c, stack);
    const long long places = m.layers + (ends_split ? 2 : 0);
    const std::string what = ends_split ? " layers + the embedding + the loss" : " layers";
    if (c.pp && *c.pp == 1) out.push_back(name("v", v) + " (interleaved chunks per stage) needs pp > 1, but " + name("pp", 1));
    const long long chunks = c.pp ? static_cast<long long>(*c.pp) * v : 0;
    if (c.pp && chunks > places) {
      out.push_back(name("pp", *c.pp) + " x " + name("v", v) + " = " + n(chunks) + " model chunks > the model's " + n(m.layers) + what);
    } else if (c.pp && chunks > m.layers && (m.layers + 2) % chunks != 0) {
      // Only the split with the embedding and the loss could fill more chunks than layers, and it
      // needs layers + 2 to split evenly.
      out.push_back(name("pp", *c.pp) + " x " + name("v", v) + " = " + n(chunks) + " model chunks > the model's " + n(m.layers) +
                    " layers, and the layers + the embedding + the loss (" + n(m.layers + 2) + ") do not split evenly over them");
    } else if (c.pp && c.ends_in_split.value_or(false) && ends_split && (m.layers + 2) % chunks != 0) {
      out.push_back(prefix + "ends_in_split=on: the model's " + n(m.layers) + " layers + the embedding + the loss = " + n(m.layers + 2) +
                    " do not split evenly over " + name("pp", *c.pp) + " x " + name("v", v) + " = " + n(chunks) + " model chunks");
    } else if (2LL * v > places) {
      out.push_back(name("v", v) + ": at least 2 stages x " + n(v) + " chunks > the model's " + n(m.layers) + what);
    }
    if (c.schedule && *c.schedule != Schedule::kInterleaved) {
      out.push_back(name("v", v) + " needs schedule=interleaved, but " + prefix + "schedule=" + schedule_name(*c.schedule));
    }
  }
  if (c.schedule && *c.schedule == Schedule::kInterleaved && c.pp && *c.pp == 1) {
    out.push_back(prefix + "schedule=interleaved needs pp > 1, but " + name("pp", 1));
  }
  if (c.cp && req.training.seq_len % *c.cp != 0) out.push_back(name("cp", *c.cp) + ": cp must divide seq_len (" + n(req.training.seq_len) + ")");
  if (c.dp && gb % *c.dp != 0) out.push_back(name("dp", *c.dp) + ": dp must divide the global batch (" + n(gb) + " sequences)");
  if (c.micro_batch) {
    const int mb = *c.micro_batch;
    if (gb % mb != 0) {
      out.push_back(name("mb", mb) + ": the micro-batch must divide the global batch (" + n(gb) + " sequences)");
    } else if (c.dp && gb % *c.dp == 0 && gb % (static_cast<long long>(*c.dp) * mb) != 0) {
      out.push_back(name("dp", *c.dp) + " x " + name("mb", mb) + " = " + n(static_cast<long long>(*c.dp) * mb) + " sequences, which does not divide the global batch (" + n(gb) + ")");
    }
  }
  if (c.ep && *c.ep > 1) {
    if (!m.moe) out.push_back(name("ep", *c.ep) + ": expert parallelism needs a mixture-of-experts model (" + m.name + " has no experts)");
    else if (m.moe->experts % *c.ep != 0) out.push_back(name("ep", *c.ep) + ": ep must divide the model's experts (" + n(m.moe->experts) + ")");
    if (c.dp && *c.dp % *c.ep != 0) out.push_back(name("ep", *c.ep) + " must divide " + name("dp", *c.dp));
  }
  if (c.ends_in_split && *c.ends_in_split) {
    if (!stack.ends_in_pipeline_split) {
      out.push_back(prefix + "ends_in_split=on: the " + stack.name + " stack does not count the embedding and the loss as layers of its pipeline split");
    }
    if (c.pp && *c.pp == 1) out.push_back(prefix + "ends_in_split=on needs pp > 1, but " + name("pp", 1));
    if (c.first_stage_layers > 0 || c.last_stage_layers > 0) {
      out.push_back(prefix + "ends_in_split=on: not with first_stage_layers or last_stage_layers (Megatron-Core refuses both at once)");
    }
  }
  if (c.shard_group && *c.shard_group > 0) {
    if (c.zero_stage && *c.zero_stage != 3) out.push_back(name("shard_group", *c.shard_group) + " (hybrid sharding) needs zero=3, but " + name("zero", *c.zero_stage));
    if (c.dp && *c.dp % *c.shard_group != 0) out.push_back(name("shard_group", *c.shard_group) + " must divide " + name("dp", *c.dp));
  }
  return out;
}

namespace {

// "tp=8, mb=3", the fixed values of the layout, for a message.
std::string fixed_values_text(const ParallelConstraints& c) {
  std::string out;
  const std::pair<const char*, std::optional<int>> values[] = {{"tp", c.tp}, {"pp", c.pp}, {"dp", c.dp}, {"cp", c.cp}, {"ep", c.ep},
                                                              {"zero", c.zero_stage}, {"shard_group", c.shard_group}, {"mb", c.micro_batch},
                                                              {"v", c.virtual_stages}};
  for (const auto& [key, value] : values) {
    if (value) out += (out.empty() ? "" : ", ") + std::string(key) + "=" + std::to_string(*value);
  }
  if (c.schedule) out += (out.empty() ? "" : ", ") + std::string("schedule=") + schedule_name(*c.schedule);
  if (c.ends_in_split) out += (out.empty() ? "" : ", ") + std::string("ends_in_split=") + (*c.ends_in_split ? "on" : "off");
  return out.empty() ? "none" : out;
}

}  // namespace

Result<SearchResult> search(const PlanRequest& req, const SearchOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  auto valid = validate_request(req);
  if (!valid) return valid.error();
  if (const std::vector<std::string> conflicts = constraint_conflicts(req, ""); !conflicts.empty()) {
    std::string text;
    for (const auto& why : conflicts) text += (text.empty() ? "" : "; ") + why;
    return Error{"no valid plan: the fixed values conflict: " + text};
  }

  const ModelSpec& m = req.model;
  const ParallelConstraints& c = req.parallel;
  const int gpus = req.gpus;
  // Tensor parallelism and hybrid-shard groups stay inside one NVLink domain (a node, or a rack
  // of NVL72 trays).
  const int gpn = req.cluster.nvlink_domain_gpus();
  const std::int64_t gb = req.training.global_batch;

  std::vector<int> tps;
  for (int d : divisors(gpus, c.tp ? *c.tp : gpn)) {
    if (c.tp && d != *c.tp) continue;
    if (m.heads % d || m.ffn_hidden % d) continue;
    if (m.kv_heads % d && d % m.kv_heads) continue;
    tps.push_back(d);
  }
  std::vector<int> cps;
  for (int d = 1; d <= gpus; d *= 2) {
    // Unfixed: no context parallelism, or shards of at least 1024 tokens.
    if (c.cp ? d == *c.cp : (d == 1 || (req.training.seq_len % d == 0 && req.training.seq_len / d >= 1024))) cps.push_back(d);
  }
  if (c.cp && std::find(cps.begin(), cps.end(), *c.cp) == cps.end()) cps = {*c.cp};

  // What one thread found; merged in the end. Every fitting plan is kept by layout (fold_key) as
  // the sweep priced it (Seen: enough to rank it and to price it again); of each shape (tp, pp,
  // cp), the plan that does not fit needing the least memory (the shape's alternative where none
  // fits). One thread searches a shape at a time, so neither depends on the threads. Plans differ
  // only in their layout while searched: what is ranked is priced again and made a whole plan (a
  // copy of `base`, model and cluster included) once it is in the result.
  using FoldKey = decltype(fold_key(ParallelConfig{}));
  struct Scored {
    ParallelConfig parallel;
    Estimate estimate;
  };
  struct Seen {
    ParallelConfig parallel;
    bool tight = false;
    double score = 0;  // objective_score as the sweep priced it
  };
  struct Partial {
    std::map<FoldKey, std::vector<Seen>> layouts;
    std::int64_t evaluated = 0, fitting_count = 0;
    // Its layer settings priced once (plan.model and plan.cluster do not change).
    EstimateMemo memo;
  };
  Plan base;
  base.name = req.name;
  base.model_ref = req.model_ref;
  base.cluster_ref = req.cluster_ref;
  base.model = req.model;
  base.cluster = req.cluster;
  base.gpus = gpus;
  base.training = req.training;
  EstimateOptions estimate_options;
  estimate_options.memory_headroom = options.memory_headroom;
  // Plans are estimated without their reasons, which are written for those kept.
  const auto to_candidate = [&](Scored&& x) {
    Candidate cand{base, std::move(x.estimate)};
    cand.plan.parallel = x.parallel;
    explain_memory(cand.plan, estimate_options, cand.estimate);
    return cand;
  };
  const auto ranks_before = [&](const Scored& a, const Scored& b) {
    return ranked_before(a.estimate, a.parallel, b.estimate, b.parallel, options.objective);
  };
  const auto seen_before = [&](const Seen& a, const Seen& b) {
    return ranked_before(a.tight, a.score, a.parallel, b.tight, b.score, b.parallel);
  };

  // Each plan estimated; a fitting one kept in its layout, one that does not as its unit's
  // (shape's) least demanding so far.
  const auto consider = [&](Partial& part, std::optional<Scored>& least_memory, const Plan& plan, const EstimateOptions& priced) {
    ++part.evaluated;
    Estimate e = estimate(plan, priced);
    if (e.fits) {
      ++part.fitting_count;
      part.layouts[fold_key(plan.parallel)].push_back(Seen{plan.parallel, e.tight, objective_score(e, options.objective)});
    } else if (!least_memory || e.memory.required < least_memory->estimate.memory.required) {
      least_memory = Scored{plan.parallel, std::move(e)};
    }
  };

  // The units of work, one per shape (tp, cp, pp), in a fixed order.
  struct Unit {
    int tp, cp, pp;
  };
  std::vector<Unit> units;
  for (int tp : tps) {
    for (int cp : cps) {
      if (gpus % (tp * cp) != 0) continue;
      for (int pp : divisors(gpus / (tp * cp), m.layers)) units.push_back({tp, cp, pp});
    }
  }
  std::vector<std::optional<Scored>> least_memory_by_unit(units.size());  // each shape's plan that needs the least, where none fits
  std::atomic<bool> stopped{false};
  std::mutex progress_mutex;
  std::size_t units_done = 0;
  // Called before each unit: progress, and whether to stop.
  const auto checkpoint = [&] {
    std::lock_guard<std::mutex> lock(progress_mutex);
    if (options.progress) options.progress(static_cast<double>(units_done) / static_cast<double>(units.size()));
    ++units_done;
    if (!stopped && options.should_stop && options.should_stop()) stopped = true;
    return !stopped;
  };

  // Searched where the stack runs them.
  const StackSpec& runs = stack_spec(req.training.stack);
  const bool hybrid_shard = runs.hybrid_shard, interleaved_pipeline = runs.interleaved_pipeline, stack_sequence_parallel = runs.sequence_parallel;
  // Pipeline splits: the layers alone, and, where the stack can (Megatron-Core), the embedding and
  // the loss counted as a layer each (validate_plan keeps those that split evenly).
  const bool ends_split = ends_may_split(c, runs);
  const std::vector<bool> ends_splits = c.ends_in_split ? std::vector<bool>{*c.ends_in_split}
                                        : ends_split   ? std::vector<bool>{false, true}
                                                       : std::vector<bool>{false};
  const int extra_chunks = ends_split ? 2 : 0;  // model chunks that may hold no layer
  // Searches the units handed out by `next` with the given optimizer offloads.
  const auto work = [&](Partial& part, std::atomic<std::size_t>& next, const std::vector<Offload>& offloads) {
    // One plan per thread, reused: only its parallel layout changes in the loops below.
    Plan plan = base;
    // Reasons left to the plans returned.
    EstimateOptions priced = estimate_options;
    priced.memo = &part.memo;
    priced.explain = false;
    priced.exact_pipeline = false;  // the schedule run for what is returned (price below)
    for (std::size_t i = next++; i < units.size(); i = next++) {
      if (!checkpoint()) return;
      const auto [tp, cp, pp] = units[i];
      std::optional<Scored>& least_memory = least_memory_by_unit[i];
      {
        if (c.pp && pp != *c.pp) continue;
        const int dp = gpus / (tp * cp * pp);
        if (c.dp && dp != *c.dp) continue;
        if (gb % dp != 0) continue;
        std::vector<int> eps = {1};
        if (m.moe) {
          eps.clear();
          for (int d : divisors(dp, m.moe->experts)) if (m.moe->experts % d == 0) eps.push_back(d);
        }
        for (int ep : fixed_or(c.ep, eps)) {
          if (dp % ep != 0) continue;
          std::vector<int> zeros = (dp * cp == 1) ? std::vector<int>{0} : std::vector<int>{0, 1, 2, 3};
          for (int zero : fixed_or(c.zero_stage, zeros)) {
            std::vector<int> groups = {0};
            if (zero == 3 && !c.shard_group && hybrid_shard) {
              // Hybrid shard within a node when dp spans nodes.
              const int in_node = std::max(1, std::min(dp, gpn / (tp * cp * pp) > 0 ? gpn / (tp * cp * pp) : 1));
              if (in_node > 1 && in_node < dp && dp % in_node == 0) groups.push_back(in_node);
            }
            for (int group : fixed_or(c.shard_group, groups)) {
              // Unfixed micro-batches up to 64 sequences; a fixed one as given.
              for (int mb : c.micro_batch ? std::vector<int>{*c.micro_batch} : divisors(gb / dp, 64)) {
                if ((gb / dp) % mb != 0) continue;
                const int micro_batches = static_cast<int>(gb / (dp * static_cast<std::int64_t>(mb)));
                std::vector<std::pair<Schedule, int>> schedules;
                if (c.schedule || c.virtual_stages) {
                  const Schedule sch = c.schedule.value_or(c.virtual_stages && *c.virtual_stages > 1 ? Schedule::kInterleaved : Schedule::kOneFOneB);
                  if (sch == Schedule::kInterleaved && !c.virtual_stages) {
                    for (int v = 2; v <= 8 && pp * v <= m.layers + extra_chunks; ++v) schedules.push_back({sch, v});
                  } else {
                    schedules.push_back({sch, c.virtual_stages.value_or(1)});
                  }
                } else {
                  schedules.push_back({Schedule::kOneFOneB, 1});
                  if (pp > 1 && micro_batches >= pp && interleaved_pipeline) {
                    for (int v = 2; v <= 8 && pp * v <= m.layers + extra_chunks; ++v) schedules.push_back({Schedule::kInterleaved, v});
                  }
                }
                for (const auto& [schedule, v] : schedules) {
                  if (pp == 1 && schedule == Schedule::kInterleaved) continue;
                  for (Recompute rc : fixed_or(c.recompute, {Recompute::kNone, Recompute::kSelective, Recompute::kFull})) {
                    for (Offload off : fixed_or(c.offload_optimizer, offloads)) {
                      for (const bool ends_in_split : ends_splits) {
                        if (ends_in_split && pp == 1) continue;
                        ParallelConfig& p = plan.parallel;
                        p.tp = tp; p.cp = cp; p.pp = pp; p.dp = dp; p.ep = ep;
                        p.sequence_parallel = c.sequence_parallel.value_or(tp > 1 && stack_sequence_parallel);
                        p.zero_stage = zero; p.shard_group = group; p.micro_batch = mb;
                        p.virtual_stages = v; p.schedule = schedule; p.recompute = rc;
                        p.offload_optimizer = off; p.offload_params = c.offload_params;
                        p.fsdp_wrap_min_params = c.fsdp_wrap_min_params; p.prefetch = c.prefetch;
                        p.reduce_dtype = c.reduce_dtype;
                        p.overlap_grad_reduce = c.overlap_grad_reduce;
                        p.cp_comm = c.cp_comm;
                        p.recompute_layers = rc == Recompute::kFull ? c.recompute_layers : 0;
                        p.first_stage_layers = c.first_stage_layers;
                        p.last_stage_layers = c.last_stage_layers;
                        p.ends_in_split = ends_in_split;
                        if (!validate_plan(plan)) continue;
                        consider(part, least_memory, plan, priced);
                      }
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  };

  const int threads = std::max(1, std::min<int>(options.threads, static_cast<int>(units.size())));
  std::vector<Partial> parts(static_cast<std::size_t>(threads));
  const auto run = [&](const std::vector<Offload>& offloads) {
    units_done = 0;
    std::atomic<std::size_t> next{0};
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back([&, t] { work(parts[static_cast<std::size_t>(t)], next, offloads); });
    work(parts[0], next, offloads);
    for (auto& th : pool) th.join();
  };
  const auto fitting_so_far = [&] {
    std::int64_t n = 0;
    for (const auto& part : parts) n += part.fitting_count;
    return n;
  };

  SearchResult result;
  run({Offload::kNone});
  if (!stopped && fitting_so_far() == 0 && !c.offload_optimizer) {
    result.offload_considered = true;
    run({Offload::kCpu});
  }
  if (stopped) return Error{kSearchStopped};
  if (options.progress) options.progress(1.0);
  std::map<FoldKey, std::vector<Seen>> layouts;
  for (auto& part : parts) {
    result.evaluated += part.evaluated;
    result.fitting += part.fitting_count;
    for (auto& [key, variants] : part.layouts) layouts.emplace(key, std::move(variants));  // a layout is one shape's: one thread's
  }
  if (result.evaluated == 0) {
    return Error{"no valid plan: no combination of tp, cp, pp and dp fits " + std::to_string(gpus) +
                 " GPUs with the fixed values (" + fixed_values_text(c) + "), heads (" + std::to_string(m.heads) + ") and global batch (" +
                 std::to_string(gb) + " sequences)"};
  }

  // The sweep priced a pipeline whose chunks take unequal times by its schedule's lower bound:
  // running the schedule for each of tens of thousands of plans would cost the search its speed
  // (the run is 0-22% slower than the bound, median 0.04%, on the plans of 70B on 64 GPUs). What
  // is returned is priced by the schedule run (exact_pipeline). No run ends before its bound, so
  // no plan ranks higher priced again: plans are priced again in the sweep's order until the next
  // one's sweep price ranks after the last place to fill, which finds the best k exactly.
  EstimateOptions exact = estimate_options;
  exact.memo = &parts[0].memo;
  exact.explain = false;
  Plan repriced = base;
  const auto price = [&](const ParallelConfig& parallel) {
    repriced.parallel = parallel;
    return Scored{parallel, estimate(repriced, exact)};
  };
  const auto as_seen = [&](const Scored& x) { return Seen{x.parallel, x.estimate.tight, objective_score(x.estimate, options.objective)}; };
  // The best k of `seen` (in the sweep's order, best first) priced again, best first.
  const auto best_priced = [&](const std::vector<const Seen*>& seen, std::size_t k) {
    std::vector<Scored> best;
    if (k == 0) return best;
    for (const Seen* x : seen) {
      if (best.size() >= k && !seen_before(*x, as_seen(best[k - 1]))) break;
      Scored y = price(x->parallel);
      best.insert(std::upper_bound(best.begin(), best.end(), y, ranks_before), std::move(y));
      if (best.size() > k) best.pop_back();
    }
    return best;
  };
  const auto in_sweep_order = [&](std::vector<const Seen*>& seen) {
    std::sort(seen.begin(), seen.end(), [&](const Seen* a, const Seen* b) { return seen_before(*a, *b); });
  };
  const auto top = static_cast<std::size_t>(std::max(0, options.top));

  if (options.distinct_layouts) {
    // Layouts ranked by their best variant; the others fold under it.
    std::vector<std::vector<const Seen*>> by_sweep;  // each layout's variants in the sweep's order
    by_sweep.reserve(layouts.size());
    for (auto& [key, variants] : layouts) {
      std::vector<const Seen*>& seen = by_sweep.emplace_back();
      for (const Seen& x : variants) seen.push_back(&x);
      in_sweep_order(seen);
    }
    std::sort(by_sweep.begin(), by_sweep.end(), [&](const auto& a, const auto& b) { return seen_before(*a.front(), *b.front()); });
    std::vector<std::pair<std::vector<Scored>, std::int64_t>> order;  // a layout's best variants priced again, and how many fit
    const auto layout_before = [&](const auto& a, const auto& b) { return ranks_before(a.first.front(), b.first.front()); };
    for (const std::vector<const Seen*>& seen : by_sweep) {
      if (top == 0 || (order.size() >= top && !seen_before(*seen.front(), as_seen(order[top - 1].first.front())))) break;
      std::pair<std::vector<Scored>, std::int64_t> priced{best_priced(seen, kFoldedVariantsKept), static_cast<std::int64_t>(seen.size())};
      order.insert(std::upper_bound(order.begin(), order.end(), priced, layout_before), std::move(priced));
      if (order.size() > top) order.pop_back();
    }
    for (auto& [best, count] : order) {
      result.ranked.push_back(to_candidate(std::move(best.front())));
      FoldedVariants others;
      others.count = count;
      for (std::size_t i = 1; i < best.size(); ++i) others.best.push_back(to_candidate(std::move(best[i])));
      result.variants.push_back(std::move(others));
    }
  } else {
    std::vector<const Seen*> all;
    for (const auto& [key, variants] : layouts) {
      for (const Seen& x : variants) all.push_back(&x);
    }
    in_sweep_order(all);
    for (Scored& x : best_priced(all, top)) result.ranked.push_back(to_candidate(std::move(x)));
    result.variants.resize(result.ranked.size());
  }

  // Each other shape's best: its best fitting plan priced again, or, where none fits, its plan
  // that needs the least memory.
  std::map<std::string, Scored> best_by_shape;
  const std::string best_shape = result.ranked.empty() ? std::string() : shape_of(result.ranked.front().plan.parallel);
  {
    std::map<std::tuple<int, int, int>, std::vector<const Seen*>> fitting_by_shape;
    for (const auto& [key, variants] : layouts) {
      for (const Seen& x : variants) fitting_by_shape[{x.parallel.tp, x.parallel.pp, x.parallel.cp}].push_back(&x);
    }
    for (auto& [shape, seen] : fitting_by_shape) {
      if (shape_of(seen.front()->parallel) == best_shape) continue;
      in_sweep_order(seen);
      std::vector<Scored> best = best_priced(seen, 1);
      best_by_shape.emplace(shape_of(best.front().parallel), std::move(best.front()));
    }
    for (auto& least : least_memory_by_unit) {
      if (!least) continue;
      const std::string shape = shape_of(least->parallel);
      if (shape != best_shape && !best_by_shape.count(shape)) best_by_shape.emplace(shape, price(least->parallel));
    }
  }

  // Alternatives: the best of every other shape, and why it loses.
  const Candidate* best = result.ranked.empty() ? nullptr : &result.ranked.front();
  for (auto& [shape, scored] : best_by_shape) {
    if (best && shape == shape_of(best->plan.parallel)) continue;
    Alternative alt{to_candidate(std::move(scored)), shape, ""};
    const Candidate& cand = alt.candidate;
    if (!cand.estimate.fits || cand.estimate.tight) alt.reason = cand.estimate.reasons.empty() ? "does not fit" : cand.estimate.reasons.front();
    else if (best) alt.reason = slower_reason(cand.estimate, best->estimate);
    result.alternatives.push_back(std::move(alt));
  }
  std::sort(result.alternatives.begin(), result.alternatives.end(), [&](const Alternative& a, const Alternative& b) {
    if (a.candidate.estimate.fits != b.candidate.estimate.fits) return a.candidate.estimate.fits;
    if (!a.candidate.estimate.fits) return a.candidate.estimate.memory.required < b.candidate.estimate.memory.required;
    if (a.candidate.estimate.tight != b.candidate.estimate.tight) return !a.candidate.estimate.tight;
    return objective_score(a.candidate.estimate, options.objective) < objective_score(b.candidate.estimate, options.objective);
  });
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

bool same_layout(const ParallelConfig& a, const ParallelConfig& b) { return fold_key(a) == fold_key(b); }

std::string layout_text(const ParallelConfig& p) {
  std::string s = "tp=" + std::to_string(p.tp) + " pp=" + std::to_string(p.pp) + " dp=" + std::to_string(p.dp) + " cp=" + std::to_string(p.cp);
  if (p.ep > 1) s += " ep=" + std::to_string(p.ep);
  s += " zero=" + std::to_string(p.zero_stage);
  if (p.shard_group > 0) s += "/h" + std::to_string(p.shard_group);
  s += std::string(" recompute=") + recompute_name(p.recompute);
  if (p.ends_in_split) s += " ends_in_split=on";
  if (p.offload_optimizer != Offload::kNone) s += std::string(" offload=") + offload_name(p.offload_optimizer);
  if (p.offload_params != Offload::kNone) s += std::string(" param_offload=") + offload_name(p.offload_params);
  return s;
}

}  // namespace trainplan::planner
