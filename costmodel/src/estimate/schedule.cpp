#include "trainplan/costmodel/schedule.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace trainplan::costmodel {

const char* pass_kind_name(PassKind k) { return k == PassKind::kForward ? "forward" : "backward"; }

namespace {

// Megatron-LM's interleaved schedule numbers a stage's m*v chunk passes k = 0 .. m*v-1 in groups
// of p micro-batches: within a group of p*v passes the chunk advances every p passes.
PipelinePass interleaved_pass(PassKind kind, int k, int stages, int virtual_stages) {
  const int group = stages * virtual_stages;
  int chunk = (k % group) / stages;
  if (kind == PassKind::kBackward) chunk = virtual_stages - 1 - chunk;
  return {kind, (k / group) * stages + k % stages, chunk};
}

}  // namespace

namespace {

// Why pipeline_order refuses these numbers; empty where it runs them.
std::string order_error(Schedule schedule, int stages, int virtual_stages, int micro_batches) {
  if (stages < 1 || virtual_stages < 1 || micro_batches < 1) {
    return "pipeline schedule: stages (" + std::to_string(stages) + "), virtual_stages (" + std::to_string(virtual_stages) +
           ") and micro_batches (" + std::to_string(micro_batches) + ") must each be >= 1";
  }
  if (virtual_stages > 1 && schedule != Schedule::kInterleaved) {
    return "pipeline schedule: virtual_stages (" + std::to_string(virtual_stages) + ") > 1 needs the interleaved schedule";
  }
  if (schedule == Schedule::kInterleaved && micro_batches % stages != 0) {
    return "pipeline schedule: interleaved 1F1B needs micro-batches (" + std::to_string(micro_batches) +
           ") to be a multiple of pipeline stages (" + std::to_string(stages) + ")";
  }
  return {};
}

// The passes of one stage in the order it runs them, each computed from its index: GPipe runs
// every forward, then every backward; 1F1B (and interleaved 1F1B) a warm-up of forwards, then a
// forward and a backward in turn, then the rest of the backwards.
struct StageOrder {
  Schedule schedule;
  int stages, virtual_stages, total, warmup;

  StageOrder(Schedule sc, int p, int v, int m, int stage) : schedule(sc), stages(p), virtual_stages(v), total(m * v) {
    if (sc == Schedule::kGpipe) {
      warmup = total;
    } else {
      warmup = std::min(total, sc == Schedule::kInterleaved ? (p - stage - 1) * 2 + (v - 1) * p : p - stage - 1);
    }
  }
  [[nodiscard]] int size() const { return 2 * total; }
  [[nodiscard]] PipelinePass pass(PassKind kind, int k) const {
    return schedule == Schedule::kInterleaved ? interleaved_pass(kind, k, stages, virtual_stages) : PipelinePass{kind, k, 0};
  }
  // The j-th pass: a forward or a backward, and which of the stage's forwards (backwards) it is.
  [[nodiscard]] std::pair<PassKind, int> index(int j) const {
    if (j < warmup) return {PassKind::kForward, j};
    const int steady = 2 * (total - warmup);
    if (j < warmup + steady) {
      const int k = j - warmup;
      return k % 2 == 0 ? std::pair{PassKind::kForward, warmup + k / 2} : std::pair{PassKind::kBackward, k / 2};
    }
    return {PassKind::kBackward, total - warmup + (j - warmup - steady)};
  }
  [[nodiscard]] PipelinePass at(int j) const {
    const auto [kind, k] = index(j);
    return pass(kind, k);
  }
};

}  // namespace

Result<std::vector<std::vector<PipelinePass>>> pipeline_order(Schedule schedule, int stages, int virtual_stages,
                                                              int micro_batches) {
  if (std::string error = order_error(schedule, stages, virtual_stages, micro_batches); !error.empty()) return Error{error};
  std::vector<std::vector<PipelinePass>> order(stages);
  for (int s = 0; s < stages; ++s) {
    const StageOrder o(schedule, stages, virtual_stages, micro_batches, s);
    order[s].reserve(static_cast<std::size_t>(o.size()));
    for (int j = 0; j < o.size(); ++j) order[s].push_back(o.at(j));
  }
  return order;
}

double micro_batches_in_flight(const ParallelConfig& p, int stage, int m) {
  if (p.pp == 1) return 1;
  switch (p.schedule) {
    case Schedule::kGpipe: return m;
    case Schedule::kOneFOneB: return std::min(m, p.pp - stage);
    case Schedule::kInterleaved: {
      // Megatron's interleaved warm-up: (p - i - 1) * 2 + (v - 1) * p chunks, plus the one in backward.
      const double chunks = std::min<double>(static_cast<double>(m) * p.virtual_stages,
                                             (p.pp - stage - 1) * 2.0 + (p.virtual_stages - 1.0) * p.pp + 1.0);
      return chunks / p.virtual_stages;
    }
  }
  return 1;
}

namespace {

// The event loop behind simulate_pipeline and pipeline_makespan: every stage runs its passes in
// pipeline_order, each once its stage is free and its input has arrived; visit(stage, pass,
// start, end) sees each pass as it is placed. Returns the makespan, or why the timeline cannot be
// run.
template <typename Visit>
Result<double> run_schedule(const PipelineTimeline& t, Visit&& visit) {
  if (std::string error = order_error(t.schedule, t.stages, t.virtual_stages, t.micro_batches); !error.empty()) return Error{error};
  const int p = t.stages, v = t.virtual_stages, m = t.micro_batches;
  if (static_cast<int>(t.forward_seconds.size()) != p || static_cast<int>(t.backward_seconds.size()) != p) {
    return Error{"pipeline simulation: need forward and backward seconds for each of the " + std::to_string(p) +
                 " stages"};
  }
  const int positions = p * v;  // model chunks in pipeline order
  if (!t.chunk_layers.empty() && static_cast<int>(t.chunk_layers.size()) != positions) {
    return Error{"pipeline simulation: chunk_layers has " + std::to_string(t.chunk_layers.size()) + " entries, not stages x virtual_stages = " +
                 std::to_string(positions)};
  }
  const std::vector<double> forward_length = t.chunk_forward_seconds_all(), backward_length = t.chunk_backward_seconds_all();
  std::vector<StageOrder> order;
  order.reserve(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) order.emplace_back(t.schedule, p, v, m, s);
  // The k-th forward and backward pass of any stage (the same (micro-batch, chunk) on each), once.
  std::vector<PipelinePass> forward_pass, backward_pass;
  forward_pass.reserve(static_cast<std::size_t>(m) * v);
  backward_pass.reserve(static_cast<std::size_t>(m) * v);
  for (int k = 0; k < m * v; ++k) {
    forward_pass.push_back(order.front().pass(PassKind::kForward, k));
    backward_pass.push_back(order.front().pass(PassKind::kBackward, k));
  }
  // Consecutive chunks sit on neighbouring stages: every transfer is a hop (none without a pipeline).
  const double hop = p > 1 ? t.p2p_seconds : 0.0;
  constexpr double kNotYet = -1;
  // When each (position, micro-batch) pass ended, forward and backward, in one flat array each.
  std::vector<double> fwd_end(static_cast<std::size_t>(positions) * m, kNotYet);
  std::vector<double> bwd_end(static_cast<std::size_t>(positions) * m, kNotYet);
  const auto at = [m](int pos, int i) { return static_cast<std::size_t>(pos) * m + i; };
  std::vector<int> next(p, 0);
  std::vector<double> free_at(p, 0);
  long long remaining = 2LL * positions * m;
  double makespan = 0;

  while (remaining > 0) {
    bool progressed = false;
    for (int s = 0; s < p; ++s) {
      const StageOrder& stage_order = order[static_cast<std::size_t>(s)];
      while (next[s] < stage_order.size()) {
        const auto [kind, k] = stage_order.index(next[s]);
        const PipelinePass& pass = (kind == PassKind::kForward ? forward_pass : backward_pass)[static_cast<std::size_t>(k)];
        const int pos = pass.chunk * p + s;
        const int i = pass.micro_batch;
        double ready = 0;
        if (pass.kind == PassKind::kForward) {
          if (pos > 0) {
            if (fwd_end[at(pos - 1, i)] == kNotYet) break;
            ready = fwd_end[at(pos - 1, i)] + hop;
          }
        } else {
          if (fwd_end[at(pos, i)] == kNotYet) break;
          ready = fwd_end[at(pos, i)];
          if (pos + 1 < positions) {
            if (bwd_end[at(pos + 1, i)] == kNotYet) break;
            ready = std::max(ready, bwd_end[at(pos + 1, i)] + hop);
          }
        }
        const double start = std::max(ready, free_at[s]);
        const double end = start + (pass.kind == PassKind::kForward ? forward_length : backward_length)[static_cast<std::size_t>(pos)];
        free_at[s] = end + t.pass_comm_seconds;  // the stage's exchange after the pass
        (pass.kind == PassKind::kForward ? fwd_end : bwd_end)[at(pos, i)] = end;
        makespan = std::max(makespan, end);
        visit(s, pass, start, end);
        ++next[s];
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) return Error{"pipeline simulation: the schedule deadlocks (a stage waits on a pass never run)"};
  }
  return makespan;
}

}  // namespace

Result<ScheduleSimulation> simulate_pipeline(const PipelineTimeline& t) {
  const int p = t.stages, v = t.virtual_stages;
  std::vector<std::vector<ScheduledPass>> per_stage(static_cast<std::size_t>(std::max(p, 0)));
  auto makespan = run_schedule(t, [&](int s, const PipelinePass& pass, double start, double end) {
    per_stage[static_cast<std::size_t>(s)].push_back(ScheduledPass{s, pass, start, end});
  });
  if (!makespan) return makespan.error();
  ScheduleSimulation sim;
  sim.makespan = *makespan;
  sim.busy_seconds.assign(p, 0);
  sim.peak_in_flight.assign(p, 0);
  for (int s = 0; s < p; ++s) {
    int held = 0, peak = 0;
    for (const auto& sp : per_stage[s]) {
      sim.busy_seconds[s] += sp.end - sp.start;
      held += sp.pass.kind == PassKind::kForward ? 1 : -1;
      peak = std::max(peak, held);
      sim.passes.push_back(sp);
    }
    sim.peak_in_flight[s] = static_cast<double>(peak) / v;
  }
  double bubble = 0;
  for (int s = 0; s < p; ++s) {
    if (sim.busy_seconds[s] > 0) bubble += (sim.makespan - sim.busy_seconds[s]) / sim.busy_seconds[s];
  }
  sim.bubble_fraction = bubble / p;
  return sim;
}

double pipeline_makespan(const PipelineTimeline& t) {
  auto makespan = run_schedule(t, [](int, const PipelinePass&, double, double) {});
  return makespan ? *makespan : 0.0;
}

double pipeline_makespan_bound(const PipelineTimeline& t) {
  const int p = t.stages, v = t.virtual_stages, m = t.micro_batches;
  if (p < 1 || static_cast<int>(t.forward_seconds.size()) != p || static_cast<int>(t.backward_seconds.size()) != p) return 0;
  if (!t.chunk_layers.empty() && static_cast<int>(t.chunk_layers.size()) != p * v) return 0;
  // Stage s first runs once the first micro-batch has come through chunks 0 .. s-1 (a hop after
  // each), then runs its 2 v m passes one after another with its exchange after each, and after
  // its last pass (chunk 0's backward of the last micro-batch) that backward still goes through
  // chunks s-1 .. 0.
  double bound = 0, chain = 0;
  for (int s = 0; s < p; ++s) {
    const double own = m * (t.forward_seconds[static_cast<std::size_t>(s)] + t.backward_seconds[static_cast<std::size_t>(s)]) +
                       (2.0 * v * m - 1.0) * t.pass_comm_seconds;
    bound = std::max(bound, chain + own);
    chain += t.chunk_forward_seconds(s) + t.chunk_backward_seconds(s) + 2.0 * t.p2p_seconds;  // chunk 0 of stage s
  }
  return bound;
}


}  // namespace trainplan::costmodel
