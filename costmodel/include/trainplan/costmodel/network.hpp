#pragma once
// Collective communication times on a two-level network: GPUs of a node joined by NVLink/NVSwitch
// (or PCIe), nodes joined by NICs (InfiniBand, RoCE, EFA). Alpha-beta model per algorithm (ring,
// tree, hierarchical two-level); the fastest applicable algorithm is taken, as NCCL does.
// Bandwidths are the link rate times the profile's measured efficiency (nccl-tests bus bandwidth),
// or, for intra-node collectives of a kind the profile's `intra_node.measured` table holds, the
// bus bandwidth measured at the message size (collectives.hpp).

#include <optional>

#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/units.hpp"

namespace trainplan::costmodel {

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kAllToAll };

struct CollectiveGroup {
  int size = 1;      // ranks in the group
  int per_node = 1;  // ranks of the group inside one node (1 <= per_node <= size)
};

// Time of one collective. `bytes` is the full buffer per rank: the all-reduce buffer, the
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

// Bus bandwidth (nccl-tests convention) that collective_time implies for this case.
[[nodiscard]] BytesPerSecond bus_bandwidth(const HardwareProfile& hw, Collective kind, Bytes bytes, CollectiveGroup group);

}  // namespace trainplan::costmodel
