#pragma once
// Collective communication times on a two-level network: GPUs of a node joined by NVLink/NVSwitch
// (or PCIe), nodes joined by NICs (InfiniBand, RoCE, EFA), as NCCL runs them: each algorithm
// (ring, tree, PAT) and protocol (LL, LL128, Simple) costs NCCL's own latency model, whose ring
// latency grows with the ranks, plus its size over its bandwidth, and the cheapest is taken, as
// NCCL's tuner takes it (NVIDIA/nccl src/graph/tuning.cc; network.cpp cites each constant).
// Bandwidths are the link rate times the profile's measured efficiency (nccl-tests bus bandwidth),
// or, for intra-node collectives of a kind the profile's `intra_node.measured` table holds, the
// bus bandwidth measured at the message size (collectives.hpp). NVLink SHARP (NVLS) and CollNet
// are not modelled: where NCCL would run them the ring or tree stands in.

#include <optional>

#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/units.hpp"

namespace trainplan::costmodel {

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kAllToAll };

struct CollectiveGroup {
  int size = 1;      // ranks in the group
  // Ranks of the group inside one NVLink domain (1 <= per_node <= size): a node, or the 72 GPUs
  // of an NVL72 rack (HardwareProfile::nvlink_domain_gpus), which NCCL treats as one node (MNNVL).
  int per_node = 1;
  // Pods (HardwareProfile inter_node.pod_gpus) the group's ranks spread over, and how many groups
  // of the same kind have ranks in one pod and run at once (a data-parallel group spanning the
  // job's pods: every tensor, context and pipeline rank's group). 1, 1: inside one pod.
  int pods = 1;
  int groups_per_pod = 1;
};

enum class NcclAlgorithm { kRing, kTree, kPat, kMeasured, kAllToAll, kNvls, kNvlsTree };
enum class NcclProtocol { kLl, kLl128, kSimple };
[[nodiscard]] const char* nccl_algorithm_name(NcclAlgorithm a);  // "ring", "tree", "pat", "measured", "p2p", "nvls", "nvls-tree"
[[nodiscard]] const char* nccl_protocol_name(NcclProtocol p);    // "LL", "LL128", "Simple"

// One collective as NCCL would run it: the (algorithm, protocol) pair of least time, that time and
// its latency part. kMeasured: the profile's measured intra-node table (latency inside the rate).
struct CollectiveCost {
  Seconds time{0};
  NcclAlgorithm algorithm = NcclAlgorithm::kRing;
  NcclProtocol protocol = NcclProtocol::kSimple;
  Seconds latency{0};
  Seconds pod_wait{0};  // of `time`: waiting for the oversubscribed uplinks above a pod
};
[[nodiscard]] CollectiveCost collective_cost(const HardwareProfile& hw, Collective kind, Bytes bytes, CollectiveGroup group);

// Time of one collective (collective_cost's time). `bytes` is the full buffer per rank: the all-reduce buffer, the
// gathered output of an all-gather, the input of a reduce-scatter, the send buffer of an
// all-to-all. All groups of the same kind are assumed to run at once, so a group gets
// per_node / gpus_per_node of its node's NIC bandwidth.
[[nodiscard]] Seconds collective_time(const HardwareProfile& hw, Collective kind, Bytes bytes, CollectiveGroup group);

// Point-to-point transfer of `bytes` between two GPUs, inside one node or across nodes.
[[nodiscard]] Seconds send_recv_time(const HardwareProfile& hw, Bytes bytes, bool across_nodes);

// The intra-node bus bandwidth measured for `kind` at `bytes` (interpolate_bus_bandwidth over
// hw.intra_node.measured), or nullopt when the profile has no table for that kind (all-to-all
// never has one).
[[nodiscard]] std::optional<BytesPerSecond> measured_bus_bandwidth(const HardwareProfile& hw, Collective kind, Bytes bytes);

// The share of the GPU's SMs a collective's kernel holds while it runs beside the compute: NCCL
// launches one thread block per channel (src/enqueue.cc: grid = {nChannels, 1, 1}) and each block
// stays resident for the whole collective, while the GEMM and attention kernels it overlaps use
// most of an SM's shared memory per block, so none of theirs fits beside it: those kernels run on
// the other SMs. The channels are those NCCL opens on a DGX-class node (network.cpp); 0 where the
// profile states no SM count or the collectives do not run beside the compute.
[[nodiscard]] double nccl_sm_share(const HardwareProfile& hw);

// Bus bandwidth (nccl-tests convention) that collective_time implies for this case.
[[nodiscard]] BytesPerSecond bus_bandwidth(const HardwareProfile& hw, Collective kind, Bytes bytes, CollectiveGroup group);

}  // namespace trainplan::costmodel
