// The chunked linear cross-entropy (fused_ops.hpp linear_cross_entropy): the loss and the
// gradients of its input and weight computed in forward, a chunk of logits at a time.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>

#include <torch/csrc/autograd/custom_function.h>

#include "fused_ops.hpp"
#include "fused_ops_internal.hpp"

#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
#include "cuda_kernels.hpp"
#endif

namespace trainplan::executor {

namespace {

using namespace fused;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows of 16-bit logits the ATen path takes through float32 at once (LinearCrossEntropyFn): bf16
// reaches it only on CPU ranks, where it stands in for the CUDA kernel (no float32 copy of its
// own), so 16 rows; fp16 has no kernel on any device: blocks of up to 256 MiB of float32, which
// the cost model counts (compute.cpp ends_cost).
int64_t cross_entropy_row_block(const at::Tensor& logits) {
  if (logits.scalar_type() == at::kBFloat16) return 16;
  return std::max<int64_t>(16, (int64_t{256} << 20) / (4 * std::max<int64_t>(logits.size(1), 1)));
}

// float32 `logits` [rows, vocab] become (softmax - one_hot(targets)) x scale in place; returns the
// 0-dim sum of the rows' losses, log(sum exp) - target logit, both shifted by the row maximum.
// `valid` ([rows, 1] bool, or undefined for all rows): the rows that take a loss and a gradient.
at::Tensor cross_entropy_in_place(at::Tensor& logits, const at::Tensor& targets, const at::Tensor& valid, double scale) {
  logits.sub_(at::amax(logits, 1, /*keepdim=*/true));
  const at::Tensor target_logit = logits.gather(1, targets);
  const at::Tensor sum = logits.exp_().sum(1, /*keepdim=*/true);
  at::Tensor row_loss = sum.log().sub_(target_logit);
  logits.div_(sum).scatter_add_(1, targets, at::full({logits.size(0), 1}, -1.0, logits.options())).mul_(scale);
  if (valid.defined()) {
    row_loss.mul_(valid);
    logits.mul_(valid);
  }
  return row_loss.sum();
}

struct LinearCrossEntropyFn : torch::autograd::Function<LinearCrossEntropyFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                            int64_t chunk, std::optional<at::Tensor> weight_grad_sum_in, double multiplier, double denominator) {
    const int64_t n = x.size(0);
    const bool masked = denominator > 0;  // negative targets take no loss (linear_cross_entropy)
    const auto f32 = x.options().dtype(at::kFloat);
    at::Tensor grad_x = at::empty_like(x);
    // Every gradient is computed times `multiplier` (the factor the caller applies to the loss:
    // 1/accumulation, times the loss scale with fp16), in float32 before the logits' gradient is
    // rounded to the compute dtype, as the reference path's backward does: fp16's loss scale
    // keeps the small probabilities representable. The weight's gradient goes straight into the
    // caller's float32 sum, or into a float32 buffer of its own returned by backward.
    const bool into_sum = weight_grad_sum_in.has_value();
    const bool weight_frozen = !weight.requires_grad();  // LoRA's frozen output layer: no [vocab x h] gradient
    at::Tensor grad_weight = into_sum ? *weight_grad_sum_in : weight_frozen ? at::Tensor() : at::zeros(weight.sizes(), f32);
    at::Tensor loss = at::zeros({}, f32);
    const double inverse = 1.0 / (masked ? denominator : static_cast<double>(n));
    const double gradient_scale = inverse * multiplier;
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t rows_here = std::min(chunk, n - start);
      const at::Tensor xc = x.narrow(0, start, rows_here);
      at::Tensor tc = targets.narrow(0, start, rows_here).unsqueeze(1);
      at::Tensor valid;  // [rows, 1]: the rows that take a loss (masked only)
      if (masked) {
        valid = tc.ge(0);
        tc = tc.clamp_min(0);
      }
      // As the reference path: logits in the compute dtype, log-softmax in float32; the gradient
      // d loss / d logits = (softmax - one_hot(target)) / n, rounded to the compute dtype once.
      at::Tensor logits = at::mm(xc, weight.t());
      at::Tensor g;
#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
      if (kernel_for(logits) && logits.is_contiguous()) {
        const at::Tensor row_targets = tc.reshape({-1}).contiguous();
        at::Tensor row_loss = at::empty({rows_here}, f32);
        cuda_kernels::cross_entropy_backward_in_place(logits.data_ptr(), row_targets.data_ptr<int64_t>(), row_loss.data_ptr<float>(),
                                                      rows_here, logits.size(1), static_cast<float>(gradient_scale), stream_of(logits));
        if (masked) {
          row_loss.mul_(valid.squeeze(1));
          logits.mul_(valid);
        }
        loss.add_(row_loss.sum());
        g = logits;
      }
#endif
      if (!g.defined()) {
        // The ATen path, in place as the CUDA kernel, so one chunk of logits is all the loss holds:
        // float32 logits whole, 16-bit ones a few rows at a time through a float32 copy (the
        // kernel's per-row float32 math), the gradient written back over the logits.
        if (logits.scalar_type() == at::kFloat) {
          loss.add_(cross_entropy_in_place(logits, tc, valid, gradient_scale));
        } else {
          const int64_t block_rows = cross_entropy_row_block(logits);
          for (int64_t r = 0; r < rows_here; r += block_rows) {
            const int64_t b = std::min(block_rows, rows_here - r);
            at::Tensor block = logits.narrow(0, r, b);
            at::Tensor up = block.to(at::kFloat);
            loss.add_(cross_entropy_in_place(up, tc.narrow(0, r, b), masked ? valid.narrow(0, r, b) : valid, gradient_scale));
            block.copy_(up);
          }
        }
        g = logits;
      }
      at::Tensor gx = grad_x.narrow(0, start, rows_here);
      at::mm_out(gx, g, weight);
      if (grad_weight.defined()) add_weight_gradient(grad_weight, g, xc);
    }
    ctx->saved_data["grad_x"] = grad_x;
    ctx->saved_data["multiplier"] = multiplier;
    if (!into_sum && grad_weight.defined()) ctx->saved_data["grad_weight"] = grad_weight;
    return loss.mul_(inverse);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor grad_x = ctx->saved_data["grad_x"].toTensor();
    const auto found = ctx->saved_data.find("grad_weight");
    at::Tensor grad_weight = found != ctx->saved_data.end() ? found->second.toTensor() : at::Tensor();
    // d(final) / d(loss) over the multiplier already applied: 1 (to float32 rounding) when the
    // caller multiplied the loss by `multiplier` as promised; a float32 0-dim tensor, so that
    // multiplying the 16-bit gradients by it rounds once and cannot overflow a 16-bit scale.
    const double multiplier = ctx->saved_data["multiplier"].toDouble();
    const at::Tensor scale = grads[0].to(at::kFloat) / multiplier;
    ctx->saved_data.clear();
    at::Tensor weight_out;
    if (grad_weight.defined()) {  // scaled and rounded to the weight's dtype in one pass
      weight_out = at::empty(grad_weight.sizes(), grad_x.options());
      at::mul_out(weight_out, grad_weight, scale);
    }
    return {grad_x.mul_(scale), weight_out, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor linear_cross_entropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets, int64_t chunk_tokens,
                                const at::Tensor& weight_grad_sum, double multiplier, double denominator) {
  if (chunk_tokens < 0) throw std::invalid_argument("linear_cross_entropy: chunk_tokens must not be negative");
  // Both paths turn the logits, in the compute dtype, into their gradient in place.
  const int64_t chunk = chunk_tokens > 0 ? chunk_tokens : cross_entropy_chunk_tokens(weight.size(0), x.element_size());
  return LinearCrossEntropyFn::apply(x, weight, targets, chunk, checked_sum(weight_grad_sum, weight, "linear_cross_entropy"), multiplier,
                                     denominator);
}

int64_t cross_entropy_chunk_tokens(int64_t vocab, int64_t bytes_per_logit) {
  constexpr int64_t kBudgetBytes = int64_t{1} << 30;
  const int64_t rows = kBudgetBytes / (std::max<int64_t>(vocab, 1) * std::max<int64_t>(bytes_per_logit, 1));
  return std::max<int64_t>(64, rows / 64 * 64);
}

}  // namespace trainplan::executor
