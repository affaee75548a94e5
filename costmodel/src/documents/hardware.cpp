#include "trainplan/costmodel/hardware.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

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

// The least a rate, size or efficiency of a profile may be: 0.001 of its unit (a GB/s, a TFLOP/s,
// a GiB, 0.1% efficiency). Below that a profile is broken, not slow, and its results infinite.
constexpr double kTiny = 1e-3;

// `gpus_per_node` bounds the ranks of an intra-node link's measured table.
LinkSpec read_link(detail::ObjectReader r, bool inter, int gpus_per_node) {
  LinkSpec l;
  if (inter) {
    l.kind = r.one_of("kind", {"infiniband", "roce", "efa", "ethernet"});
    l.nics_per_node = static_cast<int>(r.integer("nics_per_node", 1, 64));
    l.bandwidth = BytesPerSecond::gbit_per_s(r.number("nic_bandwidth_gbit_per_s", kTiny, 1e5));
    l.plugin_latency = Seconds::us(r.optional_number("net_plugin_latency_us", 0, 1e5).value_or(0.0));
    l.pod_gpus = static_cast<int>(r.optional_integer("pod_gpus", 1, 1 << 24).value_or(0));
    l.oversubscription = r.optional_number("oversubscription", 1, 1000).value_or(1.0);
  } else {
    l.kind = r.one_of("kind", {"nvswitch", "nvlink", "pcie"});
    l.bandwidth = BytesPerSecond::gb_per_s(r.number("bandwidth_gb_per_s", kTiny, 1e5));
    l.nvls_bus_bandwidth = BytesPerSecond::gb_per_s(r.optional_number("nvls_bus_gb_per_s", 0, 1e5).value_or(0.0));
  }
  l.efficiency = r.number("efficiency", kTiny, 1);
  l.latency = Seconds::us(r.number("latency_us", 0, 1e5));
  l.source = r.optional_string("source").value_or("");
  if (!inter && r.has("measured")) l.measured = read_measured_collectives(r.raw("measured"), r.file(), r.pointer("measured"), gpus_per_node);
  r.finish();
  return l;
}

}  // namespace

int gpu_generation(const GpuSpec& gpu) {
  if (gpu.generation >= 0) return gpu.generation;
  const std::string& n = gpu.name;
  const auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("B200") || has("B300") || has("GB200") || has("GB300")) return 3;
  if (has("H100") || has("H200") || has("H800") || has("H20")) return 2;
  if (has("V100")) return 0;
  return 1;
}

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
      hw.gpu.peak[0] = FlopsPerSecond::tflops(peak.number("fp32", kTiny, 1e6));
      hw.gpu.peak[1] = FlopsPerSecond::tflops(peak.number("bf16", kTiny, 1e6));
      hw.gpu.peak[2] = FlopsPerSecond::tflops(peak.number("fp16", kTiny, 1e6));
      hw.gpu.peak[3] = FlopsPerSecond::tflops(peak.optional_number("fp8", 0, 1e6).value_or(0.0));
      peak.finish();
      hw.gpu.hbm_capacity = Bytes::gib(g.number("hbm_capacity_gib", kTiny, 1e5));
      hw.gpu.hbm_bandwidth = BytesPerSecond::tb_per_s(g.number("hbm_bandwidth_tb_per_s", kTiny, 1e3));
      hw.gpu.sm_count = static_cast<int>(g.integer("sm_count", 1, 100000));
      hw.gpu.gemm_efficiency = g.number("gemm_efficiency", kTiny, 1);
      hw.gpu.attention_efficiency = g.number("attention_efficiency", kTiny, 1);
      hw.gpu.memory_efficiency = g.number("memory_bandwidth_efficiency", kTiny, 1);
      hw.gpu.reserved_memory = Bytes::gib(g.number("reserved_memory_gib", 0, 1e3));
      if (hw.gpu.reserved_memory.value() >= hw.gpu.hbm_capacity.value()) {
        char capacity[32];
        std::snprintf(capacity, sizeof capacity, "%g", hw.gpu.hbm_capacity.in_gib());
        g.fail("reserved_memory_gib", std::string("must be less than hbm_capacity_gib (") + capacity + ")");
      }
      hw.gpu.min_kernel_time = Seconds::us(g.number("min_kernel_us", 0, 1e4));
      if (g.has("kernels")) {
        hw.gpu.kernels = read_kernel_tables(g.raw("kernels"), file, g.pointer("kernels"), hw.gpu.sm_count, hw.gpu.hbm_bandwidth.value());
      }
      if (g.has("calibration")) {
        detail::ObjectReader c = g.object("calibration");
        Calibration& cal = hw.gpu.calibration;
        cal.gemm_time_scale = c.number("gemm_time_scale", 0.1, 10, true);
        cal.attention_time_scale = c.number("attention_time_scale", 0.1, 10, true);
        cal.memory_time_scale = c.number("memory_time_scale", 0.1, 10, true);
        cal.latency_scale = c.number("latency_scale", 0, 100);
        cal.collective_time_scale = c.optional_number("collective_time_scale", 0.1, 10, true).value_or(1.0);
        cal.allocator_extra_bytes = Bytes::gib(c.number("allocator_extra_gib", -1e4, 1e4)).value();
        cal.source = c.string("source");
        c.finish();
      }
      if (g.has("clocks")) {
        detail::ObjectReader c = g.object("clocks");
        hw.gpu.peak_clock_mhz = c.number("peak_mhz", 1, 1e5);
        hw.gpu.sustained_clock_mhz = c.number("sustained_mhz", 1, 1e5);
        if (hw.gpu.sustained_clock_mhz > hw.gpu.peak_clock_mhz) {
          c.fail("sustained_mhz", "must not exceed peak_mhz (the clock the peaks are for): a GPU does not sustain more than its peak");
        }
        hw.gpu.power_limit_w = c.optional_number("power_limit_w", 1, 1e5).value_or(0.0);
        hw.gpu.clocks_source = c.string("source");
        c.finish();
      }
      hw.gpu.source = g.optional_string("source").value_or("");
      hw.gpu.generation = gpu_generation(hw.gpu);
      g.finish();
    }
    {
      detail::ObjectReader n = r.object("node");
      hw.gpus_per_node = static_cast<int>(n.integer("gpus_per_node", 1, 1024));
      hw.pcie_bandwidth = BytesPerSecond::gb_per_s(n.number("pcie_gb_per_s", kTiny, 1e4));
      hw.cpu_memory = Bytes::gib(n.number("cpu_memory_gib", kTiny, 1e6));
      hw.cpu_memory_bandwidth = BytesPerSecond::gb_per_s(n.number("cpu_memory_bandwidth_gb_per_s", kTiny, 1e5));
      hw.nvme_bandwidth = BytesPerSecond::gb_per_s(n.number("nvme_bandwidth_gb_per_s", kTiny, 1e5));
      if (const auto vendor = n.optional_one_of("cpu_vendor", {"intel", "amd", "arm", "other"})) {
        hw.cpu_vendor = *vendor == "intel" ? CpuVendor::kIntel : *vendor == "amd" ? CpuVendor::kAmd : *vendor == "arm" ? CpuVendor::kArm : CpuVendor::kOther;
      }
      if (const auto domain = n.optional_integer("nvlink_domain_gpus", 1, 1 << 16)) {
        if (*domain % hw.gpus_per_node != 0) {
          n.fail("nvlink_domain_gpus", "must be a multiple of gpus_per_node (" + std::to_string(hw.gpus_per_node) + "): an NVLink domain holds whole nodes");
        }
        hw.nvlink_domain = static_cast<int>(*domain);
      }
      if (n.has("collectives_overlap_compute")) hw.collectives_overlap_compute = n.boolean("collectives_overlap_compute");
      hw.node_source = n.optional_string("source").value_or("");
      n.finish();
    }
    hw.intra_node = read_link(r.object("intra_node"), false, hw.gpus_per_node);
    hw.inter_node = read_link(r.object("inter_node"), true, hw.gpus_per_node);
    {
      detail::ObjectReader s = r.object("storage");
      hw.checkpoint_write_bandwidth = BytesPerSecond::gb_per_s(s.number("checkpoint_write_gb_per_s", kTiny, 1e6));
      hw.storage_source = s.optional_string("source").value_or("");
      s.finish();
    }
    {
      detail::ObjectReader rel = r.object("reliability");
      hw.gpu_mtbf_hours = rel.number("gpu_mtbf_hours", kTiny, 1e9);
      hw.restart_time = Seconds(60.0 * rel.number("restart_minutes", 0, 1e5));
      hw.gpu_speed_cv = rel.optional_number("gpu_speed_cv", 0, 0.5).value_or(0);
      hw.step_jitter_cv = rel.optional_number("step_jitter_cv", 0, 0.5).value_or(0);
      hw.reliability_source = rel.optional_string("source").value_or("");
      rel.finish();
    }
    {
      detail::ObjectReader p = r.object("price");
      hw.price_per_gpu_hour_usd = p.number("usd_per_gpu_hour", 0, 1e4);
      hw.price_source = p.optional_string("source").value_or("");
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
      if (l.plugin_latency.value() > 0) j["net_plugin_latency_us"] = l.plugin_latency.value() * 1e6;
      if (l.pod_gpus > 0) j["pod_gpus"] = l.pod_gpus;
      if (l.oversubscription != 1) j["oversubscription"] = l.oversubscription;
    } else {
      j["bandwidth_gb_per_s"] = l.bandwidth.in_gb_per_s();
      if (l.nvls_bus_bandwidth.value() > 0) j["nvls_bus_gb_per_s"] = l.nvls_bus_bandwidth.in_gb_per_s();
    }
    if (!l.source.empty()) j["source"] = l.source;
    if (!inter && l.measured) j["measured"] = measured_collectives_to_json(*l.measured);
    return j;
  };
  nlohmann::json j = {
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
  if (hw.gpu.kernels) j["gpu"]["kernels"] = kernel_tables_to_json(*hw.gpu.kernels);
  if (hw.nvlink_domain > hw.gpus_per_node) j["node"]["nvlink_domain_gpus"] = hw.nvlink_domain;
  if (!hw.collectives_overlap_compute) j["node"]["collectives_overlap_compute"] = false;
  if (hw.gpu.peak_clock_mhz > 0) {
    j["gpu"]["clocks"] = {{"peak_mhz", hw.gpu.peak_clock_mhz}, {"sustained_mhz", hw.gpu.sustained_clock_mhz}, {"source", hw.gpu.clocks_source}};
    if (hw.gpu.power_limit_w > 0) j["gpu"]["clocks"]["power_limit_w"] = hw.gpu.power_limit_w;
  }
  if (hw.cpu_vendor != CpuVendor::kOther) {
    j["node"]["cpu_vendor"] = hw.cpu_vendor == CpuVendor::kIntel ? "intel" : hw.cpu_vendor == CpuVendor::kAmd ? "amd" : "arm";
  }
  if (!hw.gpu.calibration.identity()) {
    const Calibration& c = hw.gpu.calibration;
    j["gpu"]["calibration"] = {{"gemm_time_scale", c.gemm_time_scale}, {"attention_time_scale", c.attention_time_scale},
                               {"memory_time_scale", c.memory_time_scale}, {"latency_scale", c.latency_scale},
                               {"collective_time_scale", c.collective_time_scale},
                               {"allocator_extra_gib", Bytes(c.allocator_extra_bytes).in_gib()}, {"source", c.source}};
  }
  const auto with_source = [&](nlohmann::json& section, const std::string& source) {
    if (!source.empty()) section["source"] = source;
  };
  with_source(j["gpu"], hw.gpu.source);
  with_source(j["node"], hw.node_source);
  with_source(j["storage"], hw.storage_source);
  if (hw.gpu_speed_cv > 0) j["reliability"]["gpu_speed_cv"] = hw.gpu_speed_cv;
  if (hw.step_jitter_cv > 0) j["reliability"]["step_jitter_cv"] = hw.step_jitter_cv;
  with_source(j["reliability"], hw.reliability_source);
  with_source(j["price"], hw.price_source);
  return j;
}

namespace {

// Whole numbers without a fraction ("64", not "64.0"); others as nlohmann writes them.
std::string number_text(const nlohmann::json& j) {
  if (j.is_number_float()) {
    const double v = j.get<double>();
    if (std::isfinite(v) && std::fabs(v) < 1e15 && v == std::floor(v)) return std::to_string(static_cast<long long>(v));
  }
  return j.dump();
}

bool scalar_array(const nlohmann::json& j) {
  if (!j.is_array()) return false;
  for (const auto& x : j) {
    if (x.is_structured()) return false;
  }
  return true;
}

void write_readable(const nlohmann::json& j, int depth, std::string& out) {
  const std::string pad(static_cast<std::size_t>(2 * depth), ' ');
  const std::string inner(static_cast<std::size_t>(2 * depth + 2), ' ');
  if (j.is_object()) {
    if (j.empty()) {
      out += "{}";
      return;
    }
    out += "{\n";
    // A document's identity first, then the rest in key order.
    std::vector<std::string> keys;
    for (const char* k : {"schema", "name", "source"}) {
      if (j.contains(k)) keys.emplace_back(k);
    }
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) keys.push_back(it.key());
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      out += inner + nlohmann::json(keys[i]).dump() + ": ";
      write_readable(j.at(keys[i]), depth + 1, out);
      out += i + 1 < keys.size() ? ",\n" : "\n";
    }
    out += pad + "}";
  } else if (j.is_array() && !scalar_array(j)) {
    out += "[\n";
    for (std::size_t i = 0; i < j.size(); ++i) {
      out += inner;
      write_readable(j[i], depth + 1, out);
      out += i + 1 < j.size() ? ",\n" : "\n";
    }
    out += pad + "]";
  } else if (j.is_array()) {
    out += "[";
    for (std::size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + number_text(j[i]);
    out += "]";
  } else {
    out += number_text(j);
  }
}

}  // namespace

std::string readable_json(const nlohmann::json& json) {
  std::string out;
  write_readable(json, 0, out);
  return out + "\n";
}

}  // namespace trainplan::costmodel
