#pragma once
// Collective bus bandwidths measured on one node (the optional `intra_node.measured` table of a
// `trainplan/hwprofile/v1` document): for all-reduce, all-gather and reduce-scatter, the bus
// bandwidth (nccl-tests convention: algorithm bandwidth x 2(n-1)/n for all-reduce, x (n-1)/n for
// the others) at each measured message size. network.cpp interpolates them in log-log space,
// clamped at the ends, in place of link rate x efficiency for intra-node collectives.
//
// Message size convention (as collective_time's `bytes` and nccl-tests' "size"): the full buffer
// per rank: the all-reduce buffer, the gathered output of an all-gather, the input of a
// reduce-scatter.
//
// JSON:
//   "measured": {"source": "...", "ranks": 2, "columns": ["bytes", "bus_gb_per_s"],
//                "collectives": {"all_reduce": [[65536, 1.9], [262144, 3.1], ...],
//                                "all_gather": [...], "reduce_scatter": [...]}}
// Each collective is optional, at least one is present; rows are [bytes, bus GB/s (1e9 B/s)],
// every number finite and > 0, bytes strictly increasing.

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace trainplan::costmodel {

struct BusBandwidthSample {
  double bytes = 0;          // message size, bytes (convention above)
  double bus_bandwidth = 0;  // bytes/s
};

struct MeasuredCollectives {
  std::string source;
  int ranks = 0;  // ranks the table was measured on
  // Each in strictly increasing `bytes`; empty = not measured.
  std::vector<BusBandwidthSample> all_reduce, all_gather, reduce_scatter;
};

// Reads the table at `pointer` of `file`; `max_ranks` bounds `ranks` (the node's GPUs). Throws
// detail::DocumentError naming the file and the JSON pointer of the offending value (a NaN,
// negative or zero number, a row whose bytes do not increase, an unknown collective).
[[nodiscard]] std::shared_ptr<const MeasuredCollectives> read_measured_collectives(const nlohmann::json& json, const std::string& file,
                                                                                   const std::string& pointer, int max_ranks);
[[nodiscard]] nlohmann::json measured_collectives_to_json(const MeasuredCollectives& table);

// Bus bandwidth (bytes/s) at `bytes`: linear in log(bytes) -> log(bandwidth) between the two
// samples around it, the end sample's value outside the measured range.
// REQUIRES: `samples` not empty, strictly increasing bytes, every value > 0; bytes > 0.
[[nodiscard]] double interpolate_bus_bandwidth(const std::vector<BusBandwidthSample>& samples, double bytes);

}  // namespace trainplan::costmodel
