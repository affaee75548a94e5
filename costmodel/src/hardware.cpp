#include "trainplan/costmodel/hardware.hpp"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "json_reader.hpp"

namespace trainplan::costmodel {

const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::kFp32: return "fp32";
    case Dtype::kBf16: return "bf16";
    case Dtype::kFp16: return "fp16";
    case Dtype::kFp8: return "fp8";
  }
  return "?";
}

double dtype_bytes(Dtype d) {
  switch (d) {
    case Dtype::kFp32: return 4;
    case Dtype::kBf16: return 2;
    case Dtype::kFp16: return 2;
    case Dtype::kFp8: return 1;
  }
  return 0;
}

namespace {

LinkSpec read_link(detail::ObjectReader r, bool inter) {
  LinkSpec l;
  if (inter) {
    l.kind = r.one_of("kind", {"infiniband", "roce", "efa", "ethernet"});
    l.nics_per_node = static_cast<int>(r.integer("nics_per_node", 1, 64));
    l.bandwidth = BytesPerSecond::gbit_per_s(r.number("nic_bandwidth_gbit_per_s", 0, 1e5, true));
  } else {
    l.kind = r.one_of("kind", {"nvswitch", "nvlink", "pcie"});
    l.bandwidth = BytesPerSecond::gb_per_s(r.number("bandwidth_gb_per_s", 0, 1e5, true));
  }
  l.efficiency = r.number("efficiency", 0, 1, true);
  l.latency = Seconds::us(r.number("latency_us", 0, 1e5));
  r.optional_string("source");
  r.finish();
  return l;
}

}  // namespace

Result<HardwareProfile> parse_hwprofile(const nlohmann::json& json, const std::string& file, const std::string& pointer) {
  try {
    detail::ObjectReader r(json, file, pointer);
    r.expect_schema("trainplan/hwprofile/v1");
    HardwareProfile hw;
    hw.name = r.string("name");
    hw.source = r.string("source");
    {
      detail::ObjectReader g = r.object("gpu");
      hw.gpu.name = g.string("name");
      detail::ObjectReader peak = g.object("peak_dense_tflop_per_s");
      hw.gpu.peak[0] = FlopsPerSecond::tflops(peak.number("fp32", 0, 1e6, true));
      hw.gpu.peak[1] = FlopsPerSecond::tflops(peak.number("bf16", 0, 1e6, true));
      hw.gpu.peak[2] = FlopsPerSecond::tflops(peak.number("fp16", 0, 1e6, true));
      hw.gpu.peak[3] = FlopsPerSecond::tflops(peak.optional_number("fp8", 0, 1e6).value_or(0.0));
      peak.finish();
      hw.gpu.hbm_capacity = Bytes::gib(g.number("hbm_capacity_gib", 0, 1e5, true));
      hw.gpu.hbm_bandwidth = BytesPerSecond::tb_per_s(g.number("hbm_bandwidth_tb_per_s", 0, 1e3, true));
      hw.gpu.sm_count = static_cast<int>(g.integer("sm_count", 1, 100000));
      hw.gpu.gemm_efficiency = g.number("gemm_efficiency", 0, 1, true);
      hw.gpu.attention_efficiency = g.number("attention_efficiency", 0, 1, true);
      hw.gpu.memory_efficiency = g.number("memory_bandwidth_efficiency", 0, 1, true);
      hw.gpu.reserved_memory = Bytes::gib(g.number("reserved_memory_gib", 0, 1e3));
      if (hw.gpu.reserved_memory.value() >= hw.gpu.hbm_capacity.value()) {
        char capacity[32];
        std::snprintf(capacity, sizeof capacity, "%g", hw.gpu.hbm_capacity.in_gib());
        g.fail("reserved_memory_gib", std::string("must be less than hbm_capacity_gib (") + capacity + ")");
      }
      hw.gpu.min_kernel_time = Seconds::us(g.number("min_kernel_us", 0, 1e4));
      g.optional_string("source");
      g.finish();
    }
    {
      detail::ObjectReader n = r.object("node");
      hw.gpus_per_node = static_cast<int>(n.integer("gpus_per_node", 1, 1024));
      hw.pcie_bandwidth = BytesPerSecond::gb_per_s(n.number("pcie_gb_per_s", 0, 1e4, true));
      hw.cpu_memory = Bytes::gib(n.number("cpu_memory_gib", 0, 1e6, true));
      hw.cpu_memory_bandwidth = BytesPerSecond::gb_per_s(n.number("cpu_memory_bandwidth_gb_per_s", 0, 1e5, true));
      hw.nvme_bandwidth = BytesPerSecond::gb_per_s(n.number("nvme_bandwidth_gb_per_s", 0, 1e5, true));
      n.optional_string("source");
      n.finish();
    }
    hw.intra_node = read_link(r.object("intra_node"), false);
    hw.inter_node = read_link(r.object("inter_node"), true);
    {
      detail::ObjectReader s = r.object("storage");
      hw.checkpoint_write_bandwidth = BytesPerSecond::gb_per_s(s.number("checkpoint_write_gb_per_s", 0, 1e6, true));
      s.optional_string("source");
      s.finish();
    }
    {
      detail::ObjectReader rel = r.object("reliability");
      hw.gpu_mtbf_hours = rel.number("gpu_mtbf_hours", 0, 1e9, true);
      hw.restart_time = Seconds(60.0 * rel.number("restart_minutes", 0, 1e5));
      rel.optional_string("source");
      rel.finish();
    }
    {
      detail::ObjectReader p = r.object("price");
      hw.price_per_gpu_hour_usd = p.number("usd_per_gpu_hour", 0, 1e4);
      p.optional_string("source");
      p.finish();
    }
    r.finish();
    return hw;
  } catch (const detail::DocumentError& e) {
    return Error{e.what()};
  }
}

Result<HardwareProfile> parse_hwprofile_text(const std::string& text, const std::string& file) {
  try {
    return parse_hwprofile(detail::parse_json(text, file), file);
  } catch (const detail::DocumentError& e) {
    return Error{e.what()};
  }
}

nlohmann::json hwprofile_to_json(const HardwareProfile& hw) {
  const auto link = [](const LinkSpec& l, bool inter) {
    nlohmann::json j = {{"kind", l.kind}, {"efficiency", l.efficiency}, {"latency_us", l.latency.value() * 1e6}};
    if (inter) {
      j["nics_per_node"] = l.nics_per_node;
      j["nic_bandwidth_gbit_per_s"] = l.bandwidth.value() * 8 / 1e9;
    } else {
      j["bandwidth_gb_per_s"] = l.bandwidth.in_gb_per_s();
    }
    return j;
  };
  return {
      {"schema", "trainplan/hwprofile/v1"},
      {"name", hw.name},
      {"source", hw.source},
      {"gpu",
       {{"name", hw.gpu.name},
        {"peak_dense_tflop_per_s",
         {{"fp32", hw.gpu.peak[0].in_tflops()}, {"bf16", hw.gpu.peak[1].in_tflops()},
          {"fp16", hw.gpu.peak[2].in_tflops()}, {"fp8", hw.gpu.peak[3].in_tflops()}}},
        {"hbm_capacity_gib", hw.gpu.hbm_capacity.in_gib()},
        {"hbm_bandwidth_tb_per_s", hw.gpu.hbm_bandwidth.value() / 1e12},
        {"sm_count", hw.gpu.sm_count},
        {"gemm_efficiency", hw.gpu.gemm_efficiency},
        {"attention_efficiency", hw.gpu.attention_efficiency},
        {"memory_bandwidth_efficiency", hw.gpu.memory_efficiency},
        {"reserved_memory_gib", hw.gpu.reserved_memory.in_gib()},
        {"min_kernel_us", hw.gpu.min_kernel_time.value() * 1e6}}},
      {"node",
       {{"gpus_per_node", hw.gpus_per_node},
        {"pcie_gb_per_s", hw.pcie_bandwidth.in_gb_per_s()},
        {"cpu_memory_gib", hw.cpu_memory.in_gib()},
        {"cpu_memory_bandwidth_gb_per_s", hw.cpu_memory_bandwidth.in_gb_per_s()},
        {"nvme_bandwidth_gb_per_s", hw.nvme_bandwidth.in_gb_per_s()}}},
      {"intra_node", link(hw.intra_node, false)},
      {"inter_node", link(hw.inter_node, true)},
      {"storage", {{"checkpoint_write_gb_per_s", hw.checkpoint_write_bandwidth.in_gb_per_s()}}},
      {"reliability", {{"gpu_mtbf_hours", hw.gpu_mtbf_hours}, {"restart_minutes", hw.restart_time.value() / 60}}},
      {"price", {{"usd_per_gpu_hour", hw.price_per_gpu_hour_usd}}},
  };
}

}  // namespace trainplan::costmodel
