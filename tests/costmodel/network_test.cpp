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

// Inside one node: bandwidth term over NVLink at the measured efficiency, plus latency steps.
// The all-reduce takes the cheaper of a ring (2(n-1) steps) and a tree (2 ceil(log2 n) steps)
// with the same bandwidth term, as NCCL picks its algorithm.
TEST(IntraNodeCollective, MatchesAlphaBetaFormula) {
  const HardwareProfile hw = testing::cluster("dgx-a100-80g");
  const double bw = hw.intra_node.bandwidth.value() * hw.intra_node.efficiency;  // 234 GB/s
  const double alpha = hw.intra_node.latency.value();
  for (int n : {2, 4, 8}) {
    for (double S : {1048576.0, kGiB}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " S=" + std::to_string(S));
      const CollectiveGroup g{n, n};
      const double ring_ar = 2.0 * (n - 1) / n * S / bw + 2.0 * (n - 1) * alpha;
      const double tree_ar = 2.0 * (n - 1) / n * S / bw + 2.0 * std::ceil(std::log2(n)) * alpha;
      const double half = static_cast<double>(n - 1) / n * S / bw + (n - 1) * alpha;
      EXPECT_NEAR(collective_time(hw, Collective::kAllReduce, Bytes(S), g).value(), std::min(ring_ar, tree_ar), 1e-12);
      EXPECT_NEAR(collective_time(hw, Collective::kAllGather, Bytes(S), g).value(), half, 1e-12);
      EXPECT_NEAR(collective_time(hw, Collective::kReduceScatter, Bytes(S), g).value(), half, 1e-12);
      EXPECT_NEAR(collective_time(hw, Collective::kAllToAll, Bytes(S), g).value(), half, 1e-12);
    }
  }
}

// The case of the brief spelled out: 8 GPUs, 1 GiB: 2 * 7/8 * 2^30 / 234e9 + 6 * 3 us = 8.048 ms.
TEST(RingAllReduce, EightA100sOneGibTakesEightMilliseconds) {
  const HardwareProfile hw = testing::cluster("dgx-a100-80g");
  const double t = collective_time(hw, Collective::kAllReduce, Bytes::gib(1), {8, 8}).value();
  EXPECT_NEAR(t, 1.75 * kGiB / 234e9 + 18e-6, 1e-12);
  EXPECT_NEAR(t, 8.0479e-3, 1e-6);
}

// Across nodes with one group member per node (e.g. the data-parallel group when tp = 8),
// each rank only has its share of the node's NICs: a flat ring at that bandwidth.
TEST(MultiNodeAllGather, IsLimitedByTheNicShare) {
  const HardwareProfile hw = testing::cluster("dgx-a100-80g");
  const double nic = hw.nic_bandwidth_per_gpu().value() * hw.inter_node.efficiency;  // 22.5 GB/s
  EXPECT_DOUBLE_EQ(nic, 22.5e9);
  const double alpha = hw.inter_node.latency.value();
  const double S = kGiB;
  const int n = 16;
  const double expected = (n - 1.0) / n * S / nic + (n - 1) * alpha;
  const double t = collective_time(hw, Collective::kAllGather, Bytes(S), {n, 1}).value();
  EXPECT_NEAR(t, expected, 1e-12);
  // busbw = (n-1)/n S / t: the NIC share less the 15 latency steps (90 us of 44.8 ms).
  EXPECT_NEAR(bus_bandwidth(hw, Collective::kAllGather, Bytes(S), {n, 1}).value(), (n - 1.0) / n * S / expected, 1e-3);
  EXPECT_NEAR(bus_bandwidth(hw, Collective::kAllGather, Bytes(S), {n, 1}).value() / nic, 1.0, 0.005);
  // More than ten times slower than the same gather inside a node over NVLink.
  EXPECT_GT(t, 10 * collective_time(hw, Collective::kAllGather, Bytes(S), {8, 8}).value());
}

// Two full nodes (16 ranks, 8 per node): the flat ring runs at min(NVLink, 8 NIC shares)
// = min(234, 180) GB/s; the two-level alternative (NVLink ring, then inter-node on S/8) is slower.
TEST(MultiNodeAllGather, TwoFullNodesRunAtTheNodesNicBandwidth) {
  const HardwareProfile hw = testing::cluster("dgx-a100-80g");
  const double S = kGiB;
  const double flat_bw = std::min(234e9, 8 * 22.5e9);
  const double ring = 15.0 / 16 * S / flat_bw + 15 * 6e-6;
  const double two_level = (7.0 / 8 * S / 234e9 + 7 * 3e-6) + (1.0 / 2 * (S / 8) / 22.5e9 + 1 * 6e-6);
  ASSERT_LT(ring, two_level);
  EXPECT_NEAR(collective_time(hw, Collective::kAllGather, Bytes(S), {16, 8}).value(), ring, 1e-12);
  const double busbw = bus_bandwidth(hw, Collective::kAllGather, Bytes(S), {16, 8}).value();
  EXPECT_LT(busbw, 180e9);
  EXPECT_GT(busbw, 0.95 * 180e9);
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
  const HardwareProfile hw = testing::cluster("dgx-h100");
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

// Point to point: one message at link bandwidth times efficiency plus one latency.
TEST(SendRecv, MatchesAlphaBetaFormula) {
  const HardwareProfile hw = testing::cluster("dgx-a100-80g");
  const double S = 64 * 1048576.0;
  EXPECT_NEAR(send_recv_time(hw, Bytes(S), false).value(), S / 234e9 + 3e-6, 1e-12);
  EXPECT_NEAR(send_recv_time(hw, Bytes(S), true).value(), S / 22.5e9 + 6e-6, 1e-12);
}

}  // namespace
}  // namespace trainplan
