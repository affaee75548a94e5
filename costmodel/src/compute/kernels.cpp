#include "trainplan/costmodel/kernels.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "json_reader.hpp"
#include "trainplan/costmodel/hardware.hpp"

namespace trainplan::costmodel {

namespace {

// Effective bytes per element: h100_elementwise.csv seconds x 2580.4 GB/s (the copy rate of the
// same GPU, h100_kernels.csv) / elements, median over the 8192-token rows.
constexpr std::array<ElementwiseOpInfo, kElementwiseOpCount> kOps = {{
    {ElementwiseOp::kRmsNorm, "rmsnorm", 4, 6, 1, 3, 4.9, 13.1},
    {ElementwiseOp::kLayerNorm, "layernorm", 4, 6, 1, 3, 4.9, 13.1},  // no H100 sample: as RMSNorm (one fused ATen kernel each way)
    {ElementwiseOp::kResidualAdd, "residual_add", 6, 6, 1, 1, 5.3, 5.3},
    {ElementwiseOp::kCast, "cast_bf16_fp32", 6, 6, 1, 1, 8.1, 5.2},
    {ElementwiseOp::kSwiglu, "swiglu", 6, 10, 2, 4, 8.5, 15.3},
    {ElementwiseOp::kGelu, "gelu", 4, 6, 1, 1, 3.5, 5.1},
    {ElementwiseOp::kDropout, "dropout", 4, 6, 1, 1, 5.2, 4.3},
    {ElementwiseOp::kRotaryEager, "rotary_eager", 4, 4, 5, 5, 31.2, 38.6},
    {ElementwiseOp::kCrossEntropyFp32, "cross_entropy_fp32", 2, 10, 3, 3, 21.2, 22.3},
    {ElementwiseOp::kCrossEntropyBf16, "cross_entropy_bf16", 2, 4, 2, 2, 6.1, 8.5},
    {ElementwiseOp::kEmbedding, "embedding", 4, 4, 1, 3, 3.9, 55.0},
    // transformers' LlamaRMSNorm (models/llama/modeling_llama.py, the same from 4.40 to 5.x), bf16 in
    // and out, no measured row: the bytes its ATen ops move, counted. Forward, 8 kernels: the fp32
    // copy (reads 2, writes 4), pow (4 + 4), mean (4), + eps and rsqrt (a value per token), the
    // multiply (4 + 4), the cast back (4 + 2), the weight's multiply (2 + 2): 36. Backward, 15: the
    // weight's MulBackward (the input's gradient 2 + 2; the weight's, a product 2 + 2 + 2 and its sum
    // over tokens 2: 3 kernels), the cast's (2 + 4), the multiply's (the input's 4 + 4; the
    // statistic's, a product 4 + 4 + 4 and a sum 4: 3), rsqrt's and the mean's per token (2, no
    // bytes to speak of), the mean's expand (4), pow's (ATen's pow_backward: grad * (2 * x.pow(1)),
    // x.pow(1) a copy 4 + 4, the scale 4 + 4, the product 4 + 4 + 4: 3), the two gradients of the
    // fp32 copy added (4 + 4 + 4), the copy's cast back (4 + 2): 92.
    {ElementwiseOp::kRmsNormUnfused, "rmsnorm_unfused", 4, 6, 8, 15, 36.0, 92.0},
}};

std::atomic<std::uint64_t> next_tables_id{1};

Dtype dtype_from(const std::string& s) {
  if (s == "fp32") return Dtype::kFp32;
  if (s == "fp16") return Dtype::kFp16;
  if (s == "fp8") return Dtype::kFp8;
  return Dtype::kBf16;
}

// Linear interpolation of y over log x between the samples bracketing x, clamped at the ends.
// REQUIRES: xs increasing, same size as ys, not empty.
double interpolate_log(const std::vector<double>& xs, const std::vector<double>& ys, double x) {
  if (x <= xs.front()) return ys.front();
  if (x >= xs.back()) return ys.back();
  const auto hi = static_cast<std::size_t>(std::upper_bound(xs.begin(), xs.end(), x) - xs.begin());
  const std::size_t lo = hi - 1;
  const double f = std::log(x / xs[lo]) / std::log(xs[hi] / xs[lo]);
  return ys[lo] + f * (ys[hi] - ys[lo]);
}

bool aligned_dim(double dim, double operand_bytes) {
  const auto elements = static_cast<long long>(std::max(1.0, 16.0 / operand_bytes));  // 16-byte rows for tensor-core kernels
  const auto whole = static_cast<long long>(dim);
  return static_cast<double>(whole) == dim && whole % elements == 0;
}

}  // namespace

const std::array<ElementwiseOpInfo, kElementwiseOpCount>& elementwise_ops() { return kOps; }

const ElementwiseOpInfo* elementwise_op_named(const std::string& name) {
  for (const auto& info : kOps) {
    if (name == info.name) return &info;
  }
  return nullptr;
}
const ElementwiseOpInfo& elementwise_op_info(ElementwiseOp op) { return kOps[static_cast<std::size_t>(op)]; }
bool gemm_aligned(double dim, double operand_bytes) { return aligned_dim(dim, operand_bytes); }

KernelTables::KernelTables() : gemm_dtype(Dtype::kBf16), attention_dtype(Dtype::kBf16) {}

namespace {

// Work time of a GEMM before the table's correction, in arbitrary units: FLOPs over the share of
// the SMs its output tiles keep busy (128 x 128 tiles, whole waves) and the pipeline fill of a
// short k. The correction (measured over this) carries the GPU's real rate.
double gemm_shape_work(double m, double n, double k, double batch, int sm_count) {
  constexpr double kTile = 128.0;
  constexpr double kFill = 64.0;  // k at which pipeline fill costs half the efficiency
  const double tiles = std::ceil(m / kTile) * std::ceil(n / kTile) * batch;
  const double sms = std::max(1, sm_count);
  const double waves = std::ceil(tiles / sms);
  const double wave_efficiency = tiles / (waves * sms);
  return 2.0 * m * n * k * batch / (wave_efficiency * k / (k + kFill)) * 1e-15;
}

// Inverse-distance interpolation of the correction over the 4 nearest samples in log space.
double gemm_correction(const KernelTables::Prepared& p, double m, double n, double k) {
  const double x[3] = {std::log2(m), std::log2(n), std::log2(k)};
  constexpr int kNearest = 4;
  double best_d[kNearest];
  double best_c[kNearest];
  int count = 0;
  for (const auto& g : p.gemm_points) {
    const double d = (x[0] - g[0]) * (x[0] - g[0]) + (x[1] - g[1]) * (x[1] - g[1]) + (x[2] - g[2]) * (x[2] - g[2]);
    if (d < 1e-18) return g[3];
    int pos = count < kNearest ? count++ : kNearest;
    while (pos > 0 && best_d[pos - 1] > d) {
      if (pos < kNearest) {
        best_d[pos] = best_d[pos - 1];
        best_c[pos] = best_c[pos - 1];
      }
      --pos;
    }
    if (pos < kNearest) {
      best_d[pos] = d;
      best_c[pos] = g[3];
    }
  }
  double wsum = 0, csum = 0;
  for (int i = 0; i < count; ++i) {
    const double w = 1.0 / best_d[i];
    wsum += w;
    csum += w * best_c[i];
  }
  return wsum > 0 ? csum / wsum : 1.0;
}

// Per-thread memo of corrections: the planner's search asks for the same few hundred shapes
// thousands of times.
struct GemmKey {
  std::uint64_t id;
  double m, n, k;
  bool operator==(const GemmKey& o) const { return id == o.id && m == o.m && n == o.n && k == o.k; }
};
struct GemmKeyHash {
  std::size_t operator()(const GemmKey& key) const {
    std::size_t h = std::hash<std::uint64_t>()(key.id);
    for (double v : {key.m, key.n, key.k}) h = h * 1000003u ^ std::hash<double>()(v);
    return h;
  }
};

double cached_correction(const KernelTables::Prepared& p, double m, double n, double k) {
  thread_local std::unordered_map<GemmKey, double, GemmKeyHash> cache;
  if (cache.size() > 200000) cache.clear();
  const GemmKey key{p.id, m, n, k};
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const double c = gemm_correction(p, m, n, k);
  cache.emplace(key, c);
  return c;
}

}  // namespace

void KernelTables::prepare(int sm_count) {
  prepared = Prepared{};
  prepared.id = next_tables_id++;
  prepared.sm_count = sm_count;
  const double operand = dtype_bytes(gemm_dtype);
  std::vector<const GemmSample*> unaligned;
  for (const GemmSample& g : gemm) {
    if (!(aligned_dim(g.m, operand) && aligned_dim(g.n, operand) && aligned_dim(g.k, operand))) {
      unaligned.push_back(&g);
      continue;
    }
    const double work = std::max(g.seconds - kernel_latency, 0.25 * g.seconds);
    prepared.gemm_points.push_back({std::log2(g.m), std::log2(g.n), std::log2(g.k), gemm_shape_work(g.m, g.n, g.k, 1, sm_count) / work});
  }
  // Attention rates per head size and sequence length (samples of one shape averaged).
  for (std::size_t i = 0; i < attention.size();) {
    const double hd = attention[i].head_dim;
    if (prepared.attention_head_dims.empty() || prepared.attention_head_dims.back() != hd) {
      prepared.attention_head_dims.push_back(hd);
      prepared.attention_seqs.emplace_back();
      prepared.attention_forward_rate.emplace_back();
      prepared.attention_backward_rate.emplace_back();
    }
    const double seq = attention[i].seq_len;
    double forward = 0, backward = 0;
    int count = 0;
    for (; i < attention.size() && attention[i].head_dim == hd && attention[i].seq_len == seq; ++i) {
      const AttentionSample& a = attention[i];
      const double flops = 4.0 * a.batch * a.heads * a.seq_len * a.seq_len * a.head_dim * (attention_causal ? 0.5 : 1.0);
      forward += flops / std::max(a.forward_seconds - kernel_latency, 0.25 * a.forward_seconds);
      backward += 2.5 * flops / std::max(a.backward_seconds - kernel_latency, 0.25 * a.backward_seconds);
      ++count;
    }
    prepared.attention_seqs.back().push_back(seq);
    prepared.attention_forward_rate.back().push_back(forward / count);
    prepared.attention_backward_rate.back().push_back(backward / count);
  }
  for (const ElementwiseOpInfo& info : kOps) {
    const auto index = static_cast<std::size_t>(info.op);
    for (const ElementwiseSample& e : elementwise[index]) {
      prepared.op_elements[index].push_back(e.elements);
      prepared.op_forward[index].push_back(std::max(e.forward_seconds - info.forward_kernels * kernel_latency, 0.25 * e.forward_seconds) / e.elements);
      prepared.op_backward[index].push_back(std::max(e.backward_seconds - info.backward_kernels * kernel_latency, 0.25 * e.backward_seconds) / e.elements);
    }
  }
  if (prepared.gemm_points.empty() || unaligned.empty()) return;
  double log_sum = 0;
  for (const GemmSample* g : unaligned) {
    const double predicted = kernel_latency + gemm_shape_work(g->m, g->n, g->k, 1, sm_count) / gemm_correction(prepared, g->m, g->n, g->k);
    log_sum += std::log(g->seconds / predicted);
  }
  prepared.unaligned_factor = std::max(1.0, std::exp(log_sum / static_cast<double>(unaligned.size())));
}

std::shared_ptr<const KernelTables> read_kernel_tables(const nlohmann::json& json, const std::string& file, const std::string& pointer,
                                                       int sm_count, double hbm_bandwidth) {
  detail::ObjectReader r(json, file, pointer);
  auto t = std::make_shared<KernelTables>();
  t->source = r.string("source");
  t->kernel_latency = r.number("kernel_latency_us", 0, 1e4) * 1e-6;
  t->copy_bandwidth = r.number("copy_gb_per_s", 0, 1e6, true) * 1e9;
  t->adamw_fused_bandwidth = r.optional_number("adamw_fused_gb_per_s", 0, 1e6, true).value_or(0.0) * 1e9;
  t->hbm_bandwidth = hbm_bandwidth;
  if (const auto stated = r.optional_number("hbm_tb_per_s", 0, 1e3, true)) {
    t->hbm_bandwidth = *stated * 1e12;
    // A table measured on the same chip with other memory: within a factor of 10 of the profile's.
    if (hbm_bandwidth > 0 && (t->hbm_bandwidth > 10.0 * hbm_bandwidth || t->hbm_bandwidth < 0.1 * hbm_bandwidth)) {
      char profile[32];
      std::snprintf(profile, sizeof profile, "%g", hbm_bandwidth / 1e12);
      r.fail("hbm_tb_per_s", std::string("must be within a factor of 10 of the profile's hbm_bandwidth_tb_per_s (") + profile +
                                 "): the tables are of this chip, measured with its own or similar memory");
    }
  }
  {
    detail::ObjectReader g = r.object("gemm");
    t->gemm_dtype = dtype_from(g.one_of("dtype", {"fp32", "bf16", "fp16", "fp8"}));
    detail::expect_columns(g, {"m", "n", "k", "seconds"});
    for (const auto& row : detail::read_number_rows(g, "rows", 4, 3, "m, n, k")) t->gemm.push_back({row[0], row[1], row[2], row[3]});
    g.finish();
  }
  {
    detail::ObjectReader a = r.object("attention");
    t->attention_dtype = dtype_from(a.one_of("dtype", {"fp32", "bf16", "fp16", "fp8"}));
    t->attention_causal = a.boolean("causal");
    detail::expect_columns(a, {"head_dim", "seq_len", "heads", "batch", "forward_seconds", "backward_seconds"});
    for (const auto& row : detail::read_number_rows(a, "rows", 6, 4, "head_dim, seq_len, heads, batch")) {
      t->attention.push_back({row[0], row[1], row[2], row[3], row[4], row[5]});
    }
    a.finish();
  }
  if (r.has("elementwise")) {
    detail::ObjectReader e = r.object("elementwise");
    detail::expect_columns(e, {"elements", "forward_seconds", "backward_seconds"});
    detail::ObjectReader ops = e.object("ops");
    for (const ElementwiseOpInfo& info : kOps) {
      if (!ops.has(info.name)) continue;
      for (const auto& row : detail::read_number_rows(ops, info.name, 3, 1, "elements")) {
        t->elementwise[static_cast<std::size_t>(info.op)].push_back({row[0], row[1], row[2]});
      }
    }
    ops.finish();
    e.finish();
  }
  r.finish();
  t->prepare(sm_count);
  return t;
}

nlohmann::json kernel_tables_to_json(const KernelTables& t) {
  nlohmann::json gemm_rows = nlohmann::json::array();
  for (const auto& g : t.gemm) gemm_rows.push_back({g.m, g.n, g.k, g.seconds});
  nlohmann::json attention_rows = nlohmann::json::array();
  for (const auto& a : t.attention) attention_rows.push_back({a.head_dim, a.seq_len, a.heads, a.batch, a.forward_seconds, a.backward_seconds});
  nlohmann::json ops = nlohmann::json::object();
  for (const ElementwiseOpInfo& info : kOps) {
    const auto& rows = t.elementwise[static_cast<std::size_t>(info.op)];
    if (rows.empty()) continue;
    nlohmann::json list = nlohmann::json::array();
    for (const auto& s : rows) list.push_back({s.elements, s.forward_seconds, s.backward_seconds});
    ops[info.name] = list;
  }
  nlohmann::json j = {
      {"source", t.source},
      {"kernel_latency_us", std::round(t.kernel_latency * 1e10) / 1e4},
      {"copy_gb_per_s", t.copy_bandwidth / 1e9},
      {"gemm", {{"dtype", dtype_name(t.gemm_dtype)}, {"columns", {"m", "n", "k", "seconds"}}, {"rows", gemm_rows}}},
      {"attention",
       {{"dtype", dtype_name(t.attention_dtype)},
        {"causal", t.attention_causal},
        {"columns", {"head_dim", "seq_len", "heads", "batch", "forward_seconds", "backward_seconds"}},
        {"rows", attention_rows}}},
  };
  if (t.adamw_fused_bandwidth > 0) j["adamw_fused_gb_per_s"] = t.adamw_fused_bandwidth / 1e9;
  if (t.hbm_bandwidth > 0) j["hbm_tb_per_s"] = t.hbm_bandwidth / 1e12;
  if (!ops.empty()) j["elementwise"] = {{"columns", {"elements", "forward_seconds", "backward_seconds"}}, {"ops", ops}};
  return j;
}

KernelRates::KernelRates(const GpuSpec& gpu, Dtype compute_dtype, AttentionImpl attention)
    : gpu_(gpu), tables_(gpu.kernels.get()), peak_(gpu.peak_for(compute_dtype).value()), attention_impl_(attention), generation_(gpu_generation(gpu)) {
  if (tables_ != nullptr) {
    const double table_peak = gpu.peak_for(tables_->gemm_dtype).value();
    table_scale_ = table_peak > 0 && peak_ > 0 ? peak_ / table_peak : 1.0;
    const double attention_peak = gpu.peak_for(tables_->attention_dtype).value();
    attention_table_scale_ = attention_peak > 0 && peak_ > 0 ? peak_ / attention_peak : 1.0;
    latency_ = tables_->kernel_latency;
    // Memory-bound samples measured on a GPU with other HBM run at this GPU's bandwidth.
    if (tables_->hbm_bandwidth > 0 && gpu.hbm_bandwidth.value() > 0) hbm_ratio_ = tables_->hbm_bandwidth / gpu.hbm_bandwidth.value();
    copy_ = tables_->copy_bandwidth / hbm_ratio_;
  } else {
    latency_ = gpu.min_kernel_time.value();
    copy_ = gpu.hbm_bandwidth.value() * gpu.memory_efficiency;
  }
  // Calibration (planner calibrate): the work of each kernel class and the latency, scaled.
  gemm_scale_ = gpu.calibration.gemm_time_scale;
  attention_scale_ = gpu.calibration.attention_time_scale;
  memory_scale_ = gpu.calibration.memory_time_scale;
  latency_ *= gpu.calibration.latency_scale;
  copy_ /= memory_scale_;
}

// Without a table there is no measured penalty for unaligned shapes.
double KernelRates::gemm_analytic(double m, double n, double k, double batch) const {
  const double flops_over_shape = gemm_shape_work(m, n, k, batch, gpu_.sm_count) * 1e15;  // FLOPs over the shape's efficiency
  return flops_over_shape / (peak_ * gpu_.gemm_efficiency);
}

double KernelRates::gemm(double m, double n, double k, double batch, double operand_bytes, bool aligned) const {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0 || peak_ <= 0) return 0.0;
  const double bytes = batch * ((m * k + k * n) * operand_bytes + m * n * 2.0);
  double work;
  if (tables_ != nullptr && !tables_->prepared.gemm_points.empty()) {
    const auto& p = tables_->prepared;
    // The batch's tiles share the waves; the correction is the one of a single product's shape.
    work = gemm_shape_work(m, n, k, batch, p.sm_count) / cached_correction(p, m, n, k) / table_scale_;
    if (!aligned) work *= p.unaligned_factor;
  } else {
    work = gemm_analytic(m, n, k, batch);
  }
  return latency_ + std::max(work * gemm_scale_, bytes / copy_);
}

double KernelRates::attention_rate(double s, double d, bool backward) const {
  // Per head size interpolated in log seq_len, then between the two head sizes around d in log d
  // (clamped at the ends).
  const auto& p = tables_->prepared;
  const auto& dims = p.attention_head_dims;
  const auto rate_at = [&](std::size_t i) {
    return interpolate_log(p.attention_seqs[i], backward ? p.attention_backward_rate[i] : p.attention_forward_rate[i], s);
  };
  double rate;
  if (d <= dims.front()) {
    rate = rate_at(0);
  } else if (d >= dims.back()) {
    rate = rate_at(dims.size() - 1);
  } else {
    const auto hi = static_cast<std::size_t>(std::upper_bound(dims.begin(), dims.end(), d) - dims.begin());
    const double f = std::log(d / dims[hi - 1]) / std::log(dims[hi] / dims[hi - 1]);
    rate = rate_at(hi - 1) + f * (rate_at(hi) - rate_at(hi - 1));
  }
  return rate * attention_table_scale_;
}

double KernelRates::attention_forward(double batch_heads, double s_q, double s_k, double d, bool causal) const {
  if (batch_heads <= 0 || s_q <= 0 || s_k <= 0) return 0.0;
  const double flops = 4.0 * batch_heads * s_q * s_k * d * (causal ? 0.5 : 1.0);
  if (attention_impl_ == AttentionImpl::kFlash2) {
    if (const auto rate = flash2_rate(generation_, d, s_q, causal, false)) return latency_ + attention_scale_ * flops / *rate;
  }
  if (attention_impl_ == AttentionImpl::kFlash3) {
    if (const auto rate = flash3_rate(generation_, d, s_q, causal, false)) return latency_ + attention_scale_ * flops / *rate;
  }
  if (tables_ != nullptr && !tables_->prepared.attention_head_dims.empty()) return latency_ + attention_scale_ * flops / attention_rate(s_q, d, false);
  return latency_ + attention_scale_ * flops / (peak_ * gpu_.attention_efficiency);
}

double KernelRates::attention_backward(double batch_heads, double s_q, double s_k, double d, bool causal) const {
  if (batch_heads <= 0 || s_q <= 0 || s_k <= 0) return 0.0;
  const double flops = 2.5 * 4.0 * batch_heads * s_q * s_k * d * (causal ? 0.5 : 1.0);
  if (attention_impl_ == AttentionImpl::kFlash2) {
    if (const auto rate = flash2_rate(generation_, d, s_q, causal, true)) return latency_ + attention_scale_ * flops / *rate;
  }
  if (attention_impl_ == AttentionImpl::kFlash3) {
    if (const auto rate = flash3_rate(generation_, d, s_q, causal, true)) return latency_ + attention_scale_ * flops / *rate;
  }
  if (tables_ != nullptr && !tables_->prepared.attention_head_dims.empty()) return latency_ + attention_scale_ * flops / attention_rate(s_q, d, true);
  return latency_ + attention_scale_ * flops / (peak_ * gpu_.attention_efficiency * 0.8);
}

double KernelRates::stream(double bytes, int kernels) const {
  if (bytes <= 0) return 0.0;
  return kernels * latency_ + bytes / copy_;
}

double KernelRates::op(ElementwiseOp op, double elements, bool backward, double element_bytes) const {
  if (elements <= 0) return 0.0;
  const ElementwiseOpInfo& info = elementwise_op_info(op);
  const int kernels = backward ? info.backward_kernels : info.forward_kernels;
  const double width = element_bytes / 2.0;  // the tables and effective bytes are for bf16 data
  if (tables_ != nullptr) {
    const auto index = static_cast<std::size_t>(op);
    const auto& xs = tables_->prepared.op_elements[index];
    if (!xs.empty()) {
      const auto& per_element = backward ? tables_->prepared.op_backward[index] : tables_->prepared.op_forward[index];
      return kernels * latency_ + memory_scale_ * hbm_ratio_ * elements * width * interpolate_log(xs, per_element, elements);
    }
  }
  return kernels * latency_ + elements * width * (backward ? info.eager_backward_bytes : info.eager_forward_bytes) / copy_;
}

double KernelRates::adamw_fused(double params, double tensors) const {
  if (params <= 0) return 0.0;
  const double bandwidth =
      tables_ != nullptr && tables_->adamw_fused_bandwidth > 0 ? tables_->adamw_fused_bandwidth / (memory_scale_ * hbm_ratio_) : copy_;
  return tensors * latency_ + 32.0 * params / bandwidth;
}

}  // namespace trainplan::costmodel
