// The hardware of 2026 (issue 32, part 6): an NVLink domain larger than a node (GB200 and GB300
// NVL72: 72 GPUs over 18 trays of 4), and the clock a GPU sustains at its power limit.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_support.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/network.hpp"
#include "trainplan/costmodel/presets.hpp"

namespace trainplan {
namespace {

using namespace costmodel;

// NVIDIA GB200 NVL72 / DGX GB200: 72 GPUs in one NVLink5 domain, 4 per compute tray, one 400 Gb/s
// ConnectX-7 per GPU; GB300 NVL72 the same with 800 Gb/s ConnectX-8; DGX B300 8 GPUs a node.
TEST(NvlinkDomain, PresetsStateTheirDomain) {
  const HardwareProfile gb200 = testing::cluster("gb200-nvl72");
  EXPECT_EQ(gb200.gpus_per_node, 4);
  EXPECT_EQ(gb200.nvlink_domain_gpus(), 72);
  EXPECT_DOUBLE_EQ(gb200.nic_bandwidth_per_gpu().value(), 50e9);  // 400 Gb/s
  EXPECT_EQ(gpu_generation(gb200.gpu), 3);
  const HardwareProfile gb300 = testing::cluster("gb300-nvl72");
  EXPECT_EQ(gb300.nvlink_domain_gpus(), 72);
  EXPECT_DOUBLE_EQ(gb300.nic_bandwidth_per_gpu().value(), 100e9);  // 800 Gb/s
  const HardwareProfile b300 = testing::cluster("dgx-b300");
  EXPECT_EQ(b300.nvlink_domain_gpus(), 8);  // absent from the document: the node
  EXPECT_EQ(testing::cluster("dgx-h100").nvlink_domain_gpus(), 8);
}

// A 1 GiB all-reduce over 64 GPUs of one NVLink domain runs as NCCL's ring over NVLink (Simple):
// 2 x 63/64 x 2^30 B at 900 GB/s x 0.80 = 2.936 ms, plus NCCL's latency for it (tuning.cc: base
// 8.4 us, 3.4 us per NVLink step, 2 x 63 steps: 0.437 ms). Over eight 8-GPU B200 nodes every
// channel crosses the NICs: each GPU's share of 8 x 400 Gb/s at 0.90 is 45 GB/s, 360 GB/s a node,
// half NVLink's rate for the ring, and the tree sends 2 x 2^30 B through them (5.97 ms).
TEST(NvlinkDomain, CollectivesInsideTheDomainRunAtNvlinkRates) {
  const HardwareProfile gb200 = testing::cluster("gb200-nvl72");
  const double s = 1073741824.0;
  const double ring = 2.0 * 63.0 / 64.0 * s / (900e9 * 0.80);
  const CollectiveCost in_domain = collective_cost(gb200, Collective::kAllReduce, Bytes(s), {64, 64});
  EXPECT_EQ(in_domain.algorithm, NcclAlgorithm::kRing);
  EXPECT_NEAR(in_domain.time.value(), ring + (8.4 + 126 * 3.4) * 1e-6, 1e-9);
  const HardwareProfile b200 = testing::cluster("dgx-b200");
  const double across_nodes = collective_time(b200, Collective::kAllReduce, Bytes(s), {64, 8}).value();
  EXPECT_GT(across_nodes, 2.0 * s / (8 * 45e9));
  EXPECT_GT(across_nodes, 1.9 * in_domain.time.value());
}

Plan llama70b(const HardwareProfile& hw, int tp, int pp) {
  Plan p = testing::make_plan("llama3-70b", "gb200-nvl72", 64, 8192, 128);
  p.cluster = hw;
  p.parallel.tp = tp;
  p.parallel.pp = pp;
  p.parallel.dp = 64 / (tp * pp);
  p.parallel.sequence_parallel = tp > 1;
  p.parallel.zero_stage = 1;
  p.parallel.micro_batch = 1;
  p.parallel.recompute = Recompute::kSelective;
  return p;
}

// Tensor parallelism over 16 GPUs fits in an NVL72 rack: its all-reduces stay on NVLink. The same
// plan on trays that are their own domain (nvlink_domain_gpus 4) sends them through the NICs,
// and so do the pipeline's sends between the stages, which sit 16 GPUs apart.
TEST(NvlinkDomain, TensorParallelismAndPipelineSendsStayInTheDomain) {
  const HardwareProfile rack = testing::cluster("gb200-nvl72");
  HardwareProfile trays = rack;
  trays.nvlink_domain = 4;
  const Plan in_rack = llama70b(rack, 16, 2);
  ASSERT_TRUE(validate_plan(in_rack)) << validate_plan(in_rack).error().message;
  const Estimate a = estimate(in_rack);
  const Estimate b = estimate(llama70b(trays, 16, 2));
  EXPECT_LT(2.0 * a.time.tp_comm.value(), b.time.tp_comm.value());
  EXPECT_LT(a.time.pp_comm.value(), b.time.pp_comm.value());
  EXPECT_DOUBLE_EQ(a.memory.required.value(), b.memory.required.value());  // the placement moves no memory
}

TEST(NvlinkDomain, IsAWholeNumberOfNodesAndRoundTrips) {
  nlohmann::json j = hwprofile_to_json(testing::cluster("gb200-nvl72"));
  EXPECT_EQ(j.at("node").at("nvlink_domain_gpus"), 72);
  EXPECT_FALSE(hwprofile_to_json(testing::cluster("dgx-h100")).at("node").contains("nvlink_domain_gpus"));
  auto back = parse_hwprofile(j, "rack.json");
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->nvlink_domain_gpus(), 72);
  j["node"]["nvlink_domain_gpus"] = 70;
  const auto bad = parse_hwprofile(j, "rack.json");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("/node/nvlink_domain_gpus"), std::string::npos);
  EXPECT_NE(bad.error().message.find("multiple of gpus_per_node (4)"), std::string::npos);
}

// An H100 whose peaks are for 1830 MHz (989.4 TFLOP/s = 132 SMs x 4,096 dense bf16 FLOPs per
// clock x 1.83 GHz) held at 1525 MHz under its power limit: tensor-core work takes 1830 / 1525 =
// 1.2 times as long, memory-bound work no longer. The loss is at most 20% of the compute and
// recompute lines, and more than 20% of what the GEMMs and attention take of them (over 3/4 of
// a 70B step's compute).
TEST(SustainedClock, SlowsTensorCoreWorkInTheSustainedStepOnly) {
  HardwareProfile hw = testing::cluster("dgx-h100");
  Plan plan = testing::make_plan("llama3-70b", "dgx-h100", 64, 8192, 128);
  plan.parallel.tp = 8;
  plan.parallel.dp = 8;
  plan.parallel.sequence_parallel = true;
  plan.parallel.zero_stage = 1;
  plan.parallel.recompute = Recompute::kSelective;
  const Estimate at_peak = estimate(plan);
  EXPECT_DOUBLE_EQ(at_peak.time.clock.value(), 0.0);  // no clocks stated
  hw.gpu.peak_clock_mhz = 1830;
  hw.gpu.sustained_clock_mhz = 1525;
  hw.gpu.power_limit_w = 500;
  plan.cluster = hw;
  const Estimate held = estimate(plan);
  EXPECT_DOUBLE_EQ(held.time.step.value(), at_peak.time.step.value());  // the benchmark step is at the peak clock
  const double compute = (at_peak.time.compute + at_peak.time.recompute).value();
  EXPECT_LE(held.time.clock.value(), 0.2 * compute * (1 + 1e-9));
  EXPECT_GT(held.time.clock.value(), 0.2 * 0.75 * compute);
  EXPECT_NEAR(held.time.sustained_step.value(), (held.time.step + held.time.clock + held.time.straggler).value(), 1e-12);
}

TEST(SustainedClock, ParsesAndRefusesAClockAboveThePeak) {
  nlohmann::json j = hwprofile_to_json(testing::cluster("dgx-h100"));
  j["gpu"]["clocks"] = {{"peak_mhz", 1830}, {"sustained_mhz", 1525}, {"power_limit_w", 500}, {"source", "nvidia-smi under load"}};
  auto hw = parse_hwprofile(j, "h100-500w.json");
  ASSERT_TRUE(hw) << hw.error().message;
  EXPECT_DOUBLE_EQ(hw->gpu.clock_slowdown(), 1830.0 / 1525.0);
  EXPECT_EQ(hwprofile_to_json(*hw).at("gpu").at("clocks").at("power_limit_w"), 500.0);
  j["gpu"]["clocks"]["sustained_mhz"] = 1900;
  const auto bad = parse_hwprofile(j, "h100-500w.json");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("/gpu/clocks/sustained_mhz"), std::string::npos);
}

}  // namespace
}  // namespace trainplan
