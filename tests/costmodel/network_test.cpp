// Collective times on the two-level network against the alpha-beta formulas of ring and tree
// algorithms (shared/notes/cost-model-references.md, "Step time": a ring all-reduce sends
// 2(n-1)/n * S per rank, all-gather and reduce-scatter (n-1)/n * S; nccl-tests busbw = algbw
// times the same factor), and bus bandwidths against measured nccl-tests figures
// (tests/data/nccl_measured.csv).

#include <algorithm>
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "test_support.hpp"
#include "trainplan/costmodel/network.hpp"

namespace trainplan {
namespace {

using namespace costmodel;

constexpr double kGiB = 1073741824.0;

double relative_error(double a, double b) { return std::fabs(a / b - 1.0); }

// The profile numbers the hand derivations below use, as the DGX A100 datasheet gives them.
TEST(DgxA100Profile, HasTheDatasheetLinkNumbers) {
  const HardwareProfile hw = testing::cluster("dgx-a100-80g");
  EXPECT_EQ(hw.gpus_per_node, 8);
  EXPECT_DOUBLE_EQ(hw.intra_node.bandwidth.value(), 300e9);     // NVLink3, per GPU per direction
  EXPECT_DOUBLE_EQ(hw.intra_node.efficiency, 0.78);             // 235 / 300 measured busbw
  EXPECT_DOUBLE_EQ(hw.intra_node.latency.value(), 3e-6);
  EXPECT_EQ(hw.inter_node.nics_per_node, 8);
  EXPECT_DOUBLE_EQ(hw.inter_node.bandwidth.value(), 25e9);      // HDR 200 Gb/s
  EXPECT_DOUBLE_EQ(hw.nic_bandwidth_per_gpu().value(), 25e9);   // 8 NICs for 8 GPUs
}

TEST(NicShare, IsNodeNicBandwidthOverGpusPerNode) {
  const struct { const char* cluster; double per_gpu; } cases[] = {
      {"dgx-h100", 8 * 400e9 / 8 / 8},   // 8 x NDR 400 Gb/s: 50 GB/s per GPU
      {"aws-p5en", 16 * 200e9 / 8 / 8},  // 16 x 200 Gb/s EFA v3: 50 GB/s per GPU
      {"aws-p4d", 4 * 100e9 / 8 / 8},    // 4 x 100 Gb/s EFA: 6.25 GB/s per GPU
  };
  for (const auto& c : cases) EXPECT_DOUBLE_EQ(testing::cluster(c.cluster).nic_bandwidth_per_gpu().value(), c.per_gpu) << c.cluster;
}

// NCCL's tuning constants (NVIDIA/nccl src/graph/tuning.cc; network.cpp): base latency by
// algorithm and protocol, then per step over NVLink, and per network step.
constexpr double kRingSimpleBase = 8.4e-6, kRingSimpleNvlink = 3.4e-6;

// Inside one node, 1 GiB: the ring with the Simple protocol, whose bandwidth term is NVLink at
// the measured efficiency and whose latency is 8.4 us plus 3.4 us per step (n - 1 steps of an
// all-gather or reduce-scatter, 2(n - 1) of an all-reduce). NCCL's tree (a chain in one node)
// moves twice the buffer per GPU and loses.
TEST(IntraNodeCollective, IsNcclsSimpleRingForLargeBuffers) {
  const HardwareProfile hw = testing::cluster("dgx-a100-80g");
  const double bw = hw.intra_node.bandwidth.value() * hw.intra_node.efficiency;  // 234 GB/s
  const double S = kGiB;
  for (int n : {2, 4, 8}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const CollectiveGroup g{n, n};
    const double ring_ar = 2.0 * (n - 1) / n * S / bw + kRingSimpleBase + 2 * (n - 1) * kRingSimpleNvlink;
    const double half = static_cast<double>(n - 1) / n * S / bw + kRingSimpleBase + (n - 1) * kRingSimpleNvlink;
    EXPECT_NEAR(collective_time(hw, Collective::kAllReduce, Bytes(S), g).value(), ring_ar, 1e-12);
    EXPECT_NEAR(collective_time(hw, Collective::kAllGather, Bytes(S), g).value(), half, 1e-12);
    EXPECT_NEAR(collective_time(hw, Collective::kReduceScatter, Bytes(S), g).value(), half, 1e-12);
    const CollectiveCost c = collective_cost(hw, Collective::kAllReduce, Bytes(S), g);
    EXPECT_EQ(c.algorithm, NcclAlgorithm::kRing);
    EXPECT_EQ(c.protocol, NcclProtocol::kSimple);
  }
  // All-to-all: grouped sends, one latency per peer.
  EXPECT_NEAR(collective_time(hw, Collective::kAllToAll, Bytes(S), {8, 8}).value(), 0.875 * S / bw + 7 * 3e-6, 1e-12);
}

// 8 GPUs, 1 GiB: 2 * 7/8 * 2^30 / 234e9 + 8.4 us + 14 * 3.4 us = 8.086 ms; ml-engineering's
// nccl-tests table (tests/data/nccl_tests_published.csv) printed 8.204 ms.
TEST(RingAllReduce, EightA100sOneGibTakesEightMilliseconds) {
  const HardwareProfile hw = testing::cluster("dgx-a100-80g");
  const double t = collective_time(hw, Collective::kAllReduce, Bytes::gib(1), {8, 8}).value();
  EXPECT_NEAR(t, 1.75 * kGiB / 234e9 + 56e-6, 1e-12);
  EXPECT_NEAR(t, 8.0864e-3, 1e-6);
}

// 8 bytes on 8 GPUs: latency only. NCCL's LL ring: 6.6 us + 14 steps of 0.6 us = 15.0 us (the
// LL tree: 6.8 + 2 x 7 x 0.6 = 15.2 us). AWS printed 12.9 us on one p5 node.
TEST(SmallAllReduce, IsTheLlRingsLatency) {
  const HardwareProfile hw = testing::cluster("dgx-a100-80g");
  const CollectiveCost c = collective_cost(hw, Collective::kAllReduce, Bytes(8), {8, 8});
  EXPECT_EQ(c.algorithm, NcclAlgorithm::kRing);
  EXPECT_EQ(c.protocol, NcclProtocol::kLl);
  EXPECT_NEAR(c.latency.value(), 15.0e-6, 1e-12);
  EXPECT_NEAR(c.time.value(), 15.0e-6, 1e-9);
}

// The latency of a ring grows with its ranks: 1 MiB gathered by 1024 A100s (128 DGX nodes, AMD
// hosts: NCCL's network overhead is 2 us a step) with the LL protocol takes 6.6 us + 896 NVLink
// steps at max(0.6, 2.0) us + 127 network steps at 2.7 us = 2141.5 us, plus 1 MiB x 1023/1024 at
// LL's 19 GB/s cap on AMD hosts (llMaxBws) = 55.1 us. LL128 (2320 us) and Simple (7.2 ms, each
// step at least 3 x 2 us) cost more. On 128 GPUs the same gather takes 304 us, with LL128 (14 us
// + 112 x 2.0 + 15 x 4.0, and 1 MiB at 0.92 x 180 GB/s): eight times the ranks, 7.2 times the
// time, for the same bytes.
TEST(RingLatency, GrowsWithTheRanks) {
  const HardwareProfile hw = testing::cluster("dgx-a100-80g");
  ASSERT_EQ(hw.cpu_vendor, CpuVendor::kAmd);
  const double S = 1048576.0;
  const CollectiveCost big = collective_cost(hw, Collective::kAllGather, Bytes(S), {1024, 8});
  EXPECT_EQ(big.algorithm, NcclAlgorithm::kRing);
  EXPECT_EQ(big.protocol, NcclProtocol::kLl);
  EXPECT_NEAR(big.latency.value(), (6.6 + 896 * 2.0 + 127 * 2.7) * 1e-6, 1e-12);
  EXPECT_NEAR(big.time.value(), big.latency.value() + 1023.0 / 1024 * S / 19e9, 1e-12);
  const CollectiveCost small = collective_cost(hw, Collective::kAllGather, Bytes(S), {128, 8});
  EXPECT_EQ(small.protocol, NcclProtocol::kLl128);
  EXPECT_NEAR(small.time.value(), (14.0 + 112 * 2.0 + 15 * 4.0) * 1e-6 + 127.0 / 128 * S / (0.92 * 180e9), 1e-12);
  EXPECT_GT(big.time.value() / small.time.value(), 7.0);
}

// One rank per node (the data-parallel group of a tp8 plan): NCCL's PAT all-gather, 8 us +
// log2(64) x 14/3.5 us + 64 x 2.8 us = 211.2 us of latency plus 1 MiB at 0.75 of the NIC share
// (50 GB/s x 0.9), beats the ring, whose 63 steps each cross the network (LL: 321.6 us + 1 MiB at
// 20.4 GB/s = 372.9 us).
TEST(PatAllGather, WinsWithOneRankPerNode) {
  const HardwareProfile hw = testing::cluster("dgx-h100");
  const double S = 1048576.0;
  const CollectiveCost c = collective_cost(hw, Collective::kAllGather, Bytes(S), {64, 1});
  EXPECT_EQ(c.algorithm, NcclAlgorithm::kPat);
  EXPECT_NEAR(c.time.value(), 211.2e-6 + S / (0.75 * 45e9), 1e-12);
  const double ring_ll = (6.6 + 63 * 5.0) * 1e-6 + 63.0 / 64 * S / 20.4e9;
  EXPECT_LT(c.time.value(), ring_ll);
  // Large buffers go back to the ring: PAT's bandwidth is 0.75 of it.
  EXPECT_EQ(collective_cost(hw, Collective::kAllGather, Bytes(kGiB), {64, 1}).algorithm, NcclAlgorithm::kRing);
}

// Across nodes with one group member per node, a large gather runs at the rank's NIC share.
TEST(MultiNodeAllGather, IsLimitedByTheNicShare) {
  const HardwareProfile hw = testing::cluster("dgx-a100-80g");
  const double nic = hw.nic_bandwidth_per_gpu().value() * hw.inter_node.efficiency;  // 22.5 GB/s
  EXPECT_DOUBLE_EQ(nic, 22.5e9);
  const double S = kGiB;
  const int n = 16;
  // Ring, Simple, every step a network step at the tree's network latency (ppn = 1): 8.4 + 15 x 14 us.
  const double expected = (n - 1.0) / n * S / nic + (8.4 + 15 * 14.0) * 1e-6;
  const double t = collective_time(hw, Collective::kAllGather, Bytes(S), {n, 1}).value();
  EXPECT_NEAR(t, expected, 1e-12);
  EXPECT_NEAR(bus_bandwidth(hw, Collective::kAllGather, Bytes(S), {n, 1}).value() / nic, 1.0, 0.01);
  // More than ten times slower than the same gather inside a node over NVLink.
  EXPECT_GT(t, 10 * collective_time(hw, Collective::kAllGather, Bytes(S), {8, 8}).value());
}

// Two full nodes (16 ranks, 8 per node): a ring crosses each node boundary once per channel, so
// its bus bandwidth is min(NVLink, 8 NIC shares) = min(234, 180) GB/s.
TEST(MultiNodeAllGather, TwoFullNodesRunAtTheNodesNicBandwidth) {
  const HardwareProfile hw = testing::cluster("dgx-a100-80g");
  const double S = kGiB;
  // Ring, Simple: 8.4 us + 14 NVLink steps at max(3.4, 3 x 2) us + 1 network step at 14 us.
  const double ring = 15.0 / 16 * S / 180e9 + (8.4 + 14 * 6.0 + 14.0) * 1e-6;
  EXPECT_NEAR(collective_time(hw, Collective::kAllGather, Bytes(S), {16, 8}).value(), ring, 1e-12);
  const double busbw = bus_bandwidth(hw, Collective::kAllGather, Bytes(S), {16, 8}).value();
  EXPECT_LT(busbw, 180e9);
  EXPECT_GT(busbw, 0.95 * 180e9);
}

// Two nodes: each of NCCL's double binary trees has one edge between them, so a tree all-reduce
// sends the buffer through the node's NICs once, where a ring sends 2(n-1)/n of it. On 2 p4de
// nodes (4 x 100 Gb/s EFA, 42.5 GB/s at 0.85) 2 GiB: 2^31 / 42.5e9 / 0.92 (NCCL's tree factor) +
// 8.4 us + 2 (7 x 4.0 + 14 + 2 x 75) us (aws-ofi-nccl's 75 us, twice with Simple) = 55.3 ms; AWS
// printed 51.4 ms (busbw 78 GB/s, above the ring's 42.5 GB/s cap).
TEST(TreeAllReduce, HalvesTheNicTrafficOnTwoNodes) {
  const HardwareProfile hw = testing::cluster("aws-p4d");
  const double S = 2 * kGiB;
  const CollectiveCost c = collective_cost(hw, Collective::kAllReduce, Bytes(S), {16, 8});
  EXPECT_EQ(c.algorithm, NcclAlgorithm::kTree);
  EXPECT_NEAR(c.time.value(), S / 42.5e9 / 0.92 + 392.4e-6, 1e-9);
  EXPECT_LE(relative_error(c.time.value(), 51406e-6), 0.10);
}

double measured_busbw(const std::string& system_prefix) {
  for (const auto& row : testing::read_csv(testing::data_path("nccl_measured.csv"))) {
    if (row.at("system").rfind(system_prefix, 0) == 0) return std::stod(row.at("busbw_GBps")) * 1e9;  // "364.65-364.87" -> 364.65
  }
  throw std::runtime_error("no row for " + system_prefix);
}

// ml-engineering network/README (tests/data/nccl_measured.csv): 8xA100 NVLink3 all-reduce busbw 235 GB/s.
TEST(BusBandwidth, EightA100AllReduceWithinFivePercentOfMeasured) {
  const double measured = measured_busbw("8xA100");
  EXPECT_DOUBLE_EQ(measured, 235e9);
  const double predicted = bus_bandwidth(testing::cluster("dgx-a100-80g"), Collective::kAllReduce, Bytes::gib(4), {8, 8}).value();
  EXPECT_LE(relative_error(predicted, measured), 0.05) << predicted / 1e9 << " GB/s";
}

// ml-engineering network/README: 4 nodes of p5en (8xH200, EFA v3), ring all-reduce of 4 GiB,
// NCCL 2.27.7: 364.65-364.87 GB/s busbw.
TEST(BusBandwidth, FourP5enNodesAllReduceWithinTenPercentOfMeasured) {
  const double measured = measured_busbw("4 nodes x 8xH200");
  EXPECT_NEAR(measured, 365e9, 1e9);
  const double predicted = bus_bandwidth(testing::cluster("aws-p5en"), Collective::kAllReduce, Bytes::gib(4), {32, 8}).value();
  EXPECT_LE(relative_error(predicted, measured), 0.10) << predicted / 1e9 << " GB/s";
}

// nccl-tests convention: busbw = (S / t) * 2(n-1)/n for all-reduce, (S / t) * (n-1)/n otherwise.
TEST(BusBandwidth, FollowsTheNcclTestsConvention) {
  const HardwareProfile hw = testing::cluster("dgx-h100");
  const double S = 256 * 1048576.0;
  for (int n : {2, 8, 16, 64}) {
    const CollectiveGroup g{n, std::min(n, 8)};
    const double t_ar = collective_time(hw, Collective::kAllReduce, Bytes(S), g).value();
    const double t_ag = collective_time(hw, Collective::kAllGather, Bytes(S), g).value();
    EXPECT_NEAR(bus_bandwidth(hw, Collective::kAllReduce, Bytes(S), g).value(), S / t_ar * 2.0 * (n - 1) / n, 1e-3) << n;
    EXPECT_NEAR(bus_bandwidth(hw, Collective::kAllGather, Bytes(S), g).value(), S / t_ag * (n - 1.0) / n, 1e-3) << n;
  }
}

TEST(Collective, OneRankOrNoBytesCostsNothing) {
  const HardwareProfile hw = testing::cluster("dgx-h100");
  for (Collective kind : {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter, Collective::kAllToAll}) {
    EXPECT_EQ(collective_time(hw, kind, Bytes::gib(1), {1, 1}).value(), 0.0);
    EXPECT_EQ(collective_time(hw, kind, Bytes(0), {8, 8}).value(), 0.0);
    EXPECT_EQ(collective_time(hw, kind, Bytes(0), {64, 8}).value(), 0.0);
    EXPECT_EQ(bus_bandwidth(hw, kind, Bytes::gib(1), {1, 1}).value(), 0.0);
  }
  EXPECT_EQ(send_recv_time(hw, Bytes(0), true).value(), 0.0);
}

TEST(Collective, TimeGrowsWithBytesAndAllReduceCostsTwoReduceScatters) {
  // Without NVLS, whose all-reduce is no pair of reduce-scatters (the switch reduces).
  HardwareProfile hw = testing::cluster("dgx-h100");
  hw.intra_node.nvls_bus_bandwidth = BytesPerSecond(0);
  for (const CollectiveGroup g : {CollectiveGroup{8, 8}, CollectiveGroup{64, 8}, CollectiveGroup{16, 1}}) {
    double previous = 0;
    for (double S = 1024; S <= 16 * kGiB; S *= 4) {
      const double t = collective_time(hw, Collective::kAllReduce, Bytes(S), g).value();
      EXPECT_GT(t, previous);
      previous = t;
    }
    // Large buffers: bandwidth-bound, so all-reduce (reduce-scatter + all-gather) is 2x a
    // reduce-scatter, up to latency: a tree all-reduce takes 2 ceil(log2 n) steps where a ring
    // reduce-scatter takes n - 1 (for n = 64: 12 vs 63 steps of 6 us against ~47 ms).
    const double ar = collective_time(hw, Collective::kAllReduce, Bytes(16 * kGiB), g).value();
    const double rs = collective_time(hw, Collective::kReduceScatter, Bytes(16 * kGiB), g).value();
    EXPECT_NEAR(ar / rs, 2.0, 0.02) << g.size << "/" << g.per_node;
  }
}

// NVLS (NVLink SHARP) on two p5 nodes, 16 GiB: NVLS inside each node at the measured 480 GB/s
// bus bandwidth, 2 x 15/16 x 2^34 B / 480e9 = 67.106 ms, pipelined with the trees between the two
// nodes (2^34 B at 8 x 45 GB/s of NIC share: 47.7 ms); latency 25 us for the NVLS step and 2 x
// log2(2) network steps of 20.9 us plus twice aws-ofi-nccl's 75 us (Simple): 366.8 us.
TEST(NvlsTree, TwoP5NodesRunAtTheNvlsBusBandwidth) {
  const HardwareProfile p5 = testing::cluster("aws-p5");
  const double s = 17179869184.0;
  const CollectiveCost c = collective_cost(p5, Collective::kAllReduce, Bytes(s), {16, 8});
  EXPECT_EQ(c.algorithm, NcclAlgorithm::kNvlsTree);
  EXPECT_NEAR(c.latency.value(), 366.8e-6, 1e-9);
  EXPECT_NEAR(c.time.value(), 2.0 * 15.0 / 16.0 * s / 480e9 + 366.8e-6, 1e-9);
  // Without NVLS (NCCL_NVLS_ENABLE=0, or a GPU without it) the ring over NVLink and the NICs.
  HardwareProfile off = p5;
  off.intra_node.nvls_bus_bandwidth = BytesPerSecond(0);
  EXPECT_NE(collective_cost(off, Collective::kAllReduce, Bytes(s), {16, 8}).algorithm, NcclAlgorithm::kNvlsTree);
  EXPECT_GT(collective_time(off, Collective::kAllReduce, Bytes(s), {16, 8}).value(), 1.2 * c.time.value());
}

// Above a pod the fabric is oversubscribed. 16 ranks one per node across two pods of 64 GPUs,
// with 8 such groups in each pod (the tensor-parallel ranks of a data-parallel axis): each pod's
// uplinks carry 8 ring edges of 2 x 15/16 x 1 GiB at 64 x 45 GB/s / 4 = 720 GB/s: 22.4 ms, less
// than the ring's own 1.875 x 2^30 / 45e9 = 44.7 ms through each rank's NIC share, so at 1:4 the
// uplinks are not the limit; at 1:16 they are (89.5 ms).
TEST(PodOversubscription, UplinksAbovePodLimitGroupsSpanningPods) {
  HardwareProfile hw = testing::cluster("dgx-h100");
  hw.inter_node.pod_gpus = 64;
  const double s = 1073741824.0;
  CollectiveGroup g{16, 1};
  const CollectiveCost inside = collective_cost(hw, Collective::kAllReduce, Bytes(s), g);
  g.pods = 2;
  g.groups_per_pod = 8;
  hw.inter_node.oversubscription = 4;
  EXPECT_DOUBLE_EQ(collective_cost(hw, Collective::kAllReduce, Bytes(s), g).time.value(), inside.time.value());
  hw.inter_node.oversubscription = 16;
  const CollectiveCost across = collective_cost(hw, Collective::kAllReduce, Bytes(s), g);
  const double bound = 8 * 2.0 * 15.0 / 16.0 * s / (64 * 45e9 / 16);
  EXPECT_NEAR(bound, 89.48e-3, 1e-4);
  EXPECT_NEAR(across.time.value(), across.latency.value() + bound, 1e-9);
  EXPECT_GT(across.pod_wait.value(), 0.0);
  EXPECT_EQ(across.algorithm, inside.algorithm);  // NCCL chooses without knowing the fabric
}

// Point to point: one message at link bandwidth times efficiency plus one latency.
TEST(SendRecv, MatchesAlphaBetaFormula) {
  const HardwareProfile hw = testing::cluster("dgx-a100-80g");
  const double S = 64 * 1048576.0;
  EXPECT_NEAR(send_recv_time(hw, Bytes(S), false).value(), S / 234e9 + 3e-6, 1e-12);
  EXPECT_NEAR(send_recv_time(hw, Bytes(S), true).value(), S / 22.5e9 + 6e-6, 1e-12);
}

}  // namespace
}  // namespace trainplan
