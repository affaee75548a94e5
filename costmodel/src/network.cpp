#include "trainplan/costmodel/network.hpp"

#include <algorithm>
#include <cmath>

namespace trainplan::costmodel {

namespace {

// Fraction of the buffer each rank sends (ring algorithms; nccl-tests "bus bandwidth" factor).
double bus_factor(Collective kind, int n) {
  const double f = static_cast<double>(n - 1) / n;
  return kind == Collective::kAllReduce ? 2.0 * f : f;
}

// Latency steps of a ring: all-reduce is a reduce-scatter then an all-gather.
double ring_steps(Collective kind, int n) { return kind == Collective::kAllReduce ? 2.0 * (n - 1) : (n - 1); }

// Time of `kind` over `n` ranks inside one node at the measured bus bandwidth for this size (it
// includes the latency), when the profile has a table for this kind.
std::optional<double> measured_intra_node_time(const HardwareProfile& hw, Collective kind, double s, int n) {
  const auto measured = measured_bus_bandwidth(hw, kind, Bytes(s));
  if (!measured) return std::nullopt;
  return bus_factor(kind, n) * s / measured->value();
}

}  // namespace

std::optional<BytesPerSecond> measured_bus_bandwidth(const HardwareProfile& hw, Collective kind, Bytes bytes) {
  const MeasuredCollectives* m = hw.intra_node.measured.get();
  if (m == nullptr || bytes.value() <= 0) return std::nullopt;
  const std::vector<BusBandwidthSample>* rows = kind == Collective::kAllReduce       ? &m->all_reduce
                                                : kind == Collective::kAllGather     ? &m->all_gather
                                                : kind == Collective::kReduceScatter ? &m->reduce_scatter
                                                                                     : nullptr;
  if (rows == nullptr || rows->empty()) return std::nullopt;
  return BytesPerSecond(interpolate_bus_bandwidth(*rows, bytes.value()));
}

Seconds collective_time(const HardwareProfile& hw, Collective kind, Bytes bytes, CollectiveGroup g) {
  const int n = g.size;
  if (n <= 1 || bytes.value() <= 0) return Seconds(0);
  const int per_node = std::clamp(g.per_node, 1, n);
  const double s = bytes.value();
  const double intra_bw = hw.intra_node.bandwidth.value() * hw.intra_node.efficiency;
  const double intra_lat = hw.intra_node.latency.value();
  const double log_steps = 2.0 * std::ceil(std::log2(static_cast<double>(n)));

  if (per_node >= n) {  // all ranks in one node
    if (const auto measured = measured_intra_node_time(hw, kind, s, n)) return Seconds(*measured);
    if (kind == Collective::kAllToAll) return Seconds(bus_factor(kind, n) * s / intra_bw + (n - 1) * intra_lat);
    const double ring = bus_factor(kind, n) * s / intra_bw + ring_steps(kind, n) * intra_lat;
    const double tree = kind == Collective::kAllReduce ? bus_factor(kind, n) * s / intra_bw + log_steps * intra_lat : ring;
    return Seconds(std::min(ring, tree));
  }

  const double nic_per_gpu = hw.nic_bandwidth_per_gpu().value() * hw.inter_node.efficiency;
  const double inter_lat = hw.inter_node.latency.value();
  const int nodes = (n + per_node - 1) / per_node;

  if (kind == Collective::kAllToAll) {
    // Each rank sends s/n to every peer; the off-node share leaves through the rank's NIC share.
    const double off_node = s * static_cast<double>(n - per_node) / n;
    const double on_node = s * static_cast<double>(per_node - 1) / n;
    return Seconds(std::max(off_node / nic_per_gpu, on_node / intra_bw) + (n - 1) * inter_lat / per_node + inter_lat);
  }

  // Flat ring (or tree) over all ranks: bandwidth is limited by the slower of NVLink and the
  // group's share of the node's NICs (per_node NICs' worth when all node GPUs are members).
  const double flat_bw = std::min(intra_bw, per_node * nic_per_gpu);
  const double ring = bus_factor(kind, n) * s / flat_bw + ring_steps(kind, n) * inter_lat;
  const double tree = bus_factor(kind, n) * s / flat_bw + log_steps * inter_lat;
  // Two-level: inside the node over NVLink, then across nodes on s/per_node per rank, per_node
  // rings in parallel (one per NIC), then inside the node again (all-reduce only).
  double hierarchical = ring;
  if (per_node > 1) {
    const double intra = measured_intra_node_time(hw, kind, s, per_node)
                             .value_or(bus_factor(kind, per_node) * s / intra_bw + ring_steps(kind, per_node) * intra_lat);
    const double inter = bus_factor(kind, nodes) * (s / per_node) / nic_per_gpu + ring_steps(kind, nodes) * inter_lat;
    hierarchical = intra + inter;
  }
  const double best = kind == Collective::kAllReduce ? std::min({ring, tree, hierarchical}) : std::min(ring, hierarchical);
  return Seconds(best);
}

Seconds send_recv_time(const HardwareProfile& hw, Bytes bytes, bool across_nodes) {
  if (bytes.value() <= 0) return Seconds(0);
  if (across_nodes) {
    return Seconds(bytes.value() / (hw.nic_bandwidth_per_gpu().value() * hw.inter_node.efficiency) +
                   hw.inter_node.latency.value());
  }
  return Seconds(bytes.value() / (hw.intra_node.bandwidth.value() * hw.intra_node.efficiency) +
                 hw.intra_node.latency.value());
}

BytesPerSecond bus_bandwidth(const HardwareProfile& hw, Collective kind, Bytes bytes, CollectiveGroup group) {
  const Seconds t = collective_time(hw, kind, bytes, group);
  if (t.value() <= 0) return BytesPerSecond(0);
  return BytesPerSecond(bus_factor(kind, group.size) * bytes.value() / t.value());
}

}  // namespace trainplan::costmodel
