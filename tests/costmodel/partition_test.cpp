// partition_layers: its O(layers) filling gives exactly the layer-by-layer water-filling (the
// reference below, as the cost model first had it) for every split, with ties, free ends and
// expensive ends.

#include <vector>

#include <gtest/gtest.h>

#include "trainplan/costmodel/estimate.hpp"

namespace trainplan {
namespace {

std::vector<int> reference_partition(int layers, int chunks, double layer_seconds, double first_seconds, double last_seconds) {
  std::vector<int> n(static_cast<std::size_t>(chunks), 1);
  const auto cost = [&](int c, int count) {
    return count * layer_seconds + (c == 0 ? first_seconds : 0.0) + (c == chunks - 1 ? last_seconds : 0.0);
  };
  for (int placed = chunks; placed < layers; ++placed) {
    int best = 0;
    for (int c = 1; c < chunks; ++c) {
      if (cost(c, n[c] + 1) < cost(best, n[best] + 1) - 1e-15 * layer_seconds) best = c;
    }
    ++n[best];
  }
  return n;
}

TEST(PartitionLayers, GivesExactlyTheLayerByLayerWaterFilling) {
  struct Costs {
    double layer, first, last;
  };
  const Costs costs[] = {{1.0, 0, 0},        {1.0, 0.2, 1.5},     {1.0, 1.0, 2.0},       {1.0, 3.0, 0.0},
                         {0.37, 0.37, 0.74}, {2e-3, 5e-4, 7e-3},  {1e-6, 0, 1e-5},       {1.0, 0.5, 0.5},
                         {0.0, 1.0, 2.0},    {0.0, 0.0, 0.0},     {1.0, 40.0, 0.0},      {3.3e-3, 1.1e-3, 9.9e-3}};
  int compared = 0;
  for (const auto& c : costs) {
    for (int layers = 1; layers <= 130; ++layers) {
      for (int chunks = 1; chunks <= std::min(layers, 48); ++chunks) {
        ASSERT_EQ(costmodel::partition_layers(layers, chunks, c.layer, c.first, c.last),
                  reference_partition(layers, chunks, c.layer, c.first, c.last))
            << layers << " layers, " << chunks << " chunks, costs " << c.layer << " " << c.first << " " << c.last;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 50000);
}

// Fixed first and last stages (Megatron's --decoder-first/last-pipeline-num-layers): Llama 3
// 405B's 126 layers on 16 stages with 7 on the first and the last leave 112 for the 14 others, 8
// each; with 2 virtual stages each end stage's 8 split 4 and 4 over its chunks (chunk c on stage
// c % 16), and the 110 left over 28 chunks: the first 26 of them 4, the last two 3.
TEST(PartitionWithEnds, GivesTheEndsTheirLayersAndSpreadsTheRest) {
  const std::vector<int> one = costmodel::partition_with_ends(126, 16, 1, 7, 7);
  ASSERT_EQ(one.size(), 16u);
  EXPECT_EQ(one.front(), 7);
  EXPECT_EQ(one.back(), 7);
  for (std::size_t c = 1; c + 1 < one.size(); ++c) EXPECT_EQ(one[c], 8) << c;
  const std::vector<int> two = costmodel::partition_with_ends(126, 16, 2, 8, 8);
  ASSERT_EQ(two.size(), 32u);
  int total = 0, threes = 0;
  for (std::size_t c = 0; c < two.size(); ++c) {
    total += two[c];
    const int stage = static_cast<int>(c % 16);
    if (stage == 0 || stage == 15) {
      EXPECT_EQ(two[c], 4) << c;
    }
    if (two[c] == 3) ++threes;
  }
  EXPECT_EQ(total, 126);
  EXPECT_EQ(threes, 2);
  EXPECT_EQ(two[1], 4);
  EXPECT_EQ(two[29], 3);
  EXPECT_EQ(two[30], 3);
  // Only the last stage fixed: the first is free and takes its even share.
  const std::vector<int> last = costmodel::partition_with_ends(80, 4, 1, 0, 14);
  EXPECT_EQ(last, (std::vector<int>{22, 22, 22, 14}));
}

}  // namespace
}  // namespace trainplan
