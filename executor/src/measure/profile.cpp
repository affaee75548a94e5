// The executor's microbenchmarks (see profile.hpp).

#include "profile.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include "gpu.hpp"
#include "trainplan/costmodel/statistics.hpp"

namespace trainplan::executor {

namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;
constexpr int64_t kGiB = 1024 * kMiB;

using costmodel::median;  // costmodel/statistics.hpp

std::string size_text(int64_t bytes) {
  char text[32];
  if (bytes >= kGiB) std::snprintf(text, sizeof text, "%g GiB", static_cast<double>(bytes) / kGiB);
  else if (bytes >= kMiB) std::snprintf(text, sizeof text, "%g MiB", static_cast<double>(bytes) / kMiB);
  else std::snprintf(text, sizeof text, "%g KiB", static_cast<double>(bytes) / kKiB);
  return text;
}

// Seconds per call of `fn`: CUDA events around `repeats` calls on a GPU (their mean), else each
// call timed on the host clock (the median), after `warmup` untimed calls. On a CPU short calls
// repeat until 50 ms have been timed (at most 200 calls), so that a few calls stalled by the
// scheduler on shared cores do not move the median.
class Timer {
 public:
  Timer(at::Device device, int warmup, int repeats) : device_(device), warmup_(warmup), repeats_(std::max(1, repeats)) {}

  [[nodiscard]] double seconds(const std::function<void()>& fn) const {
    for (int i = 0; i < warmup_; ++i) fn();
    if (device_.is_cuda()) {
      cuda_synchronize();
      CudaInterval interval;
      interval.start();
      for (int i = 0; i < repeats_; ++i) fn();
      interval.stop();
      return interval.seconds() / repeats_;
    }
    constexpr double kMinTimedSeconds = 0.05;
    constexpr std::size_t kMaxCalls = 200;
    std::vector<double> times;
    double timed = 0;
    while (times.size() < static_cast<std::size_t>(repeats_) || (timed < kMinTimedSeconds && times.size() < kMaxCalls)) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      timed += times.back();
    }
    return median(times);
  }

 private:
  at::Device device_;
  int warmup_, repeats_;
};

at::TensorOptions bf16_on(at::Device device) { return at::TensorOptions().dtype(at::kBFloat16).device(device); }

at::Tensor leaf(at::IntArrayRef sizes, at::Device device) { return at::randn(sizes, bf16_on(device)).requires_grad_(true); }

// Forward (with autograd recording, as training runs it) and backward seconds of `op`: backward
// = (forward + gradients of every input that requires them) - forward, at least 1 ns, as
// h100_elementwise.py computes it.
std::pair<double, double> forward_backward(const Timer& timer, const std::vector<at::Tensor>& inputs, const std::function<at::Tensor()>& op) {
  const double forward = timer.seconds([&] { (void)op(); });
  const at::Tensor gradient = at::ones_like(op());
  std::vector<at::Tensor> wrt;
  for (const at::Tensor& t : inputs) {
    if (t.requires_grad()) wrt.push_back(t);
  }
  const double both = timer.seconds([&] { (void)torch::autograd::grad({op()}, wrt, {gradient}); });
  return {forward, std::max(both - forward, 1e-9)};
}

// Appends the tasks of one element-wise op measured on `inputs` (made when the task runs).
void add_elementwise(std::vector<BenchmarkTask>& tasks, KernelMeasurements& out, const Timer& timer, const std::string& op, int64_t tokens,
                     int64_t width, const std::string& shape, std::function<std::vector<at::Tensor>()> make,
                     std::function<at::Tensor(const std::vector<at::Tensor>&)> apply) {
  const std::string label = op + " " + std::to_string(tokens) + "x" + (shape.empty() ? std::to_string(width) : shape);
  tasks.push_back({label, [=, &out] {
                     const std::vector<at::Tensor> inputs = make();
                     const auto [forward, backward] = forward_backward(timer, inputs, [&] { return apply(inputs); });
                     out.samples.elementwise.push_back(
                         {op, static_cast<double>(tokens), static_cast<double>(width), shape, forward, backward});
                   }});
}

void add_elementwise_tasks(const ProfileSweep& sweep, at::Device device, const Timer& timer, KernelMeasurements& out,
                           std::vector<BenchmarkTask>& tasks) {
  const auto bf16 = bf16_on(device);
  for (const int64_t tokens : sweep.tokens) {
    for (const auto& hidden_ffn : sweep.hidden_ffn) {
      const int64_t h = hidden_ffn.first, ffn = hidden_ffn.second;
      const auto x = [=] { return std::vector<at::Tensor>{leaf({tokens, h}, device)}; };
      const auto wide = [=] { return std::vector<at::Tensor>{leaf({tokens, ffn}, device)}; };
      add_elementwise(tasks, out, timer, "rmsnorm", tokens, h, "",
                      [=] { return std::vector<at::Tensor>{leaf({tokens, h}, device), at::ones({h}, bf16).requires_grad_(true)}; },
                      [=](const std::vector<at::Tensor>& in) { return at::rms_norm(in[0], {h}, in[1], 1e-5); });
      // transformers' LlamaRMSNorm op by op (models/llama/modeling_llama.py), the stacks' Hugging Face norm.
      add_elementwise(tasks, out, timer, "rmsnorm_unfused", tokens, h, "",
                      [=] { return std::vector<at::Tensor>{leaf({tokens, h}, device), at::ones({h}, bf16).requires_grad_(true)}; },
                      [](const std::vector<at::Tensor>& in) {
                        const at::Tensor x = in[0].to(at::kFloat);
                        const at::Tensor normed = x * at::rsqrt(x.pow(2).mean({-1}, true) + 1e-5);
                        return in[1] * normed.to(in[0].scalar_type());
                      });
      add_elementwise(tasks, out, timer, "layernorm", tokens, h, "",
                      [=] {
                        return std::vector<at::Tensor>{leaf({tokens, h}, device), at::ones({h}, bf16).requires_grad_(true),
                                                       at::zeros({h}, bf16).requires_grad_(true)};
                      },
                      [=](const std::vector<at::Tensor>& in) { return at::layer_norm(in[0], {h}, in[1], in[2], 1e-5); });
      add_elementwise(tasks, out, timer, "residual_add", tokens, h, "",
                      [=] { return std::vector<at::Tensor>{leaf({tokens, h}, device), leaf({tokens, h}, device)}; },
                      [](const std::vector<at::Tensor>& in) { return in[0] + in[1]; });
      add_elementwise(tasks, out, timer, "cast_bf16_fp32", tokens, h, "", x,
                      [](const std::vector<at::Tensor>& in) { return in[0].to(at::kFloat); });
      add_elementwise(tasks, out, timer, "swiglu", tokens, ffn, "",
                      [=] { return std::vector<at::Tensor>{leaf({tokens, ffn}, device), leaf({tokens, ffn}, device)}; },
                      [](const std::vector<at::Tensor>& in) { return at::silu(in[0]) * in[1]; });
      add_elementwise(tasks, out, timer, "gelu", tokens, ffn, "", wide, [](const std::vector<at::Tensor>& in) { return at::gelu(in[0], "tanh"); });
      add_elementwise(tasks, out, timer, "dropout", tokens, ffn, "", wide,
                      [](const std::vector<at::Tensor>& in) { return at::dropout(in[0], 0.1, true); });
      // Rotary the eager way (x * cos + rotate_half(x) * sin), head size 128 as in the scripts.
      const int64_t d = std::min<int64_t>(128, h);
      const int64_t heads = h / d;
      add_elementwise(tasks, out, timer, "rotary_eager", tokens, h, "",
                      [=] {
                        return std::vector<at::Tensor>{leaf({tokens, heads, d}, device), at::randn({tokens, 1, d}, bf16),
                                                       at::randn({tokens, 1, d}, bf16)};
                      },
                      [=](const std::vector<at::Tensor>& in) {
                        const at::Tensor& q = in[0];
                        const int64_t half = d / 2;
                        return q * in[1] + at::cat({-q.slice(-1, half), q.slice(-1, 0, half)}, -1) * in[2];
                      });
    }
    for (const int64_t vocab : sweep.vocab) {
      const auto logits = [=] {
        return std::vector<at::Tensor>{leaf({tokens, vocab}, device),
                                       at::randint(vocab, {tokens}, at::TensorOptions().dtype(at::kLong).device(device))};
      };
      add_elementwise(tasks, out, timer, "cross_entropy_fp32", tokens, vocab, "", logits,
                      [](const std::vector<at::Tensor>& in) { return at::cross_entropy_loss(in[0].to(at::kFloat), in[1]); });
      add_elementwise(tasks, out, timer, "cross_entropy_bf16", tokens, vocab, "", logits,
                      [](const std::vector<at::Tensor>& in) { return at::cross_entropy_loss(in[0], in[1]); });
    }
    for (const auto& rows_hidden : sweep.embedding) {
      const int64_t rows = rows_hidden.first, h = rows_hidden.second;
      add_elementwise(tasks, out, timer, "embedding", tokens, h, std::to_string(rows) + "x" + std::to_string(h),
                      [=] {
                        return std::vector<at::Tensor>{leaf({rows, h}, device),
                                                       at::randint(rows, {tokens}, at::TensorOptions().dtype(at::kLong).device(device))};
                      },
                      [](const std::vector<at::Tensor>& in) { return at::embedding(in[0], in[1]); });
    }
  }
}

// One AdamW step over one fp32 tensor of `n` parameters: at::_fused_adamw_ where the device has
// it (CUDA; CPU since PyTorch 2.4), else the ATen ops torch.optim.AdamW's single-tensor path runs.
// Returns which ran.
std::string adamw_step(at::Tensor& p, at::Tensor& g, at::Tensor& m, at::Tensor& v, at::Tensor& step, bool try_fused) {
  constexpr double lr = 1e-4, beta1 = 0.9, beta2 = 0.999, weight_decay = 0.01, eps = 1e-8;
  if (try_fused) {
    try {
      at::_fused_adamw_({p}, {g}, {m}, {v}, {}, {step}, lr, beta1, beta2, weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false);
      return "at::_fused_adamw_";
    } catch (const c10::Error&) {
      // no fused kernel for this device: fall through
    }
  }
  const double t = 10;  // bias corrections of step 10
  p.mul_(1 - lr * weight_decay);
  m.lerp_(g, 1 - beta1);
  v.mul_(beta2).addcmul_(g, g, 1 - beta2);
  const at::Tensor denom = (v.sqrt() / std::sqrt(1 - std::pow(beta2, t))).add_(eps);
  p.addcdiv_(m, denom, -lr / (1 - std::pow(beta1, t)));
  return "unfused ATen ops (mul_, lerp_, addcmul_, sqrt, addcdiv_)";
}

}  // namespace

ProfileSweep profile_sweep(bool cuda, bool quick) {
  ProfileSweep s;
  std::vector<std::pair<int64_t, int64_t>> gemm_hidden_ffn;
  std::vector<int64_t> tps, gemm_tokens, logits_hidden, logits_vocab, attention_seq, head_dims, heads;
  int64_t logits_tokens = 0, attention_tokens = 0;
  if (cuda) {  // h100_kernels.py and h100_elementwise.py
    gemm_hidden_ffn = {{2048, 8192}, {4096, 14336}, {5120, 13824}, {8192, 28672}, {12288, 49152}, {16384, 53248}};
    tps = {1, 2, 4, 8};
    gemm_tokens = {4096, 8192, 16384};
    logits_tokens = 8192;
    logits_hidden = {2048, 4096, 8192};
    logits_vocab = {32000, 50257, 128256};
    attention_seq = {2048, 4096, 8192};
    head_dims = {64, 128};
    heads = {16, 32};
    attention_tokens = 16384;
    s.tokens = {8192, 16384};
    s.hidden_ffn = {{2048, 8192}, {4096, 14336}, {8192, 28672}};
    s.vocab = {32000, 50257, 128256, 151936};
    s.embedding = {{128256, 2048}, {128256, 4096}, {32000, 4096}};
    s.adamw_params = {100'000'000, 500'000'000, 1'200'000'000};
    s.copy_bytes = kGiB;
    for (int64_t b = 64 * kKiB; b <= kGiB; b *= 4) s.collective_bytes.push_back(b);
    s.warmup = 5;
    s.repeats = 20;
    s.collective_warmup = 5;
    s.collective_repeats = 20;
    if (quick) {
      gemm_hidden_ffn = {{2048, 8192}, {4096, 14336}, {8192, 28672}};
      tps = {1, 8};
      gemm_tokens = {8192};
      logits_hidden = {4096};
      logits_vocab = {32000, 50257};
      attention_seq = {2048, 4096};
      heads = {16};
      s.hidden_ffn = {{2048, 8192}};
      s.vocab = {32000, 50257};
      s.embedding = {{32000, 4096}};
      s.adamw_params = {100'000'000};
      s.copy_bytes = 256 * kMiB;
      s.collective_bytes = {64 * kKiB, 256 * kKiB, kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB};
      s.repeats = 10;
      s.collective_repeats = 10;
    }
  } else {  // the same kinds of shapes, scaled down for a few CPU cores
    gemm_hidden_ffn = {{256, 1024}, {512, 2048}, {1024, 4096}};
    tps = {1, 2, 4};
    gemm_tokens = {256, 512};
    logits_tokens = 256;
    logits_hidden = {256, 512};
    logits_vocab = {8000, 32000, 50257};
    s.gemm_fp32 = {{512, 2048, 512}, {1024, 1024, 1024}};
    attention_seq = {256, 512, 1024};
    head_dims = {64, 128};
    heads = {4};
    attention_tokens = 1024;
    s.tokens = {256, 512};
    s.hidden_ffn = {{256, 1024}, {512, 2048}};
    s.vocab = {8000, 32000};
    s.embedding = {{32000, 256}, {8000, 512}};
    s.adamw_params = {1 << 22, 1 << 24};  // beyond the caches: 16 bytes of state per parameter
    s.copy_bytes = 64 * kMiB;
    for (int64_t b = 4 * kKiB; b <= 16 * kMiB; b *= 4) s.collective_bytes.push_back(b);
    s.warmup = 1;
    s.repeats = 5;
    s.collective_warmup = 2;
    s.collective_repeats = 9;
    if (quick) {
      gemm_hidden_ffn = {{256, 1024}};
      tps = {1, 4};
      gemm_tokens = {256};
      logits_hidden = {256};
      logits_vocab = {8000, 50257};
      s.gemm_fp32 = {{512, 512, 512}};
      // Short sequences too: CPU runs train small models at short ones (`planner tune` on CPU ranks).
      attention_seq = {64, 256, 512};
      head_dims = {64};
      s.hidden_ffn = {{256, 1024}};
      s.vocab = {8000};
      s.embedding = {{8000, 256}};
      s.adamw_params = {1 << 22};
      s.copy_bytes = 16 * kMiB;
      // Up to 16 MiB, as the full sweep: the gradients of the models a CPU run trains reach it, and
      // MPI's all-reduce changes algorithm above 1 MiB (4 ranks on 2 cores: 0.30 GB/s bus at 1 MiB,
      // where the run's 14 MB all-reduce goes at the reduce-scatter's and all-gather's pace).
      s.collective_bytes = {4 * kKiB, 16 * kKiB, 64 * kKiB, 256 * kKiB, kMiB, 4 * kMiB, 16 * kMiB};
      s.repeats = 3;
      s.collective_repeats = 5;
    }
  }
  for (const auto& [h, ffn] : gemm_hidden_ffn) {
    for (const int64_t tp : tps) {
      for (const int64_t tokens : gemm_tokens) {
        s.gemm.push_back({tokens, h / tp, h});    // q/k/v/o projections
        s.gemm.push_back({tokens, ffn / tp, h});  // MLP up
        s.gemm.push_back({tokens, h, ffn / tp});  // MLP down
      }
    }
  }
  for (const int64_t h : logits_hidden) {
    for (const int64_t v : logits_vocab) s.gemm.push_back({logits_tokens, v, h});
  }
  for (const int64_t seq : attention_seq) {
    for (const int64_t d : head_dims) {
      for (const int64_t n : heads) s.attention.push_back({std::max<int64_t>(1, attention_tokens / seq), n, seq, d});
    }
  }
  return s;
}

std::vector<BenchmarkTask> kernel_tasks(const ProfileSweep& sweep, at::Device device, KernelMeasurements& out) {
  std::vector<BenchmarkTask> tasks;
  const Timer timer(device, sweep.warmup, sweep.repeats);
  const auto bf16 = bf16_on(device);
  for (const auto& g : sweep.gemm) {
    tasks.push_back({"gemm " + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k), [=, &out] {
                       const at::Tensor a = at::randn({g.m, g.k}, bf16), b = at::randn({g.k, g.n}, bf16);
                       const double seconds = timer.seconds([&] { (void)at::matmul(a, b); });
                       out.samples.gemm.push_back({static_cast<double>(g.m), static_cast<double>(g.n), static_cast<double>(g.k), seconds});
                     }});
  }
  for (const auto& g : sweep.gemm_fp32) {
    tasks.push_back({"gemm fp32 " + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k), [=, &out] {
                       const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(device);
                       const at::Tensor a = at::randn({g.m, g.k}, fp32), b = at::randn({g.k, g.n}, fp32);
                       const double seconds = timer.seconds([&] { (void)at::matmul(a, b); });
                       out.gemm_fp32_flops_per_second.push_back(2.0 * g.m * g.n * g.k / seconds);
                     }});
  }
  for (const auto& a : sweep.attention) {
    tasks.push_back({"sdpa s=" + std::to_string(a.seq_len) + " d=" + std::to_string(a.head_dim) + " heads=" + std::to_string(a.heads), [=, &out] {
                       const at::Tensor q = leaf({a.batch, a.heads, a.seq_len, a.head_dim}, device);
                       const at::Tensor k = leaf({a.batch, a.heads, a.seq_len, a.head_dim}, device);
                       const at::Tensor v = leaf({a.batch, a.heads, a.seq_len, a.head_dim}, device);
                       const auto attend = [&] { return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true); };
                       const double forward = timer.seconds([&] {
                         c10::NoGradGuard no_grad;
                         (void)attend();
                       });
                       const at::Tensor gradient = at::ones_like(attend());
                       const double both = timer.seconds([&] { (void)torch::autograd::grad({attend()}, {q, k, v}, {gradient}); });
                       out.samples.attention.push_back({static_cast<double>(a.batch), static_cast<double>(a.seq_len),
                                                        static_cast<double>(a.head_dim), static_cast<double>(a.heads), forward, both});
                     }});
  }
  add_elementwise_tasks(sweep, device, timer, out, tasks);
  const int adamw_repeats = std::max(3, sweep.repeats / 2);
  for (const int64_t n : sweep.adamw_params) {
    tasks.push_back({"adamw " + std::to_string(n) + " parameters", [n, device, adamw_repeats, &out] {
                       const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(device);
                       at::Tensor p = at::zeros({n}, fp32), g = at::randn({n}, fp32), m = at::zeros({n}, fp32), v = at::zeros({n}, fp32);
                       at::Tensor step = at::full({}, 10.0, fp32);
                       const bool try_fused = out.adamw_implementation.empty() || out.adamw_implementation == "at::_fused_adamw_";
                       out.adamw_implementation = adamw_step(p, g, m, v, step, try_fused);
                       const bool fused = out.adamw_implementation == "at::_fused_adamw_";
                       const Timer adamw_timer(device, 2, adamw_repeats);
                       const double seconds = adamw_timer.seconds([&] { (void)adamw_step(p, g, m, v, step, fused); });
                       out.samples.adamw_fused_gb_per_s.push_back(32.0 * static_cast<double>(n) / seconds / 1e9);
                     }});
  }
  const int64_t copy_bytes = sweep.copy_bytes;
  tasks.push_back({"copy " + size_text(copy_bytes), [copy_bytes, device, timer, &out] {
                     const at::Tensor x = at::ones({copy_bytes}, at::TensorOptions().dtype(at::kByte).device(device));
                     at::Tensor y = at::empty_like(x);
                     const double seconds = timer.seconds([&] { y.copy_(x); });
                     out.samples.copy_gb_per_s.push_back(2.0 * static_cast<double>(copy_bytes) / seconds / 1e9);
                   }});
  tasks.push_back({"tiny kernel", [device, &out] {
                     at::Tensor x = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
                     out.tiny_kernel_seconds = Timer(device, 100, 1000).seconds([&] { x.add_(1); });
                   }});
  return tasks;
}

std::vector<BenchmarkTask> collective_tasks(const ProfileSweep& sweep, Communicator& comm, at::Device device,
                                            costmodel::MeasuredCollectives& out) {
  enum class Kind { kAllReduce, kAllGather, kReduceScatter };
  const struct {
    Kind kind;
    const char* label;
    std::vector<costmodel::BusBandwidthSample> costmodel::MeasuredCollectives::*rows;
  } kinds[] = {{Kind::kAllReduce, "all-reduce", &costmodel::MeasuredCollectives::all_reduce},
               {Kind::kAllGather, "all-gather", &costmodel::MeasuredCollectives::all_gather},
               {Kind::kReduceScatter, "reduce-scatter", &costmodel::MeasuredCollectives::reduce_scatter}};
  const int warmup = sweep.collective_warmup, repeats = std::max(1, sweep.collective_repeats);
  std::vector<BenchmarkTask> tasks;
  for (const auto& k : kinds) {
    for (const int64_t requested : sweep.collective_bytes) {
      tasks.push_back({std::string(k.label) + " " + size_text(requested), [k, requested, warmup, repeats, device, &comm, &out] {
                         const int64_t n = comm.size();
                         const int64_t elements = requested / 4 / n * n;  // fp32, divisible by the ranks
                         const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(device);
                         const at::Tensor full = at::zeros({elements}, fp32), part = at::zeros({elements / n}, fp32);
                         const auto launch = [&]() -> std::unique_ptr<Work> {
                           switch (k.kind) {
                             case Kind::kAllReduce: return comm.all_reduce_sum(full);
                             case Kind::kAllGather: return comm.all_gather(part, full);
                             case Kind::kReduceScatter: return comm.reduce_scatter_sum(full, part);
                           }
                           return nullptr;
                         };
                         for (int i = 0; i < warmup; ++i) launch()->wait();
                         comm.barrier();
                         double seconds = 0;
                         if (device.is_cuda()) {
                           std::vector<std::unique_ptr<Work>> works;
                           CudaInterval interval;
                           interval.start();
                           for (int i = 0; i < repeats; ++i) works.push_back(launch());
                           works.back()->order_current_stream();  // NCCL runs on a stream of its own
                           interval.stop();
                           for (auto& w : works) w->wait();  // surfaces failures and the timeout
                           seconds = interval.seconds() / repeats;
                         } else {
                           std::vector<double> times;
                           for (int i = 0; i < repeats; ++i) {
                             const auto t0 = std::chrono::steady_clock::now();
                             launch()->wait();
                             times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
                           }
                           seconds = median(times);
                         }
                         std::ostringstream mine;
                         mine.precision(17);
                         mine << seconds;
                         double slowest = 0;
                         for (const std::string& text : comm.all_gather_strings(mine.str())) slowest = std::max(slowest, std::stod(text));
                         const double bytes = 4.0 * static_cast<double>(elements);
                         const double ranks = static_cast<double>(n);
                         const double factor = k.kind == Kind::kAllReduce ? 2.0 * (ranks - 1) / ranks : (ranks - 1) / ranks;
                         (out.*k.rows).push_back({bytes, factor * bytes / slowest});
                       }});
    }
  }
  return tasks;
}

}  // namespace trainplan::executor
