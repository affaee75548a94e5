#pragma once
// Measured kernel tables of a GPU (the `gpu.kernels` section of a `trainplan/hwprofile/v1`
// document) and KernelRates, the time of one kernel on that GPU: GEMMs interpolated between
// measured shapes, fused attention by sequence length and head size, element-wise ops at their
// measured rates, streaming kernels at the measured copy bandwidth, each kernel paying a fixed
// latency (launch, pipeline fill, tail). Without tables the same questions are answered from the
// datasheet figures and the profile's efficiencies (the analytic model).
//
// Every time below is seconds on one GPU; sizes are elements unless a name says bytes.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace trainplan::costmodel {

struct GpuSpec;
enum class Dtype;

// The fused attention kernel a stack runs (StackSpec::attention_kernel).
enum class AttentionImpl {
  // The profile's measured attention table (gpu.kernels.attention: the SDPA backend the PyTorch
  // that measured it picked; on the H100 presets, torch 2.11's cuDNN attention), else the
  // profile's attention_efficiency.
  kProfile,
  // FlashAttention-2 (the flash-attn package, or SDPA's flash backend, which is FlashAttention-2
  // from PyTorch 2.2): its published rates on Ampere and Hopper (attention_kernels.cpp), the
  // profile's figures on other GPUs.
  kFlash2,
  // FlashAttention-3 (the flash-attn package's hopper/ build, flash_attn_interface): Hopper only
  // (sm90: its warp-specialised TMA/WGMMA kernels), its published bf16/fp16 rates there
  // (attention_kernels.cpp); a plan asking for it on another GPU is refused.
  kFlash3,
};
// Plan key training.attention_kernel, planner --attention-kernel: "profile", "flash2", "flash3".
[[nodiscard]] const char* attention_impl_name(AttentionImpl impl);
[[nodiscard]] std::optional<AttentionImpl> attention_impl_from_name(const std::string& name);
[[nodiscard]] const char* attention_impl_choices();  // "profile | flash2 | flash3"

// Memory-bound operations a training step runs, as PyTorch runs them eagerly (one or more ATen
// kernels each). `elements` of an op is the size its bytes are counted on (kElementwiseOps).
enum class ElementwiseOp {
  kRmsNorm,           // F.rms_norm: n = tokens x hidden
  kLayerNorm,         // F.layer_norm: n = tokens x hidden
  kResidualAdd,       // a + b: n = tokens x hidden
  kCast,              // bf16 -> fp32 copy: n elements
  kSwiglu,            // silu(g) * u: m = tokens x ffn
  kGelu,              // tanh GELU: m = tokens x ffn
  kDropout,           // m elements
  kRotaryEager,       // x * cos + rotate_half(x) * sin: n = tokens x (heads x head_dim)
  kCrossEntropyFp32,  // F.cross_entropy(logits.float()): v = tokens x vocab (cast included)
  kCrossEntropyBf16,  // F.cross_entropy(logits) in bf16: v = tokens x vocab
  kEmbedding,         // F.embedding forward (gather) and backward (sort, scatter-add): n = tokens x hidden
  // RMSNorm as Hugging Face transformers writes it (LlamaRMSNorm): x.to(float32), pow(2), mean, + eps,
  // rsqrt, multiply, .to(input dtype), times the weight, each its own ATen op: n = tokens x hidden
  kRmsNormUnfused,
};
inline constexpr int kElementwiseOpCount = 12;

struct ElementwiseOpInfo {
  ElementwiseOp op;
  const char* name;              // key in the profile's `kernels.elementwise`
  double forward_bytes;          // least bytes moved per element (bf16), the GB/s convention of the tables
  double backward_bytes;
  int forward_kernels;           // ATen kernels an eager call launches
  int backward_kernels;
  // Bytes per element an eager implementation moves in effect (its measured time times the copy
  // bandwidth; rmsnorm_unfused's counted, it has no measured row yet), for profiles without a table row: shared/data/measured/h100-llama3.2-1b/
  // h100_elementwise.csv (H100, PyTorch 2.11 eager) at 8192 x 2048..8192, divided by the copy rate.
  double eager_forward_bytes, eager_backward_bytes;
};
[[nodiscard]] const ElementwiseOpInfo& elementwise_op_info(ElementwiseOp op);
[[nodiscard]] const std::array<ElementwiseOpInfo, kElementwiseOpCount>& elementwise_ops();
// The op of that name (ElementwiseOpInfo::name), or null.
[[nodiscard]] const ElementwiseOpInfo* elementwise_op_named(const std::string& name);

// A GEMM dimension that is a whole multiple of 16 bytes of `operand_bytes`-byte elements (what
// cuBLAS's tensor-core kernels need of a leading dimension).
[[nodiscard]] bool gemm_aligned(double dim, double operand_bytes);

// One measured GEMM: C[m,n] = A[m,k] B[k,n] in the table's dtype.
struct GemmSample {
  double m = 0, n = 0, k = 0, seconds = 0;
};
// One measured fused-attention call: `batch` x `heads` of length `seq_len`, head size
// `head_dim`; forward, and backward alone (forward + backward minus forward).
struct AttentionSample {
  double head_dim = 0, seq_len = 0, heads = 0, batch = 0, forward_seconds = 0, backward_seconds = 0;
};
// One measured element-wise op at `elements` elements.
struct ElementwiseSample {
  double elements = 0, forward_seconds = 0, backward_seconds = 0;
};

struct KernelTables {
  std::string source;
  double kernel_latency = 0;        // seconds one kernel takes beyond its work (launch, fill, tail)
  double copy_bandwidth = 0;        // bytes/s of a device-to-device copy, read + write counted
  double adamw_fused_bandwidth = 0; // bytes/s of fused AdamW counting 32 bytes per fp32 parameter; 0 = not measured
  // Peak HBM bandwidth (bytes/s) of the GPU the tables were measured on (`hbm_tb_per_s`, else the
  // profile's own when read). A profile of the same chip with other memory (an H100 with HBM2e at
  // 2.4 TB/s against the table's HBM3 at 3.35) runs the memory-bound samples (copies, element-wise
  // ops, fused AdamW) at its own bandwidth: KernelRates scales them by the ratio. 0: unknown.
  double hbm_bandwidth = 0;
  Dtype gemm_dtype;                 // dtype of the GEMM samples
  Dtype attention_dtype;            // dtype of the attention samples
  std::vector<GemmSample> gemm;     // increasing (m, n, k)
  bool attention_causal = true;     // the attention samples ran with a causal mask
  std::vector<AttentionSample> attention;  // increasing (head_dim, seq_len, heads, batch)
  std::array<std::vector<ElementwiseSample>, kElementwiseOpCount> elementwise;  // by op, increasing elements

  KernelTables();
  // Computes the interpolation data from the samples for a GPU with `sm_count` SMs; call after
  // filling or changing the samples (read_kernel_tables does).
  void prepare(int sm_count);

  // Interpolation data (prepare): per aligned GEMM sample, log m, log n, log k and the ratio of
  // the analytic work time to the measured one; the measured slowdown of unaligned shapes.
  struct Prepared {
    std::uint64_t id = 0;  // unique per prepare(), keys the per-thread GEMM cache
    int sm_count = 0;
    std::vector<std::array<double, 4>> gemm_points;
    double unaligned_factor = 1;
    // Attention: head sizes, and per head size the sequence lengths and the forward and backward
    // rates (FLOP/s, forward FLOPs x 1 and x 2.5) after the kernel latency.
    std::vector<double> attention_head_dims;
    std::vector<std::vector<double>> attention_seqs, attention_forward_rate, attention_backward_rate;
    // Element-wise ops: sizes and seconds per element after the latency of their kernels.
    std::array<std::vector<double>, kElementwiseOpCount> op_elements, op_forward, op_backward;
  };
  Prepared prepared;
};

// Reads `gpu.kernels` (`pointer` is its JSON pointer) for a GPU of `sm_count` SMs: every rate
// finite and > 0, every table's rows in strictly increasing key order, the columns as documented;
// throws detail::DocumentError naming file and pointer. Used by parse_hwprofile.
// `hbm_bandwidth`: the profile's own (bytes/s), taken as the measuring GPU's where the block
// does not state `hbm_tb_per_s`.
[[nodiscard]] std::shared_ptr<const KernelTables> read_kernel_tables(const nlohmann::json& json, const std::string& file,
                                                                     const std::string& pointer, int sm_count, double hbm_bandwidth = 0);
[[nodiscard]] nlohmann::json kernel_tables_to_json(const KernelTables& tables);

// The time of kernels on one GPU for one compute dtype.
class KernelRates {
 public:
  // `gpu` must outlive this object. `attention` picks the fused attention kernel's rates.
  KernelRates(const GpuSpec& gpu, Dtype compute_dtype, AttentionImpl attention = AttentionImpl::kProfile);

  // C[m,n] = A[m,k] B[k,n], `batch` independent products. With a GEMM table: the analytic time
  // (wave quantisation over the SMs, short-k fill, HBM bound) corrected by the measured/analytic
  // ratio of the nearest measured shapes (inverse-distance weights in log m, log n, log k), so
  // measured shapes come out exactly. `aligned`: the operands' leading dimensions are multiples
  // of 16 bytes (for a linear layer, its input and output features; the token count is never a
  // leading dimension); false runs at the table's measured unaligned/aligned ratio (gemm_aligned
  // tells for one dimension). Always + one kernel latency.
  [[nodiscard]] double gemm(double m, double n, double k, double batch = 1, double operand_bytes = 2, bool aligned = true) const;
  // Fused (flash) attention over `batch_heads` heads, `s_q` queries attending `s_k` keys, head
  // size d; `causal` computes half the score blocks when s_q == s_k.
  [[nodiscard]] double attention_forward(double batch_heads, double s_q, double s_k, double d, bool causal) const;
  [[nodiscard]] double attention_backward(double batch_heads, double s_q, double s_k, double d, bool causal) const;
  // A fused streaming kernel moving `bytes` (read + write) at the copy bandwidth, `kernels` launches.
  [[nodiscard]] double stream(double bytes, int kernels = 1) const;
  // An eager element-wise op on `elements` elements of `element_bytes`-byte data (2 for bf16): the
  // measured time interpolated in size (rate per byte between the nearest samples, clamped at the
  // ends), else the op's effective bytes at the copy bandwidth.
  [[nodiscard]] double op(ElementwiseOp op, double elements, bool backward, double element_bytes = 2) const;
  // Fused AdamW over `params` fp32 parameters (32 bytes each), one kernel per `tensors` tensors.
  [[nodiscard]] double adamw_fused(double params, double tensors = 1) const;
  [[nodiscard]] double latency() const { return latency_; }
  [[nodiscard]] double copy_bandwidth() const { return copy_; }
  [[nodiscard]] double peak_flops() const { return peak_; }
  [[nodiscard]] bool measured() const { return tables_ != nullptr; }

 private:
  [[nodiscard]] double gemm_analytic(double m, double n, double k, double batch) const;
  [[nodiscard]] double attention_rate(double s, double d, bool backward) const;

  const GpuSpec& gpu_;
  const KernelTables* tables_ = nullptr;  // owned by gpu_
  double gemm_scale_ = 1, attention_scale_ = 1, memory_scale_ = 1;  // gpu_.calibration
  double hbm_ratio_ = 1;  // the tables' GPU's HBM bandwidth over this GPU's (KernelTables::hbm_bandwidth)
  double peak_ = 0;       // FLOP/s of the compute dtype
  double table_scale_ = 1;  // peak of the compute dtype over the GEMM table's (fp8 runs twice the bf16 table)
  double attention_table_scale_ = 1;  // likewise for the attention table
  double latency_ = 0;
  double copy_ = 0;
  AttentionImpl attention_impl_ = AttentionImpl::kProfile;
  int generation_ = 1;  // gpu_generation(gpu_)
};

// FlashAttention-2's published rate, FLOP/s (the causal convention: half the score blocks of a
// causal kernel), for head size `d` and `seq` queries, forward or backward, on a GPU of
// `generation` (gpu_generation: 1 Ampere, 2 Hopper); nullopt on other GPUs. attention_kernels.cpp
// cites each figure.
[[nodiscard]] std::optional<double> flash2_rate(int generation, double d, double seq, bool causal, bool backward);
// FlashAttention-3's, likewise, in bf16/fp16; nullopt off Hopper (generation 2).
[[nodiscard]] std::optional<double> flash3_rate(int generation, double d, double seq, bool causal, bool backward);

}  // namespace trainplan::costmodel
