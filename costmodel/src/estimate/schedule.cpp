#include "trainplan/costmodel/schedule.hpp"

#include <algorithm>
#include <limits>
#include <string>

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

Result<std::vector<std::vector<PipelinePass>>> pipeline_order(Schedule schedule, int stages, int virtual_stages,
                                                              int micro_batches) {
  if (stages < 1 || virtual_stages < 1 || micro_batches < 1) {
    return Error{"pipeline schedule: stages (" + std::to_string(stages) + "), virtual_stages (" +
                 std::to_string(virtual_stages) + ") and micro_batches (" + std::to_string(micro_batches) +
                 ") must each be >= 1"};
  }
  if (virtual_stages > 1 && schedule != Schedule::kInterleaved) {
    return Error{"pipeline schedule: virtual_stages (" + std::to_string(virtual_stages) +
                 ") > 1 needs the interleaved schedule"};
  }
  if (schedule == Schedule::kInterleaved && micro_batches % stages != 0) {
    return Error{"pipeline schedule: interleaved 1F1B needs micro-batches (" + std::to_string(micro_batches) +
                 ") to be a multiple of pipeline stages (" + std::to_string(stages) + ")"};
  }
  std::vector<std::vector<PipelinePass>> order(stages);
  const int m = micro_batches;
  for (int s = 0; s < stages; ++s) {
    auto& o = order[s];
    if (schedule == Schedule::kGpipe) {
      for (int i = 0; i < m; ++i) o.push_back({PassKind::kForward, i, 0});
      for (int i = 0; i < m; ++i) o.push_back({PassKind::kBackward, i, 0});
      continue;
    }
    const int total = m * virtual_stages;
    int warmup = schedule == Schedule::kInterleaved ? (stages - s - 1) * 2 + (virtual_stages - 1) * stages
                                                    : stages - s - 1;
    warmup = std::min(warmup, total);
    auto fwd = [&](int k) {
      return schedule == Schedule::kInterleaved ? interleaved_pass(PassKind::kForward, k, stages, virtual_stages)
                                                : PipelinePass{PassKind::kForward, k, 0};
    };
    auto bwd = [&](int k) {
      return schedule == Schedule::kInterleaved ? interleaved_pass(PassKind::kBackward, k, stages, virtual_stages)
                                                : PipelinePass{PassKind::kBackward, k, 0};
    };
    for (int k = 0; k < warmup; ++k) o.push_back(fwd(k));
    for (int k = 0; k < total - warmup; ++k) {
      o.push_back(fwd(warmup + k));
      o.push_back(bwd(k));
    }
    for (int k = total - warmup; k < total; ++k) o.push_back(bwd(k));
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

Result<ScheduleSimulation> simulate_pipeline(const PipelineTimeline& t) {
  auto order = pipeline_order(t.schedule, t.stages, t.virtual_stages, t.micro_batches);
  if (!order) return order.error();
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
  constexpr double kNotYet = -1;
  // done[kind][position][micro_batch]: when that pass ended.
  std::vector<std::vector<double>> fwd_end(positions, std::vector<double>(m, kNotYet));
  std::vector<std::vector<double>> bwd_end(positions, std::vector<double>(m, kNotYet));
  std::vector<std::size_t> next(p, 0);
  std::vector<double> free_at(p, 0);
  ScheduleSimulation sim;
  std::vector<std::vector<ScheduledPass>> per_stage(p);
  std::size_t remaining = 0;
  for (const auto& o : *order) remaining += o.size();

  while (remaining > 0) {
    bool progressed = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < (*order)[s].size()) {
        const PipelinePass& pass = (*order)[s][next[s]];
        const int pos = pass.chunk * p + s;
        const int i = pass.micro_batch;
        double ready = 0;
        if (pass.kind == PassKind::kForward) {
          if (pos > 0) {
            if (fwd_end[pos - 1][i] == kNotYet) break;
            ready = fwd_end[pos - 1][i] + ((pos - 1) % p != s ? t.p2p_seconds : 0.0);
          }
        } else {
          if (fwd_end[pos][i] == kNotYet) break;
          ready = fwd_end[pos][i];
          if (pos + 1 < positions) {
            if (bwd_end[pos + 1][i] == kNotYet) break;
            ready = std::max(ready, bwd_end[pos + 1][i] + ((pos + 1) % p != s ? t.p2p_seconds : 0.0));
          }
        }
        const double length = pass.kind == PassKind::kForward ? t.chunk_forward_seconds(pos) : t.chunk_backward_seconds(pos);
        ScheduledPass sp{s, pass, std::max(ready, free_at[s]), 0};
        sp.end = sp.start + length;
        free_at[s] = sp.end + t.pass_comm_seconds;  // the stage's exchange after the pass
        (pass.kind == PassKind::kForward ? fwd_end : bwd_end)[pos][i] = sp.end;
        per_stage[s].push_back(sp);
        ++next[s];
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) return Error{"pipeline simulation: the schedule deadlocks (a stage waits on a pass never run)"};
  }

  sim.busy_seconds.assign(p, 0);
  sim.peak_in_flight.assign(p, 0);
  for (int s = 0; s < p; ++s) {
    int held = 0, peak = 0;
    for (const auto& sp : per_stage[s]) {
      sim.busy_seconds[s] += sp.end - sp.start;
      sim.makespan = std::max(sim.makespan, sp.end);
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

}  // namespace trainplan::costmodel
