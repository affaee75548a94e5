#include "trainplan/costmodel/network.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace trainplan::costmodel {

// NCCL's own cost model (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel and
// ncclTopoGetAlgoTime, at commit 5067397c, 2026-06; the same constants since NCCL 2.19): each
// (algorithm, protocol) pair costs a latency, a base latency plus per-step hardware latencies
// that grow with the ranks of a ring (n - 1 steps of an all-gather, 2(n - 1) of an all-reduce,
// the steps that cross a node boundary at the network's latency), plus its size over its
// bandwidth; NCCL runs the cheapest. What NCCL learns from the topology search (the channels'
// bus bandwidth) is the profile's: the link rate times its measured efficiency.
namespace {

constexpr int kLl = 0, kLl128 = 1, kSimple = 2;
constexpr int kTree = 0, kRing = 1, kPat = 2, kNvls = 3, kNvlsTree = 4;

// tuning.cc baseLatencies (us), by algorithm (Tree, Ring, PAT) and protocol (LL, LL128, Simple).
constexpr double kBaseLatency[3][3] = {{6.8, 14.0, 8.4}, {6.6, 14.0, 8.4}, {8.0, 8.0, 8.0}};
// tuning.cc hwLatencies (us per step): NVLink, PCI and network hops.
constexpr double kNvlinkLatency[3][3] = {{0.6, 1.25, 4.0}, {0.6, 1.9, 3.4}, {0, 0, 4.0}};
constexpr double kPciLatency[3][3] = {{1.0, 1.9, 4.0}, {1.0, 2.5, 5.7}, {0, 0, 4.0}};
constexpr double kNetLatency[3][3] = {{5.0, 8.5, 14.0}, {2.7, 4.0, 14.0}, {0, 0, 14.0}};
// tuning.cc llMaxBws (GB/s of bus bandwidth): one node by GPU generation (Volta, Ampere, Hopper,
// Blackwell); 2 and 3+ nodes by host CPU (Intel and others, AMD).
constexpr double kLlMaxOneNode[4] = {39.0, 87.7, 141.0, 282.0};
constexpr double kLlMaxIntel[2] = {39.0, 20.4};
constexpr double kLlMaxAmd[2] = {22.5, 19.0};
// tuning.cc treeCorrectionFactor: the tree all-reduce's bandwidth by log2(bytes / 64), per protocol.
constexpr double kTreeCorrection[3][24] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9}};
// Channels NCCL opens on a DGX-class node (the topology search's nChannels: two per NIC across
// nodes, ncclTopoDupChannels doubling the rings it finds); the ring all-reduce's plateau test
// below and the SMs a collective holds (nccl_sm_share) read it.
constexpr double kChannels = 16;

// Fraction of the buffer each rank sends (ring algorithms; nccl-tests "bus bandwidth" factor).
double bus_factor(Collective kind, int n) {
  const double f = static_cast<double>(n - 1) / n;
  return kind == Collective::kAllReduce ? 2.0 * f : f;
}

bool nvlink_class(const LinkSpec& link) { return link.kind == "nvswitch" || link.kind == "nvlink"; }

int log2i(int n) {
  int l = 0;
  while (n >>= 1) ++l;
  return l;
}

// Time of `kind` over `n` ranks inside one node at the measured bus bandwidth for this size (it
// includes the latency), when the profile has a table for this kind.
std::optional<double> measured_intra_node_time(const HardwareProfile& hw, Collective kind, double s, int n) {
  const auto measured = measured_bus_bandwidth(hw, kind, Bytes(s));
  if (!measured) return std::nullopt;
  return bus_factor(kind, n) * s / measured->value();
}

}  // namespace

const char* nccl_algorithm_name(NcclAlgorithm a) {
  switch (a) {
    case NcclAlgorithm::kRing: return "ring";
    case NcclAlgorithm::kTree: return "tree";
    case NcclAlgorithm::kPat: return "pat";
    case NcclAlgorithm::kNvls: return "nvls";
    case NcclAlgorithm::kNvlsTree: return "nvls-tree";
    case NcclAlgorithm::kMeasured: return "measured";
    case NcclAlgorithm::kAllToAll: return "p2p";
  }
  return "ring";
}

const char* nccl_protocol_name(NcclProtocol p) {
  switch (p) {
    case NcclProtocol::kLl: return "LL";
    case NcclProtocol::kLl128: return "LL128";
    case NcclProtocol::kSimple: return "Simple";
  }
  return "Simple";
}

double nccl_sm_share(const HardwareProfile& hw) {
  if (hw.gpu.sm_count <= 0 || !hw.collectives_overlap_compute) return 0.0;
  return std::min(1.0, kChannels / hw.gpu.sm_count);
}

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

namespace {

// collective_cost before the profile's calibration.
CollectiveCost nccl_cost(const HardwareProfile& hw, Collective kind, Bytes bytes, CollectiveGroup g) {
  const int n = g.size;
  if (n <= 1 || bytes.value() <= 0) return {};
  const int per_node = std::clamp(g.per_node, 1, n);
  const int nodes = (n + per_node - 1) / per_node;
  const double s = bytes.value();
  const double intra_bw = hw.intra_node.bandwidth.value() * hw.intra_node.efficiency;
  const double nic_per_gpu = hw.nic_bandwidth_per_gpu().value() * hw.inter_node.efficiency;

  if (kind == Collective::kAllToAll) {
    // NCCL runs an all-to-all as grouped point-to-point sends: each rank sends s/n to every peer,
    // the off-node share through its NIC share, one latency per peer.
    CollectiveCost c{Seconds(0), NcclAlgorithm::kAllToAll, NcclProtocol::kSimple, Seconds(0)};
    if (nodes == 1) {
      c.latency = Seconds((n - 1) * hw.intra_node.latency.value());
      c.time = Seconds(bus_factor(kind, n) * s / intra_bw) + c.latency;
    } else {
      const double off_node = s * static_cast<double>(n - per_node) / n;
      const double on_node = s * static_cast<double>(per_node - 1) / n;
      const double inter_lat = hw.inter_node.latency.value();
      c.latency = Seconds((n - 1) * inter_lat / per_node + inter_lat);
      c.time = Seconds(std::max(off_node / nic_per_gpu, on_node / intra_bw)) + c.latency;
    }
    return c;
  }

  if (nodes == 1 && n <= hw.gpus_per_node) {  // the table was measured inside one node
    if (const auto measured = measured_intra_node_time(hw, kind, s, n)) {
      return {Seconds(*measured), NcclAlgorithm::kMeasured, NcclProtocol::kSimple, Seconds(0)};
    }
  }

  // Bus bandwidth of the channels with the Simple protocol: NVLink inside a node; across nodes
  // every ring or tree crosses each node boundary once per channel, so a group with per_node ranks
  // in a node gets per_node NIC shares, capped by NVLink.
  const double bus = nodes == 1 ? intra_bw : std::min(intra_bw, per_node * nic_per_gpu);
  const bool nvlink = nvlink_class(hw.intra_node);
  const auto& intra_hw = nvlink ? kNvlinkLatency : kPciLatency;
  const int gen = gpu_generation(hw.gpu);
  const bool amd = hw.cpu_vendor == CpuVendor::kAmd;
  const double ll_max = 1e9 * (nodes == 1 ? kLlMaxOneNode[gen] : (amd ? kLlMaxAmd : kLlMaxIntel)[nodes == 2 ? 0 : 1]);
  const double net_overhead = nodes > 1 ? (amd ? 2.0 : 1.0) : 0.0;  // getNetOverhead, us
  const double ppn = static_cast<double>(n) / nodes;
  const int nsteps = kind == Collective::kAllReduce ? 2 * (n - 1) : n - 1;
  const int inter_steps = nodes == 1 ? 0 : kind == Collective::kAllReduce ? 2 * (nodes - 1) : nodes - 1;
  const int log_size = std::ilogb(std::max(1.0, s / 64.0));  // floor(log2(bytes / 64))

  CollectiveCost best{Seconds(std::numeric_limits<double>::infinity()), NcclAlgorithm::kRing, NcclProtocol::kSimple, Seconds(0)};
  double best_bytes_time = 0;
  const auto consider = [&](int algorithm, int protocol, double latency_us, double time_of_bytes) {
    const double t = latency_us * 1e-6 + time_of_bytes;
    if (t < best.time.value()) {
      best.time = Seconds(t);
      best_bytes_time = time_of_bytes;
      best.algorithm = algorithm == kRing   ? NcclAlgorithm::kRing
                       : algorithm == kTree ? NcclAlgorithm::kTree
                       : algorithm == kNvls ? NcclAlgorithm::kNvls
                       : algorithm == kNvlsTree ? NcclAlgorithm::kNvlsTree
                                                : NcclAlgorithm::kPat;
      best.protocol = protocol == kLl ? NcclProtocol::kLl : protocol == kLl128 ? NcclProtocol::kLl128 : NcclProtocol::kSimple;
      best.latency = Seconds(latency_us * 1e-6);
    }
  };
  for (int p : {kLl, kLl128, kSimple}) {
    // LL128 needs NVLink between the GPUs of a node (tuning.cc: typeIntra <= PATH_NVB).
    if (p == kLl128 && !nvlink) continue;
    // The network plugin's own latency (LinkSpec::plugin_latency), on every network step, twice
    // with Simple (tuning.cc: interLat += latencyInter, and again for the flush).
    const double plugin = hw.inter_node.plugin_latency.value() * 1e6 * (p == kSimple ? 2.0 : 1.0);
    // With one rank per node every step is a network step, at the tree's network latency.
    const double inter_lat_ring = (ppn == 1 ? kNetLatency[kTree][p] : kNetLatency[kRing][p]) + plugin;

    // Ring: all three collectives.
    {
      double ring_bus = bus;
      if (p == kLl) ring_bus = std::min(ll_max, 0.5 * bus);
      if (p == kLl128) ring_bus = 0.92 * bus;
      const double intra_lat = std::max(intra_hw[kRing][p], p == kSimple ? 3.0 * net_overhead : net_overhead);
      double latency = kBaseLatency[kRing][p] + (nsteps - inter_steps) * intra_lat + inter_steps * inter_lat_ring;
      // The ring all-reduce's plateau across nodes (ncclTopoGetAlgoTime: x1.4 from Ampere on,
      // x1.9 before) once each channel's share of a rank's buffer reaches 64 bytes.
      if (kind == Collective::kAllReduce && p == kSimple && nodes > 1 && s / (kChannels * n) >= 64) latency *= gen == 0 ? 1.9 : 1.4;
      consider(kRing, p, latency, bus_factor(kind, n) * s / ring_bus);
    }
    // Tree: all-reduce only. A chain inside each node (every GPU sends and receives the buffer
    // once up and once down: 2s at NVLink rate, NCCL's algorithm bandwidth of half the bus
    // bandwidth) and double binary trees across nodes, pipelined with it: each node sends s up and
    // s down its trees (2s), s in all with two nodes, where each tree has one edge (Sanders et al.
    // 2009, "Two-tree algorithms for full bandwidth broadcast, reduction and scan"; NCCL 2.4).
    if (kind == Collective::kAllReduce) {
      double seconds_per_byte = std::max(2.0 / intra_bw, nodes == 1 ? 0.0 : (nodes == 2 ? 1.0 : 2.0) / (per_node * nic_per_gpu));
      double factor = 0.92;  // tuning.cc: the tree all-reduce's bus bandwidth x .92
      if (p == kLl) factor = std::min(factor / 3.8, ll_max * seconds_per_byte / 2.0);
      if (p == kLl128) factor *= nodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0;
      if (log_size < 23) factor *= kTreeCorrection[p][std::max(0, log_size)];
      const double intra_lat = intra_hw[kTree][p];
      const double inter_lat = kNetLatency[kTree][p] + plugin;
      const double latency = kBaseLatency[kTree][p] + 2.0 * ((ppn - 1) * intra_lat + log2i(nodes) * inter_lat);
      consider(kTree, p, latency, s * seconds_per_byte / factor);
    }
    // NVLS (NVLink SHARP) for all-reduce, Simple only, where the profile measured it: the NVSwitch
    // reduces the buffer, each GPU writes and reads it once, at the measured NVLS bus bandwidth;
    // NCCL's latency for it is one NVLink step of 25 us (tuning.cc hwLatencies NVLS, base 0).
    // Across nodes NCCL runs NVLS-tree: NVLS inside each node pipelined with trees between them,
    // whose network part moves what the tree's does (s with two nodes, 2s beyond), at a latency of
    // the NVLS step and 2 log2(nodes) network steps of 20.9 us plus the plugin's.
    const double nvls_bus = hw.intra_node.nvls_bus_bandwidth.value();
    if (kind == Collective::kAllReduce && p == kSimple && nvls_bus > 0 && nvlink && ppn > 1) {
      const double intra = bus_factor(kind, n) * s / nvls_bus;
      if (nodes == 1) {
        consider(kNvls, p, 25.0, intra);
      } else {
        const double network = s * (nodes == 2 ? 1.0 : 2.0) / (per_node * nic_per_gpu);
        consider(kNvlsTree, p, 25.0 + 2.0 * log2i(nodes) * (20.9 + plugin), std::max(intra, network));
      }
    }
    // PAT (NCCL 2.23+): all-gather and reduce-scatter with one rank per node, Simple only; its
    // latency grows with log2(nodes), less a linear part of 2.8 us per rank.
    if (p == kSimple && kind != Collective::kAllReduce && per_node == 1 && nodes > 1) {
      const double latency = kBaseLatency[kPat][p] + log2i(nodes) * ((kNetLatency[kTree][p] + plugin) / 3.5) + n * 2.8;
      consider(kPat, p, latency, s / (0.75 * bus));
    }
  }
  // Above a pod the fabric is oversubscribed (LinkSpec::oversubscription): a group spread over
  // several pods crosses each pod boundary about once per ring (or tree edge), so a pod's uplinks
  // carry one ring edge's bytes, bus_factor x s, for every group with ranks in it, at 1/r of its
  // GPUs' NIC bandwidth. NCCL chooses without knowing it; the chosen algorithm waits for it.
  const double r = hw.inter_node.oversubscription;
  if (g.pods > 1 && r > 1.0 && hw.inter_node.pod_gpus > 0) {
    const double uplinks = hw.inter_node.pod_gpus * nic_per_gpu / r;
    const double pod_bound = std::max(1, g.groups_per_pod) * bus_factor(kind, n) * s / uplinks;
    if (pod_bound > best_bytes_time) {
      best.pod_wait = Seconds(pod_bound - best_bytes_time);
      best.time += best.pod_wait;
    }
  }
  return best;
}

}  // namespace

CollectiveCost collective_cost(const HardwareProfile& hw, Collective kind, Bytes bytes, CollectiveGroup g) {
  CollectiveCost c = nccl_cost(hw, kind, bytes, g);
  // The profile's calibration (Calibration::collective_time_scale) scales all of it.
  const double k = hw.gpu.calibration.collective_time_scale;
  c.time = Seconds(c.time.value() * k);
  c.latency = Seconds(c.latency.value() * k);
  c.pod_wait = Seconds(c.pod_wait.value() * k);
  return c;
}

Seconds collective_time(const HardwareProfile& hw, Collective kind, Bytes bytes, CollectiveGroup g) {
  return collective_cost(hw, kind, bytes, g).time;
}

Seconds send_recv_time(const HardwareProfile& hw, Bytes bytes, bool across_nodes) {
  if (bytes.value() <= 0) return Seconds(0);
  const double k = hw.gpu.calibration.collective_time_scale;
  if (across_nodes) {
    return Seconds(k * (bytes.value() / (hw.nic_bandwidth_per_gpu().value() * hw.inter_node.efficiency) +
                        hw.inter_node.latency.value()));
  }
  return Seconds(k * (bytes.value() / (hw.intra_node.bandwidth.value() * hw.intra_node.efficiency) +
                      hw.intra_node.latency.value()));
}

BytesPerSecond bus_bandwidth(const HardwareProfile& hw, Collective kind, Bytes bytes, CollectiveGroup group) {
  const Seconds t = collective_time(hw, kind, bytes, group);
  if (t.value() <= 0) return BytesPerSecond(0);
  return BytesPerSecond(bus_factor(kind, group.size) * bytes.value() / t.value());
}

}  // namespace trainplan::costmodel
