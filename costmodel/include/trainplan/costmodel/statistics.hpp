#pragma once
// Summary statistics the planner's readers of measurements and the kernel tables (kernel_import.cpp) share.

#include <algorithm>
#include <cstddef>
#include <vector>

namespace trainplan::costmodel {

// The median of `values` (the mean of the middle two for an even count); 0 for none.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace trainplan::costmodel
