#pragma once
// The process-group layout of a plan (torchtitan's ParallelDims): ranks are numbered with TP
// innermost (within a node), then CP, then PP, then DP:
//   rank = ((dp_index * pp + pp_index) * cp + cp_index) * tp + tp_index.
// Expert parallelism is carved out of data parallelism (Megatron-Core's layout, and the cost
// model's): ep consecutive data-parallel indices form an expert-parallel group, and the ranks
// with the same dp_index % ep (and pp, tp) hold the same experts: the expert-data-parallel group.
// Validated once; the error names every factor.

#include <memory>
#include <string>

#include "comm.hpp"

namespace trainplan::executor {

struct ParallelDims {
  int tp = 1, cp = 1, pp = 1, dp = 1;
  int ep = 1;  // divides dp; not a factor of the world size

  [[nodiscard]] int world_size() const { return tp * cp * pp * dp; }
  // "tp(2) * cp(1) * pp(2) * dp(2) = 8 != world size (4)", or empty when they agree.
  [[nodiscard]] std::string mismatch(int world_size) const;
};

struct RankCoords {
  int tp = 0, cp = 0, pp = 0, dp = 0;
};

[[nodiscard]] RankCoords rank_coords(const ParallelDims& dims, int rank);
[[nodiscard]] int rank_of(const ParallelDims& dims, const RankCoords& coords);

// This rank's groups, split from the world (collective: every rank builds them together). Each
// group kind counts the bytes this rank sends through it (make_counting_communicator) into
// `bytes_sent`.
struct ProcessGroups {
  ParallelDims dims;
  RankCoords coords;
  Communicator* world = nullptr;
  std::unique_ptr<Communicator> tp;    // same dp, pp, cp
  std::unique_ptr<Communicator> cp;    // same dp, pp, tp; group rank = cp index (context_parallel.hpp)
  std::unique_ptr<Communicator> pp;    // same dp, cp, tp; group rank = stage
  // Same pp and tp: the dp x cp ranks that hold the same weights, group rank = dp index x cp + cp
  // index. Gradients are averaged and ZeRO shards taken over it (Megatron-Core's data-parallel
  // group "with context parallelism"): each CP rank's loss is the mean over its own seq/cp
  // tokens, so the average over cp ranks is the mean over the whole sequence.
  std::unique_ptr<Communicator> dp;
  // The first and the last stage of one pipeline (same dp, cp, tp), which both hold the tied
  // embedding when pp > 1; a one-rank group on every other rank.
  std::unique_ptr<Communicator> tied;
  // Same pp, cp, tp and dp_index / ep: the ranks the experts are split over (group rank =
  // dp_index % ep, the experts [rank x E/ep, (rank + 1) x E/ep) of every MoE layer; moe.hpp).
  std::unique_ptr<Communicator> ep;
  // Same pp, tp and dp_index % ep: the ranks holding the same experts, whose gradients are
  // averaged and ZeRO shards taken over it (group rank = (dp_index / ep) x cp + cp index). Its
  // bytes count as data-parallel traffic.
  std::unique_ptr<Communicator> edp;
  struct Sent {
    std::shared_ptr<std::atomic<double>> tp, cp, pp, dp, ep;
  } bytes_sent;
};

// REQUIRES: dims.mismatch(world.size()) is empty and dims.ep divides dims.dp.
[[nodiscard]] ProcessGroups make_process_groups(const ParallelDims& dims, Communicator& world);

}  // namespace trainplan::executor
