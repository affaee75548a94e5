// The fused paths (see fused_ops.hpp). Each backward repeats the plain path's operators in the
// same order and dtypes (linear: grad @ W and grad^T @ input; mul: grad * other; silu_backward),
// so gradients match the reference path up to the order of bf16 sums.

#include "fused_ops.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>

#include <ATen/OpMathType.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fp8.hpp"
#include "fused_ops_internal.hpp"

#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "cuda_kernels.hpp"
#endif

namespace trainplan::executor {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Kernels parse_kernels(const std::string& name) {
  if (name == "fused") return Kernels::kFused;
  if (name == "reference") return Kernels::kReference;
  throw std::invalid_argument("--kernels: expected fused or reference, got \"" + name + "\"");
}

const char* kernels_name(Kernels kernels) { return kernels == Kernels::kFused ? "fused" : "reference"; }

bool have_cuda_kernels() {
#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

namespace fused {

bool kernel_for(const at::Tensor& t) {
#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
  return t.is_cuda() && t.scalar_type() == at::kBFloat16;
#else
  (void)t;
  return false;
#endif
}

#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
void* stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }
bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }
#endif

at::Tensor rows(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

void add_weight_gradient(at::Tensor& sum, const at::Tensor& g, const at::Tensor& input) {
  if (input.scalar_type() == sum.scalar_type()) {
    sum.addmm_(g.t(), input);
  } else if (input.is_cuda() && input.element_size() == 2) {
    at::addmm_out(sum, sum, g.t(), input, at::kFloat, 1, 1);
  } else {
    sum.add_(g.t().mm(input));
  }
}

std::optional<at::Tensor> checked_sum(const at::Tensor& sum, const at::Tensor& weight, const char* what) {
  if (!sum.defined()) return std::nullopt;
  if (sum.scalar_type() != at::kFloat && sum.scalar_type() != at::kDouble) {
    throw std::invalid_argument(std::string(what) + ": a gradient sum must be float32 (or float64 with float64 weights)");
  }
  if (sum.sizes() != weight.sizes() || !sum.is_contiguous() || sum.device() != weight.device()) {
    throw std::invalid_argument(std::string(what) + ": a gradient sum must be contiguous, of the weight's shape and on its device");
  }
  return sum.detach();
}

}  // namespace fused

namespace {

using namespace fused;

// silu(gate) * up.
at::Tensor swiglu_product(const at::Tensor& gate, const at::Tensor& up) {
#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
  if (kernel_for(gate) && kernel_for(up) && gate.is_contiguous() && up.is_contiguous() && gate.sizes() == up.sizes()) {
    at::Tensor out = at::empty_like(gate);
    cuda_kernels::swiglu_forward(gate.data_ptr(), up.data_ptr(), out.data_ptr(), gate.numel(), stream_of(gate));
    return out;
  }
#endif
  return at::silu(gate) * up;
}

// Rotary over x [batch, heads, seq, dim] whose memory is [batch, seq, heads, dim] (a transposed
// linear output), with the kernel; an undefined tensor where the kernel does not apply.
at::Tensor rotary_kernel(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse) {
#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
  if (kernel_for(x) && kernel_for(cos) && kernel_for(sin) && x.dim() == 4 && cos.is_contiguous() && sin.is_contiguous() &&
      cos.size(0) == x.size(2) && cos.size(1) == x.size(3)) {
    const at::Tensor physical = x.transpose(1, 2).contiguous();  // a no-op for the usual layout
    at::Tensor out = at::empty_like(physical);
    cuda_kernels::rotary(physical.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), x.size(0), x.size(2), x.size(1), x.size(3),
                         inverse, stream_of(x));
    return out.transpose(1, 2);
  }
#else
  (void)x, (void)cos, (void)sin, (void)inverse;
#endif
  return {};
}


// A weight's gradient g^T input: into its sum when one is given (and none returned), else returned.
at::Tensor weight_gradient(std::optional<at::Tensor>& sum, const at::Tensor& g, const at::Tensor& input) {
  if (!sum.has_value()) return g.t().mm(input);
  add_weight_gradient(*sum, g, input);
  return {};
}

// fp8 (fp8.hpp): a weight's gradient g^T x from the output gradient's cast transposed (g_t) and
// the input's (x_t, [k, rows]): into its sum (a float32 GEMM output added) or returned in `dtype`.
at::Tensor fp8_weight_gradient(std::optional<at::Tensor>& sum, const at::Tensor& g_t, const at::Tensor& g_inverse_scale,
                               const at::Tensor& x_t, const at::Tensor& x_inverse_scale, at::ScalarType dtype) {
  if (!sum.has_value()) return fp8::weight_gradient(g_t, g_inverse_scale, x_t, x_inverse_scale, dtype);
  sum->add_(fp8::weight_gradient(g_t, g_inverse_scale, x_t, x_inverse_scale, at::kFloat));
  return {};
}

// linear(x, w) on fp8 operands (fp8.hpp), x's and w's amax kept in the context ("x_amax",
// "w_amax") for backward's casts of the same tensors.
at::Tensor fp8_linear(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
  const fp8::Cast xc = fp8::cast(rows(x), fp8::kForwardType);
  at::Tensor w_amax;
  const at::Tensor y = fp8::forward(xc, w, w_amax);
  ctx->saved_data["x_amax"] = xc.amax;
  ctx->saved_data["w_amax"] = w_amax;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.size(0);
  return y.view(shape);
}


// Sums kept between forward and backward, by name, in the context's saved data (not saved
// variables: they are written in place, by design, between the two).
void keep_sum(AutogradContext* ctx, const std::string& key, const std::optional<at::Tensor>& sum) {
  if (sum.has_value()) ctx->saved_data[key] = *sum;
}

// Frozen weights (LoRA's base, model.hpp) need no gradient: forward notes which of its weights
// require none, and backward skips their weight-gradient GEMMs.
void note_frozen(AutogradContext* ctx, const std::string& key, const at::Tensor& weight) {
  if (!weight.requires_grad()) ctx->saved_data[key] = true;
}
bool frozen(AutogradContext* ctx, const std::string& key) { return ctx->saved_data.count(key) != 0; }
std::optional<at::Tensor> kept_sum(AutogradContext* ctx, const std::string& key) {
  const auto found = ctx->saved_data.find(key);
  if (found == ctx->saved_data.end()) return std::nullopt;
  return found->second.toTensor();
}

struct NormLinearsFn : torch::autograd::Function<NormLinearsFn> {
  // Arguments: x (0), branch (1), norm_weight (2), eps, weights (4 on), sums, norm_sum, residual.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, std::optional<at::Tensor> branch, const at::Tensor& norm_weight,
                               double eps, at::TensorList weights, std::vector<std::optional<at::Tensor>> sums,
                               std::optional<at::Tensor> norm_sum, bool residual, int64_t fp8_weights) {
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["fp8"] = fp8_weights;
    ctx->saved_data["count"] = static_cast<int64_t>(weights.size());
    for (std::size_t i = 0; i < sums.size(); ++i) keep_sum(ctx, "sum" + std::to_string(i), sums[i]);
    for (std::size_t i = 0; i < weights.size(); ++i) note_frozen(ctx, "frozen" + std::to_string(i), weights[i]);
    keep_sum(ctx, "norm_sum", norm_sum);
    if (branch.has_value()) ctx->saved_data["branch"] = true;
    // The norm's input: x, or x + branch (one kernel with the norm for bf16 on a GPU).
    at::Tensor input = x, normed;
#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
    if (branch.has_value() && kernel_for(x) && kernel_for(*branch) && kernel_for(norm_weight) && x.is_contiguous() &&
        branch->is_contiguous() && norm_weight.is_contiguous() && x.sizes() == branch->sizes() && x.numel() > 0 &&
        cuda_kernels::rms_norm_backward_supports(x.size(-1)) && aligned16(x) && aligned16(*branch) && aligned16(norm_weight)) {
      input = at::empty_like(x);
      normed = at::empty_like(x);
      cuda_kernels::add_rms_norm(x.data_ptr(), branch->data_ptr(), norm_weight.data_ptr(), input.data_ptr(), normed.data_ptr(),
                                 x.numel() / x.size(-1), x.size(-1), static_cast<float>(eps), stream_of(x));
    }
#endif
    if (!normed.defined()) {
      if (branch.has_value()) input = x + *branch;
      normed = at::rms_norm(input, {x.size(-1)}, norm_weight, eps);
    }
    variable_list saved{input, norm_weight};
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    variable_list out;
    // fp8: the normalised input cast once for the first fp8_weights weights (its amax kept for
    // backward's recast of the recomputed norm), each weight cast on its own.
    fp8::Cast input_fp8;
    if (fp8_weights > 0) {
      input_fp8 = fp8::cast(rows(normed), fp8::kForwardType);
      ctx->saved_data["input_amax"] = input_fp8.amax;
    }
    for (std::size_t i = 0; i < weights.size(); ++i) {
      if (static_cast<int64_t>(i) >= fp8_weights) {
        out.push_back(at::linear(normed, weights[i]));
        continue;
      }
      at::Tensor w_amax;
      at::Tensor y = fp8::forward(input_fp8, weights[i], w_amax);
      ctx->saved_data["w_amax" + std::to_string(i)] = w_amax;
      std::vector<int64_t> shape = normed.sizes().vec();
      shape.back() = weights[i].size(0);
      out.push_back(y.view(shape));
    }
    // The stream: the sum, or x itself (autograd makes it a view of x whose gradient comes back here).
    if (residual) out.push_back(input);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const double eps = ctx->saved_data["eps"].toDouble();
    const auto count = static_cast<std::size_t>(ctx->saved_data["count"].toInt());
    const int64_t h = saved[0].size(-1);
    // The residual stream's gradient, when x was also returned: added to the norm's input gradient.
    const at::Tensor stream_grad = grads.size() > count && grads[count].defined() ? grads[count].contiguous() : at::Tensor();
    // The norm's backward: the CUDA kernel (one pass for the input's gradient and the weight's
    // partial sums), else autograd through rms_norm (on CPU the lean one above ATen's composite).
    bool kernel = false;
#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
    kernel = kernel_for(saved[0]) && kernel_for(saved[1]) && saved[0].is_contiguous() && saved[1].is_contiguous() &&
             cuda_kernels::rms_norm_backward_supports(h) && saved[0].numel() > 0 &&
             aligned16(saved[0]) && aligned16(saved[1]) &&
             (!stream_grad.defined() || (kernel_for(stream_grad) && aligned16(stream_grad) && stream_grad.sizes() == saved[0].sizes()));
#endif
    at::Tensor x = saved[0].detach(), nw = saved[1].detach();
    at::Tensor normed;
    if (kernel) {
      normed = at::rms_norm(x, {h}, nw, eps);
    } else {
      x.requires_grad_(true);
      nw.requires_grad_(true);
      torch::autograd::AutoGradMode enable(true);
      normed = trainplan::executor::rms_norm(x, nw, eps);
    }
    const at::Tensor input = rows(normed.detach());
    const int64_t fp8_weights = ctx->saved_data["fp8"].toInt();
    // fp8: the recomputed input cast as in forward (its amax), transposed for the weight gradients.
    fp8::Cast input_fp8;
    at::Tensor input_t;
    if (fp8_weights > 0) {
      input_fp8 = fp8::cast(input, fp8::kForwardType, ctx->saved_data["input_amax"].toTensor(), fp8::Layout::kTransposed);
      input_t = input_fp8.transposed;
    }
    at::Tensor grad_normed;
    variable_list weight_grads(count);
    for (std::size_t i = 0; i < count; ++i) {
      if (!grads[i].defined()) continue;
      const at::Tensor& w = saved[2 + i];
      const at::Tensor g = rows(grads[i]);
      std::optional<at::Tensor> sum = kept_sum(ctx, "sum" + std::to_string(i));
      const bool trained = !frozen(ctx, "frozen" + std::to_string(i));
      if (static_cast<int64_t>(i) < fp8_weights) {
        const fp8::Cast gc = fp8::cast(g, fp8::kGradientType, {}, trained ? fp8::Layout::kBoth : fp8::Layout::kRows);
        if (trained) weight_grads[i] = fp8_weight_gradient(sum, gc.transposed, gc.inverse_scale, input_t, input_fp8.inverse_scale, w.scalar_type());
        const at::Tensor gi = fp8::input_gradient(gc, w, ctx->saved_data["w_amax" + std::to_string(i)].toTensor());
        if (grad_normed.defined()) grad_normed.add_(gi);
        else grad_normed = gi;
        continue;
      }
      if (trained) weight_grads[i] = weight_gradient(sum, g, input);
      if (grad_normed.defined()) grad_normed.addmm_(g, w);  // the GEMM adds into the running sum (beta = 1)
      else grad_normed = g.mm(w);
    }
    variable_list out(8 + count);
    std::optional<at::Tensor> norm_sum = kept_sum(ctx, "norm_sum");
    if (grad_normed.defined()) {
      at::Tensor grad_nw;
      if (kernel) {
#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
        const int64_t n = input.size(0);
        out[0] = at::empty_like(x);
        const at::Tensor partial = at::empty({cuda_kernels::rms_norm_partial_rows(n), h}, x.options().dtype(at::kFloat));
        cuda_kernels::rms_norm_backward(grad_normed.data_ptr(), x.data_ptr(), nw.data_ptr(),
                                        stream_grad.defined() ? stream_grad.data_ptr() : nullptr, out[0].data_ptr(),
                                        partial.data_ptr<float>(), n, h, static_cast<float>(eps), stream_of(x));
        grad_nw = partial.sum(0);
#endif
      } else {
        const variable_list g = torch::autograd::grad({normed}, {x, nw}, {grad_normed.view(normed.sizes())});
        out[0] = stream_grad.defined() ? g[0].add_(stream_grad.view(g[0].sizes())) : g[0];
        grad_nw = g[1];
      }
      if (norm_sum.has_value()) norm_sum->add_(grad_nw);
      else out[2] = grad_nw.to(nw.scalar_type());
    } else if (stream_grad.defined()) {
      out[0] = stream_grad;
    }
    if (ctx->saved_data.count("branch") != 0) out[1] = out[0];  // x + branch: the same gradient for both
    for (std::size_t i = 0; i < count; ++i) out[4 + i] = weight_grads[i];
    return out;
  }
};

// linear(x, w) whose weight gradient goes into a float32 sum.
// fp8: the three GEMMs on fp8 operands (fp8.hpp). x is kept as it is (torchao keeps the
// high-precision input: the attention output, which attention keeps anyway, for the output
// projection) and cast again, transposed, in backward with its forward amax.
struct LinearIntoFn : torch::autograd::Function<LinearIntoFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, std::optional<at::Tensor> sum, bool fp8) {
    keep_sum(ctx, "sum", sum);
    note_frozen(ctx, "frozen", w);
    ctx->save_for_backward({x, w});
    return fp8 ? fp8_linear(ctx, x, w) : at::linear(x, w);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const at::Tensor g = rows(grads[0]);
    std::optional<at::Tensor> sum = kept_sum(ctx, "sum");
    const bool trained = !frozen(ctx, "frozen");
    if (ctx->saved_data.count("x_amax") != 0) {  // fp8
      const fp8::Cast gc = fp8::cast(g, fp8::kGradientType, {}, trained ? fp8::Layout::kBoth : fp8::Layout::kRows);
      at::Tensor grad_w;
      if (trained) {
        const fp8::Cast xc = fp8::cast(rows(x), fp8::kForwardType, ctx->saved_data["x_amax"].toTensor(), fp8::Layout::kTransposed);
        grad_w = fp8_weight_gradient(sum, gc.transposed, gc.inverse_scale, xc.transposed, xc.inverse_scale, w.scalar_type());
      }
      const at::Tensor grad_x = fp8::input_gradient(gc, w, ctx->saved_data["w_amax"].toTensor());
      return {grad_x.view(x.sizes()), grad_w, at::Tensor(), at::Tensor()};
    }
    const at::Tensor grad_w = trained ? weight_gradient(sum, g, rows(x)) : at::Tensor();
    return {g.mm(w).view(x.sizes()), grad_w, at::Tensor(), at::Tensor()};
  }
};

// embedding(table, tokens) whose table gradient is scattered into a float32 sum.
struct EmbeddingIntoFn : torch::autograd::Function<EmbeddingIntoFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& table, const at::Tensor& tokens, std::optional<at::Tensor> sum) {
    keep_sum(ctx, "sum", sum);
    ctx->saved_data["tokens"] = tokens;
    return at::embedding(table, tokens);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor tokens = ctx->saved_data["tokens"].toTensor().reshape({-1});
    const at::Tensor g = rows(grads[0]);
    std::optional<at::Tensor> sum = kept_sum(ctx, "sum");  // always present: without one, embedding_into runs at::embedding
    // Accumulating index_put_: deterministic on CUDA (sorted by row), in order on CPU.
    c10::List<std::optional<at::Tensor>> index;
    index.push_back(tokens);
    sum->index_put_(index, g.to(sum->scalar_type()), /*accumulate=*/true);
    return {at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The transpose of rotate_half: cat(t2, -t1) = -rotate_half(t).
at::Tensor rotate_half_transposed(const at::Tensor& t) {
  const int64_t half = t.size(-1) / 2;
  return at::cat({t.narrow(-1, half, half), -t.narrow(-1, 0, half)}, -1);
}

struct RotaryFn : torch::autograd::Function<RotaryFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->saved_data["cos"] = cos;
    ctx->saved_data["sin"] = sin;
    if (at::Tensor out = rotary_kernel(x, cos, sin, false); out.defined()) return out;
    return x * cos + rotate_half(x) * sin;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor cos = ctx->saved_data["cos"].toTensor(), sin = ctx->saved_data["sin"].toTensor();
    const at::Tensor& g = grads[0];
    if (at::Tensor out = rotary_kernel(g, cos, sin, true); out.defined()) return {out, at::Tensor(), at::Tensor()};
    return {g * cos + rotate_half_transposed(g * sin), at::Tensor(), at::Tensor()};
  }
};

// The gradients of gate and up from the product's, and the recomputed product bf16(silu(gate)) *
// up: 3 [tokens x ffn] tensors at once on either path (`owned`: grad_product may be overwritten).
struct SwigluGradients {
  at::Tensor product, gate, up;
};
SwigluGradients swiglu_gradients(at::Tensor grad_product, const at::Tensor& gate, const at::Tensor& up, bool owned) {
  SwigluGradients out;
#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
  if (kernel_for(gate) && kernel_for(up) && gate.is_contiguous() && up.is_contiguous()) {
    grad_product = grad_product.contiguous();
    out.product = at::empty_like(gate);
    out.gate = at::empty_like(gate);
    out.up = at::empty_like(gate);
    cuda_kernels::swiglu_backward(grad_product.data_ptr(), gate.data_ptr(), up.data_ptr(), out.product.data_ptr(), out.gate.data_ptr(),
                                  out.up.data_ptr(), gate.numel(), stream_of(gate));
    return out;
  }
#endif
  // In place where the kernel writes.
  out.product = at::silu(gate);
  out.up = grad_product * out.product;
  out.gate = owned ? grad_product.mul_(up) : grad_product * up;
  at::silu_backward_out(out.gate, out.gate, gate);
  out.product.mul_(up);
  return out;
}

// silu(gate) * up keeping gate and up only: the product a LoRA adapter on the down projection
// takes as its input (kept by the adapter), without autograd's copy of silu(gate).
struct SwigluFn : torch::autograd::Function<SwigluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return swiglu_product(gate, up);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const SwigluGradients g = swiglu_gradients(grads[0], saved[0], saved[1], /*owned=*/false);
    return {g.gate, g.up};
  }
};

struct SwigluDownFn : torch::autograd::Function<SwigluDownFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down,
                            std::optional<at::Tensor> down_sum, bool fp8) {
    keep_sum(ctx, "sum", down_sum);
    note_frozen(ctx, "frozen", down);
    ctx->save_for_backward({gate, up, down});
    const at::Tensor product = swiglu_product(gate, up);
    // fp8: the product's amax kept for backward's recast of the recomputed product.
    return fp8 ? fp8_linear(ctx, product, down) : at::linear(product, down);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &up = saved[1], &down = saved[2];
    const at::Tensor g = rows(grads[0]);
    std::optional<at::Tensor> sum = kept_sum(ctx, "sum");
    const bool trained = !frozen(ctx, "frozen");
    if (ctx->saved_data.count("x_amax") != 0) {  // fp8
      const fp8::Cast gc = fp8::cast(g, fp8::kGradientType, {}, trained ? fp8::Layout::kBoth : fp8::Layout::kRows);
      const at::Tensor grad_product = fp8::input_gradient(gc, down, ctx->saved_data["w_amax"].toTensor());
      const SwigluGradients s = swiglu_gradients(grad_product.view(gate.sizes()), gate, up, /*owned=*/true);
      at::Tensor grad_down;
      if (trained) {
        const fp8::Cast pc = fp8::cast(rows(s.product), fp8::kForwardType, ctx->saved_data["x_amax"].toTensor(), fp8::Layout::kTransposed);
        grad_down = fp8_weight_gradient(sum, gc.transposed, gc.inverse_scale, pc.transposed, pc.inverse_scale, down.scalar_type());
      }
      return {s.gate, s.up, grad_down, at::Tensor(), at::Tensor()};
    }
    const SwigluGradients s = swiglu_gradients(g.mm(down).view(gate.sizes()), gate, up, /*owned=*/true);
    const at::Tensor grad_down = trained ? weight_gradient(sum, g, rows(s.product)) : at::Tensor();
    return {s.gate, s.up, grad_down, at::Tensor(), at::Tensor()};
  }
};

// at::rms_norm's composite (upcast, rsqrt of the mean square plus eps, multiply, cast back, times
// the weight) keeping only the input and the reciprocal RMS; the backward is the composite's
// autograd backward, op for op in the same precision.
struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    const at::ScalarType opmath = at::toOpMathType(x.scalar_type());
    const at::Tensor up = x.to(opmath);
    const at::Tensor rstd = at::rsqrt(up.pow(2).mean(-1, /*keepdim=*/true).add_(eps));
    ctx->save_for_backward({x, rstd, weight});
    return up.mul(rstd).type_as(x).mul(weight);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &rstd = saved[1], &weight = saved[2];
    const at::ScalarType opmath = at::toOpMathType(x.scalar_type());
    const at::Tensor up = x.to(opmath);
    const at::Tensor& dy = grads[0];
    // In place where it can be: at most two [rows x h] temporaries at once.
    at::Tensor dweight;
    if (weight.requires_grad()) {
      at::Tensor product = up.mul(rstd).type_as(x).mul_(dy);  // the normalised input (recomputed) times dy
      const int64_t rows = product.numel() / weight.numel();
      dweight = product.reshape({rows, weight.numel()}).sum(0).view(weight.sizes());
    }
    at::Tensor dx = dy.mul(weight).to(opmath);  // d normalised input
    // d(up * rstd): rstd's part through rsqrt(mean(up^2) + eps): -rstd^3 / 2 x 2 up / h.
    const at::Tensor drstd = dx.mul(up).sum(-1, /*keepdim=*/true);
    const double h = static_cast<double>(x.size(-1));
    dx.mul_(rstd).add_(up.mul(drstd.mul(rstd.pow(3)).mul_(-1.0 / h)));
    return {dx.to(x.scalar_type()), dweight, at::Tensor()};
  }
};

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (x.is_cuda()) return at::rms_norm(x, {x.size(-1)}, weight, eps);
  return RmsNormFn::apply(x, weight, eps);
}

at::Tensor rotate_half(const at::Tensor& t) {
  const int64_t half = t.size(-1) / 2;
  return at::cat({-t.narrow(-1, half, half), t.narrow(-1, 0, half)}, -1);
}

std::vector<at::Tensor> norm_linears(const at::Tensor& x, const at::Tensor& norm_weight, double eps,
                                     const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& grad_sums,
                                     const at::Tensor& norm_grad_sum, bool residual, const at::Tensor& branch, std::size_t fp8_weights) {
  if (branch.defined() && (branch.sizes() != x.sizes() || branch.device() != x.device())) {
    throw std::invalid_argument("norm_linears: the branch must have x's shape and device");
  }
  if (norm_weight.dim() != 1 || norm_weight.numel() != x.size(-1) || norm_weight.device() != x.device()) {
    throw std::invalid_argument("norm_linears: the norm weight must be [h] for x [..., h], on x's device");
  }
  if (!grad_sums.empty() && grad_sums.size() != weights.size()) {
    throw std::invalid_argument("norm_linears: grad_sums must be empty or one per weight");
  }
  std::vector<std::optional<at::Tensor>> sums;
  if (fp8_weights > weights.size()) throw std::invalid_argument("norm_linears: more fp8 weights than weights");
  for (std::size_t i = 0; i < grad_sums.size(); ++i) sums.push_back(checked_sum(grad_sums[i], weights[i], "norm_linears"));
  return NormLinearsFn::apply(x, branch.defined() ? std::optional<at::Tensor>(branch) : std::nullopt, norm_weight, eps,
                              at::TensorList(weights), sums, checked_sum(norm_grad_sum, norm_weight, "norm_linears"), residual,
                              static_cast<int64_t>(fp8_weights));
}

at::Tensor linear_into(const at::Tensor& x, const at::Tensor& w, const at::Tensor& grad_sum, bool fp8) {
  if (!grad_sum.defined() && !fp8) return at::linear(x, w);
  return LinearIntoFn::apply(x, w, checked_sum(grad_sum, w, "linear_into"), fp8);
}

at::Tensor embedding_into(const at::Tensor& table, const at::Tensor& tokens, const at::Tensor& grad_sum) {
  if (!grad_sum.defined()) return at::embedding(table, tokens);
  return EmbeddingIntoFn::apply(table, tokens, checked_sum(grad_sum, table, "embedding_into"));
}

at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return RotaryFn::apply(x, cos, sin);
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) { return SwigluFn::apply(gate, up); }

at::Tensor swiglu_down(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down, const at::Tensor& down_grad_sum, bool fp8) {
  return SwigluDownFn::apply(gate, up, down, checked_sum(down_grad_sum, down, "swiglu_down"), fp8);
}

}  // namespace trainplan::executor
