// Measured intra-node collective tables (`intra_node.measured`, collectives.hpp): log-log
// interpolation of the bus bandwidth by message size, its use by collective_time in place of
// link rate x efficiency, the document round trip, and validation errors that name the file and
// the JSON pointer.

#include <cmath>
#include <limits>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_support.hpp"
#include "trainplan/costmodel/collectives.hpp"
#include "trainplan/costmodel/network.hpp"

namespace trainplan {
namespace {

using namespace costmodel;

// Two samples a factor 4 apart in size: at 2x (halfway in log size) the bandwidth is the
// geometric mean of the two, sqrt(10 GB/s x 40 GB/s) = 20 GB/s.
TEST(BusBandwidthInterpolation, IsLinearInLogLogBetweenSamples) {
  const std::vector<BusBandwidthSample> rows = {{1e6, 10e9}, {4e6, 40e9}, {16e6, 50e9}};
  EXPECT_DOUBLE_EQ(interpolate_bus_bandwidth(rows, 1e6), 10e9);
  EXPECT_DOUBLE_EQ(interpolate_bus_bandwidth(rows, 4e6), 40e9);
  EXPECT_DOUBLE_EQ(interpolate_bus_bandwidth(rows, 16e6), 50e9);
  EXPECT_NEAR(interpolate_bus_bandwidth(rows, 2e6), 20e9, 20e9 * 1e-12);
  // A quarter of the way from 4 MB to 16 MB in log size: 40 * (50/40)^0.25 GB/s.
  EXPECT_NEAR(interpolate_bus_bandwidth(rows, 4e6 * std::sqrt(2.0)), 40e9 * std::pow(1.25, 0.25), 40e9 * 1e-12);
}

TEST(BusBandwidthInterpolation, IsClampedOutsideTheMeasuredSizes) {
  const std::vector<BusBandwidthSample> rows = {{1e6, 10e9}, {4e6, 40e9}};
  EXPECT_DOUBLE_EQ(interpolate_bus_bandwidth(rows, 1.0), 10e9);
  EXPECT_DOUBLE_EQ(interpolate_bus_bandwidth(rows, 1e12), 40e9);
  EXPECT_DOUBLE_EQ(interpolate_bus_bandwidth({{1e6, 7e9}}, 123.0), 7e9);  // one sample: constant
}

// dgx-a100-80g with an all-reduce table for 8 ranks.
HardwareProfile with_all_reduce_table() {
  HardwareProfile hw = testing::cluster("dgx-a100-80g");
  auto table = std::make_shared<MeasuredCollectives>();
  table->ranks = 8;
  table->all_reduce = {{1048576, 50e9}, {1073741824, 200e9}};
  hw.intra_node.measured = table;
  return hw;
}

// Inside one node a measured kind takes the measured bus bandwidth: t = 2(n-1)/n x S / busbw
// (the measurement includes the latency); 1 GiB on 8 ranks at 200 GB/s: 1.75 x 2^30 / 200e9.
TEST(MeasuredCollectives, ReplaceTheLinkRateInsideOneNode) {
  const HardwareProfile hw = with_all_reduce_table();
  const double gib = 1073741824.0;
  EXPECT_NEAR(collective_time(hw, Collective::kAllReduce, Bytes(gib), {8, 8}).value(), 1.75 * gib / 200e9, 1e-15);
  EXPECT_NEAR(collective_time(hw, Collective::kAllReduce, Bytes(1048576), {4, 4}).value(), 1.5 * 1048576 / 50e9, 1e-15);
  // 32 MiB: halfway in log size between 1 MiB and 1 GiB is 32 MiB = 2^25: sqrt(50 x 200) = 100 GB/s.
  EXPECT_NEAR(bus_bandwidth(hw, Collective::kAllReduce, Bytes(33554432), {8, 8}).value(), 100e9, 1e-3);
  ASSERT_TRUE(measured_bus_bandwidth(hw, Collective::kAllReduce, Bytes(33554432)));
  EXPECT_NEAR(measured_bus_bandwidth(hw, Collective::kAllReduce, Bytes(33554432))->value(), 100e9, 1e-3);
}

// Kinds without a table keep the link model: an all-gather of 100 MB on 8 ranks is NCCL's ring
// with the Simple protocol, (n-1)/n S / (300 GB/s x 0.78) plus its latency, 8.4 us + 7 steps of
// 3.4 us over NVLink (tuning.cc), as without any table.
TEST(MeasuredCollectives, LeaveUnmeasuredKindsToTheLinkModel) {
  const HardwareProfile hw = with_all_reduce_table();
  const HardwareProfile plain = testing::cluster("dgx-a100-80g");
  EXPECT_FALSE(measured_bus_bandwidth(hw, Collective::kAllGather, Bytes(1e6)));
  EXPECT_FALSE(measured_bus_bandwidth(hw, Collective::kAllToAll, Bytes(1e6)));
  for (Collective kind : {Collective::kAllGather, Collective::kReduceScatter, Collective::kAllToAll}) {
    EXPECT_DOUBLE_EQ(collective_time(hw, kind, Bytes(1e8), {8, 8}).value(), collective_time(plain, kind, Bytes(1e8), {8, 8}).value());
  }
  EXPECT_NEAR(collective_time(hw, Collective::kAllGather, Bytes(1e8), {8, 8}).value(), 0.875 * 1e8 / (300e9 * 0.78) + (8.4 + 7 * 3.4) * 1e-6, 1e-12);
}

// Across nodes NCCL's rings and trees span every rank and their bandwidth is the node's NICs':
// an intra-node table measured on one node does not change them.
TEST(MeasuredCollectives, AreNotUsedAcrossNodes) {
  HardwareProfile fast = testing::cluster("dgx-a100-80g");
  auto table = std::make_shared<MeasuredCollectives>();
  table->ranks = 8;
  table->all_reduce = {{1e3, 1e15}};
  fast.intra_node.measured = table;
  const HardwareProfile plain = testing::cluster("dgx-a100-80g");
  EXPECT_DOUBLE_EQ(collective_time(fast, Collective::kAllReduce, Bytes(1e9), {64, 8}).value(),
                   collective_time(plain, Collective::kAllReduce, Bytes(1e9), {64, 8}).value());
  EXPECT_LT(collective_time(fast, Collective::kAllReduce, Bytes(1e9), {8, 8}).value(),
            collective_time(plain, Collective::kAllReduce, Bytes(1e9), {8, 8}).value());
}

nlohmann::json profile_with_table(const nlohmann::json& measured) {
  nlohmann::json j = costmodel::hwprofile_to_json(testing::cluster("dgx-h100"));
  j["intra_node"]["measured"] = measured;
  return j;
}

nlohmann::json valid_table() {
  return {{"source", "test"},
          {"ranks", 2},
          {"columns", {"bytes", "bus_gb_per_s"}},
          {"collectives", {{"all_reduce", {{4096, 0.5}, {1048576, 3.0}}}, {"all_gather", {{4096, 0.4}, {1048576, 2.5}}}}}};
}

TEST(MeasuredCollectivesDocument, RoundTripsThroughJson) {
  auto hw = parse_hwprofile(profile_with_table(valid_table()), "t.json");
  ASSERT_TRUE(hw) << hw.error().message;
  ASSERT_TRUE(hw->intra_node.measured);
  EXPECT_EQ(hw->intra_node.measured->ranks, 2);
  ASSERT_EQ(hw->intra_node.measured->all_reduce.size(), 2u);
  EXPECT_DOUBLE_EQ(hw->intra_node.measured->all_reduce[1].bytes, 1048576);
  EXPECT_DOUBLE_EQ(hw->intra_node.measured->all_reduce[1].bus_bandwidth, 3e9);
  EXPECT_TRUE(hw->intra_node.measured->reduce_scatter.empty());
  auto again = parse_hwprofile_text(readable_json(hwprofile_to_json(*hw)), "again.json");
  ASSERT_TRUE(again) << again.error().message;
  ASSERT_TRUE(again->intra_node.measured);
  EXPECT_EQ(again->intra_node.measured->all_gather.size(), 2u);
  EXPECT_DOUBLE_EQ(again->intra_node.measured->all_gather[0].bus_bandwidth, 0.4e9);
  EXPECT_EQ(again->intra_node.measured->source, "test");
}

// Each case breaks one value; the error must name the file, the JSON pointer and the rule.
TEST(MeasuredCollectivesDocument, BadTablesFailNamingThePointer) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    const char* what;
    nlohmann::json table;
    std::string message;
  };
  std::vector<Case> cases;
  auto t = valid_table();
  t["collectives"]["all_reduce"][1][1] = nan;
  cases.push_back({"NaN bandwidth", t, "t.json: /intra_node/measured/collectives/all_reduce/1/1: must be a finite number > 0 (got nan)"});
  t = valid_table();
  t["collectives"]["all_gather"][0][1] = -2.0;
  cases.push_back({"negative bandwidth", t, "t.json: /intra_node/measured/collectives/all_gather/0/1: must be a finite number > 0 (got -2)"});
  t = valid_table();
  t["collectives"]["all_reduce"][0][0] = 0;
  cases.push_back({"zero bytes", t, "t.json: /intra_node/measured/collectives/all_reduce/0/0: must be a finite number > 0 (got 0)"});
  t = valid_table();
  t["collectives"]["all_reduce"][1][0] = 4096;
  cases.push_back({"repeated size", t, "t.json: /intra_node/measured/collectives/all_reduce/1: rows must be in strictly increasing (bytes) order"});
  t = valid_table();
  t["collectives"]["all_reduce"] = {{1048576, 3.0}, {4096, 0.5}};
  cases.push_back({"decreasing size", t, "t.json: /intra_node/measured/collectives/all_reduce/1: rows must be in strictly increasing (bytes) order"});
  t = valid_table();
  t["collectives"]["all_reduce"][0] = {4096, 0.5, 1.0};
  cases.push_back({"three columns", t, "t.json: /intra_node/measured/collectives/all_reduce/0: must be an array of 2 numbers"});
  t = valid_table();
  t["collectives"]["broadcast"] = {{4096, 0.5}};
  cases.push_back({"unknown collective", t, "t.json: /intra_node/measured/collectives/broadcast: unknown key"});
  t = valid_table();
  t["collectives"] = nlohmann::json::object();
  cases.push_back({"no collective", t, "t.json: /intra_node/measured/collectives: must hold at least one of"});
  t = valid_table();
  t["columns"] = {"bytes", "gb_per_s"};
  cases.push_back({"wrong columns", t, "t.json: /intra_node/measured/columns: must be [bytes, bus_gb_per_s]"});
  t = valid_table();
  t["ranks"] = 16;
  cases.push_back({"more ranks than the node has", t, "t.json: /intra_node/measured/ranks: must be from 2 to node/gpus_per_node (8)"});
  t = valid_table();
  t["collectives"]["all_reduce"] = nlohmann::json::array();
  cases.push_back({"empty table", t, "t.json: /intra_node/measured/collectives/all_reduce: must be a non-empty array of rows"});
  for (const Case& c : cases) {
    auto hw = parse_hwprofile(profile_with_table(c.table), "t.json");
    ASSERT_FALSE(hw) << c.what;
    EXPECT_NE(hw.error().message.find(c.message), std::string::npos) << c.what << ": " << hw.error().message;
  }
}

TEST(MeasuredCollectivesDocument, IsRejectedOnTheInterNodeLink) {
  nlohmann::json j = costmodel::hwprofile_to_json(testing::cluster("dgx-h100"));
  j["inter_node"]["measured"] = valid_table();
  auto hw = parse_hwprofile(j, "t.json");
  ASSERT_FALSE(hw);
  EXPECT_NE(hw.error().message.find("t.json: /inter_node/measured: unknown key"), std::string::npos) << hw.error().message;
}

}  // namespace
}  // namespace trainplan
