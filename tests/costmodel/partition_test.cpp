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

}  // namespace
}  // namespace trainplan
