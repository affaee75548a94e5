// Counting the CPU allocator's live bytes (see cpu_memory.hpp).

#include "cpu_memory.hpp"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace trainplan::executor {
namespace {

std::atomic<int64_t> g_live{0}, g_peak{0};

void add(int64_t bytes) {
  const int64_t now = g_live.fetch_add(bytes) + bytes;
  int64_t seen = g_peak.load();
  while (now > seen && !g_peak.compare_exchange_weak(seen, now)) {
  }
}

// A simple data pointer (data == context), as raw_allocate requires: what it frees is looked up
// by address, with the inner allocation and its size.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t bytes) override {
    c10::DataPtr inner = inner_->allocate(bytes);
    void* data = inner.get();
    const c10::Device device = inner.device();
    if (data == nullptr) return inner;  // zero bytes: nothing to count or free
    {
      std::lock_guard<std::mutex> lock(mutex());
      live().emplace(data, Held{std::move(inner), static_cast<int64_t>(bytes)});
    }
    add(static_cast<int64_t>(bytes));
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

 private:
  struct Held {
    c10::DataPtr inner;
    int64_t bytes;
  };
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::unordered_map<void*, Held>& live() {
    static auto* held = new std::unordered_map<void*, Held>();  // never destroyed: frees may come at exit
    return *held;
  }
  static void release(void* data) {
    Held held;
    {
      std::lock_guard<std::mutex> lock(mutex());
      auto it = live().find(data);
      if (it == live().end()) return;
      held = std::move(it->second);
      live().erase(it);
    }
    g_live.fetch_sub(held.bytes);
  }  // the inner allocation is freed here, outside the lock
  c10::Allocator* inner_;
};

bool g_installed = false;

}  // namespace

void install_cpu_memory_counter() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingCpuAllocator counter(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&counter, /*priority=*/UINT8_MAX);
    g_installed = true;
  });
}

bool cpu_memory_counted() { return g_installed; }
double cpu_allocated_bytes() { return static_cast<double>(g_live.load()); }
double cpu_peak_allocated_bytes() { return static_cast<double>(g_peak.load()); }
void cpu_reset_peak() { g_peak.store(g_live.load()); }

}  // namespace trainplan::executor
