#pragma once
// HardwareProfile: one cluster kind (GPU, node, intra- and inter-node links, storage, reliability,
// price) and the `trainplan/hwprofile/v1` JSON document. Units are converted once, on load.

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "trainplan/costmodel/collectives.hpp"
#include "trainplan/costmodel/kernels.hpp"

#include "trainplan/costmodel/result.hpp"
#include "trainplan/costmodel/units.hpp"

namespace trainplan::costmodel {

enum class Dtype { kFp32 = 0, kBf16 = 1, kFp16 = 2, kFp8 = 3 };
inline constexpr int kDtypeCount = 4;
[[nodiscard]] const char* dtype_name(Dtype d);
[[nodiscard]] double dtype_bytes(Dtype d);

// Corrections fitted to measurements by `planner calibrate` (the `gpu.calibration` section):
// multipliers of the time of each kernel class, of the kernel latency and of the collectives,
// and bytes the allocator reserves beyond the model's count. Datasheet figures and measured tables are never
// changed; an uncalibrated profile has every scale 1 and no extra bytes.
struct Calibration {
  double gemm_time_scale = 1;       // GEMM kernels' work time
  double attention_time_scale = 1;  // fused attention kernels' work time
  double memory_time_scale = 1;     // memory-bound kernels' work time (element-wise, streaming, optimizer)
  double latency_scale = 1;         // the per-kernel latency
  // Every collective's and point-to-point transfer's time (NCCL on GPUs, MPI on CPU ranks): what
  // the collectives of a training step take against what the profile's tables or NCCL's model say
  // (on CPU ranks sharing cores, a rank waiting in a collective competes with the one computing).
  double collective_time_scale = 1;
  double allocator_extra_bytes = 0; // added to the peak reserved memory
  std::string source;               // the measurements fitted, and when
  [[nodiscard]] bool identity() const {
    return gemm_time_scale == 1 && attention_time_scale == 1 && memory_time_scale == 1 && latency_scale == 1 && collective_time_scale == 1 &&
           allocator_extra_bytes == 0;
  }
};

struct GpuSpec {
  std::string name;
  FlopsPerSecond peak[kDtypeCount];  // dense peak per dtype; 0 where unsupported (fp8 on A100)
  Bytes hbm_capacity;
  BytesPerSecond hbm_bandwidth;
  int sm_count = 0;
  double gemm_efficiency = 0;      // fraction of peak a large, well-shaped GEMM reaches
  double attention_efficiency = 0; // fraction of peak a fused (flash) attention kernel reaches
  double memory_efficiency = 0;    // fraction of HBM bandwidth a streaming kernel reaches
  Bytes reserved_memory;           // CUDA context, cuBLAS/NCCL workspaces: not usable for tensors
  int generation = -1;             // gpu_generation of `name`, set when a profile is read; -1: not yet
  Seconds min_kernel_time;         // latency of one kernel (launch, fill, tail) added to its work; `min_kernel_us`
  // Measured kernel tables (`kernels`); null: kernel times come from the figures above.
  std::shared_ptr<const KernelTables> kernels;
  Calibration calibration;
  // The clocks (`gpu.clocks`, optional): the SM clock the dense peaks and the measured tables are
  // for (`peak_mhz`), the clock the GPU holds under hours of full load at its power limit
  // (`sustained_mhz`, from nvidia-smi or DCGM on the user's own cluster), and that limit
  // (`power_limit_w`). Tensor-core work scales with the SM clock; HBM-bound work does not. 0:
  // not stated, the peaks stand for the whole run.
  double peak_clock_mhz = 0, sustained_clock_mhz = 0, power_limit_w = 0;
  std::string clocks_source;
  std::string source;              // where the figures above come from
  [[nodiscard]] FlopsPerSecond peak_for(Dtype d) const { return peak[static_cast<int>(d)]; }
  // How much longer compute-bound kernels take at the sustained clock: peak / sustained, >= 1.
  [[nodiscard]] double clock_slowdown() const {
    return peak_clock_mhz > 0 && sustained_clock_mhz > 0 && sustained_clock_mhz < peak_clock_mhz ? peak_clock_mhz / sustained_clock_mhz : 1.0;
  }
};

struct LinkSpec {
  std::string kind;                // "nvswitch", "nvlink", "pcie", "infiniband", "roce", "efa"
  BytesPerSecond bandwidth;        // intra: per GPU per direction; inter: per NIC per direction
  int nics_per_node = 0;           // inter-node only
  double efficiency = 0;           // bus bandwidth reached by large NCCL collectives / wire rate
  Seconds latency;                 // per message hop
  // Inter-node only: the latency the NCCL network plugin reports (`net_plugin_latency_us`), which
  // NCCL's tuning model adds to every network step, twice with the Simple protocol (tuning.cc
  // interLat += graph->latencyInter, search.cc: net->latency). 0 for NCCL's own InfiniBand, RoCE
  // and socket transports; AWS's aws-ofi-nccl reports 75 us on p4d, p4de, p5 and p5e and 35 us on
  // p5en and later (src/platform-aws.cpp platform_data_map).
  Seconds plugin_latency;
  // Inter-node only: GPUs under one pod of full bisection bandwidth (`pod_gpus`; 0: the whole
  // cluster is non-blocking) and the oversubscription of the tier above it, downlink : uplink
  // (`oversubscription`, 1 = none). Llama 3's clusters: pods of 3,072 GPUs, 1:7 above them (Dubey
  // et al. 2024, Sec. 3.3.1).
  int pod_gpus = 0;
  double oversubscription = 1;
  std::string source;
  // Intra-node only: the all-reduce bus bandwidth NCCL's NVLS algorithm (NVLink SHARP: the
  // NVSwitch reduces, GPUs write and read once) reaches on these GPUs, measured with nccl-tests
  // (`nvls_bus_gb_per_s`); 0: no NVLS (no NVSwitch multicast, NCCL_NVLS_ENABLE=0, or unmeasured).
  BytesPerSecond nvls_bus_bandwidth;
  // Intra-node only: measured bus bandwidths by message size (`measured`); null: not measured.
  std::shared_ptr<const MeasuredCollectives> measured;
};

// The host CPU's vendor (`node.cpu_vendor`): NCCL's tuning model charges a network step's host
// overhead and caps its LL protocol by it (NVIDIA/nccl src/graph/tuning.cc getNetOverhead,
// llMaxBws: 1 us on Intel and others, 2 us on AMD). Absent: kOther, which NCCL treats as Intel.
enum class CpuVendor { kOther, kIntel, kAmd, kArm };

struct HardwareProfile {
  std::string name;
  std::string source;
  GpuSpec gpu;
  int gpus_per_node = 0;
  // GPUs joined by one NVLink fabric (`node.nvlink_domain_gpus`): 8 in a DGX/HGX node, 72 in a
  // GB200 or GB300 NVL72 rack, whose nodes (compute trays) hold 4. Collectives and pipeline
  // sends among them run at NVLink rates; tensor, context and expert parallelism are placed in it.
  // 0 when read: gpus_per_node. A multiple of gpus_per_node.
  int nvlink_domain = 0;
  BytesPerSecond pcie_bandwidth;          // host<->GPU, per GPU per direction
  Bytes cpu_memory;                       // per node
  BytesPerSecond cpu_memory_bandwidth;    // per node
  BytesPerSecond nvme_bandwidth;          // per node, for NVMe offload
  CpuVendor cpu_vendor = CpuVendor::kOther;
  // Whether a collective runs beside the compute (`node.collectives_overlap_compute`, default
  // true). NCCL's kernels run on SMs of their own, on their own stream: true. CPU ranks (planner
  // profile --device cpu writes false): Open MPI's shared-memory collectives copy and reduce with
  // the CPU cores the ranks compute on, and the executor gives each rank cores / ranks threads,
  // so no core is idle to run them (its progress thread drives them during compute, on the same
  // cores): a collective's time adds to the compute's, and every data-parallel collective is
  // exposed.
  bool collectives_overlap_compute = true;
  LinkSpec intra_node;
  LinkSpec inter_node;
  BytesPerSecond checkpoint_write_bandwidth;  // aggregate, to the shared file system
  double gpu_mtbf_hours = 0;              // mean time between failures of one GPU (incl. its host share)
  // What a synchronous job of many GPUs waits for (the `reliability` section, optional, 0 when
  // absent): the coefficient of variation of the sustained speed of GPUs of this SKU across the
  // fleet (manufacturing and power management: Sinha et al., SC22), and of one GPU's step time from
  // step to step. Every step waits for the slowest of its GPUs (estimate.cpp, "sustained step").
  double gpu_speed_cv = 0;
  double step_jitter_cv = 0;
  Seconds restart_time;                   // detect, reschedule, reload after a failure
  double price_per_gpu_hour_usd = 0;
  // Where each section's figures come from (the documents' `source` strings), kept for writing.
  std::string node_source, storage_source, reliability_source, price_source;

  [[nodiscard]] int nvlink_domain_gpus() const { return nvlink_domain > 0 ? nvlink_domain : gpus_per_node; }
  // Inter-node bandwidth available to one GPU when all GPUs of a node send at once.
  [[nodiscard]] BytesPerSecond nic_bandwidth_per_gpu() const {
    return BytesPerSecond(inter_node.bandwidth.value() * inter_node.nics_per_node / gpus_per_node);
  }
};

// The GPU's generation as NCCL's tuning model and the published kernel tables index it, from its
// name: 0 Volta, 1 Ampere (and any GPU not recognised), 2 Hopper (H100, H200, H800, H20), 3
// Blackwell (B200, B300, GB200, GB300).
[[nodiscard]] int gpu_generation(const GpuSpec& gpu);

[[nodiscard]] Result<HardwareProfile> parse_hwprofile(const nlohmann::json& json, const std::string& file,
                                                      const std::string& pointer = "");
[[nodiscard]] Result<HardwareProfile> parse_hwprofile_text(const std::string& text, const std::string& file);
[[nodiscard]] nlohmann::json hwprofile_to_json(const HardwareProfile& hw);
// JSON text for people and diffs: objects one key per line, arrays of numbers or strings (and
// arrays of such arrays' rows) on one line each.
[[nodiscard]] std::string readable_json(const nlohmann::json& json);

}  // namespace trainplan::costmodel
