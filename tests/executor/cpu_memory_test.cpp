// The CPU allocator counter (executor/src/measure/cpu_memory.hpp): a tensor's bytes count while it lives
// and the peak keeps the most live at once, as CUDA's caching allocator reports allocated bytes.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "cpu_memory.hpp"

namespace trainplan::executor {
namespace {

TEST(CpuMemory, LiveTensorsCountTheirBytesAndThePeakKeepsTheMost) {
  install_cpu_memory_counter();
  install_cpu_memory_counter();  // once only: a second install changes nothing
  ASSERT_TRUE(cpu_memory_counted());
  const double before = cpu_allocated_bytes();
  cpu_reset_peak();
  EXPECT_EQ(cpu_peak_allocated_bytes(), before);
  {
    const at::Tensor a = at::empty({1000}, at::kFloat);  // 4000 B
    EXPECT_EQ(cpu_allocated_bytes(), before + 4000);
    {
      const at::Tensor b = at::empty({250}, at::kDouble);  // 2000 B
      EXPECT_EQ(cpu_allocated_bytes(), before + 6000);
    }
    EXPECT_EQ(cpu_allocated_bytes(), before + 4000);
    const at::Tensor c = at::add(a, a);  // a result of an op is counted too
    EXPECT_EQ(cpu_allocated_bytes(), before + 8000);
    EXPECT_EQ(cpu_peak_allocated_bytes(), before + 8000);  // not a and b and c: b was gone
  }
  EXPECT_EQ(cpu_allocated_bytes(), before);
  EXPECT_EQ(cpu_peak_allocated_bytes(), before + 8000);
  cpu_reset_peak();
  EXPECT_EQ(cpu_peak_allocated_bytes(), before);
}

}  // namespace
}  // namespace trainplan::executor
