// fp8 casts and GEMMs (see fp8.hpp).

#include "fp8.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include <ATen/ops/_scaled_mm.h>

#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "cuda_kernels.hpp"
#endif

namespace trainplan::executor::fp8 {

namespace {

// torchao float8_utils.py EPS: the least amax a scale is taken from (an all-zero tensor casts to zeros).
constexpr double kAmaxFloor = 1e-12;

void check_type(at::ScalarType type) {
  if (type != at::kFloat8_e4m3fn && type != at::kFloat8_e5m2) {
    throw std::invalid_argument(std::string("fp8: a cast to ") + c10::toString(type) + " (e4m3fn or e5m2 expected)");
  }
}

}  // namespace

double max_of(at::ScalarType type) {
  check_type(type);
  return type == at::kFloat8_e4m3fn ? 448.0 : 57344.0;
}

at::Tensor absolute_max(const at::Tensor& x) {
  return at::linalg_vector_norm(x, std::numeric_limits<double>::infinity(), at::OptionalIntArrayRef{}, false, at::kFloat);
}

Cast cast(const at::Tensor& x, at::ScalarType type, const at::Tensor& given_amax, Layout layout) {
  const double max = max_of(type);
  if (layout != Layout::kRows && x.dim() != 2) throw std::invalid_argument("fp8::cast: a transposed layout needs a 2-D tensor");
  const bool rows = layout != Layout::kTransposed, transpose = layout != Layout::kRows;
  Cast out;
  out.amax = given_amax.defined() ? given_amax : absolute_max(x);
  if (out.amax.scalar_type() != at::kFloat || out.amax.numel() != 1) throw std::invalid_argument("fp8::cast: amax must be one float32");
  const at::Tensor source = x.contiguous();
  if (rows) out.data = at::empty(source.sizes(), source.options().dtype(type));
  if (transpose) out.transposed = at::empty({source.size(1), source.size(0)}, source.options().dtype(type));
#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
  if (source.is_cuda() && source.scalar_type() == at::kBFloat16) {
    out.inverse_scale = at::empty({}, source.options().dtype(at::kFloat));
    const at::Tensor a = out.amax.reshape({}).contiguous();
    void* stream = c10::cuda::getCurrentCUDAStream(source.device().index()).stream();
    const auto bytes = [](const at::Tensor& t) { return t.defined() ? static_cast<uint8_t*>(t.data_ptr()) : nullptr; };
    if (!transpose) {
      cuda_kernels::fp8_cast(source.data_ptr(), bytes(out.data), a.data_ptr<float>(), static_cast<float>(max), type == at::kFloat8_e5m2,
                             out.inverse_scale.data_ptr<float>(), source.numel(), stream);
    } else {
      cuda_kernels::fp8_cast_transpose(source.data_ptr(), bytes(out.data), bytes(out.transposed), a.data_ptr<float>(), static_cast<float>(max),
                                       type == at::kFloat8_e5m2, out.inverse_scale.data_ptr<float>(), source.size(0), source.size(1), stream);
    }
    return out;
  }
#endif
  // float32 throughout, as the kernel: scale = max / max(amax, floor), saturate, round to nearest even.
  const at::Tensor scale = at::full({}, max, out.amax.options()).div_(out.amax.reshape({}).clamp_min(kAmaxFloor));
  out.inverse_scale = at::reciprocal(scale);
  const at::Tensor scaled = source.to(at::kFloat).mul_(scale).clamp_(-max, max);
  if (rows) out.data.copy_(scaled);
  if (transpose) out.transposed.copy_(scaled.t());
  return out;
}

at::Tensor mm(const at::Tensor& a, const at::Tensor& a_inverse_scale, const at::Tensor& b, const at::Tensor& b_inverse_scale,
              at::ScalarType out, bool fast_accumulation) {
  if (a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0)) throw std::invalid_argument("fp8::mm: [m, k] times [k, n] expected");
  for (const int64_t d : {a.size(0), a.size(1), b.size(1)}) {
    if (d % 16 != 0) {
      throw std::invalid_argument("fp8::mm: every dimension of an fp8 GEMM must be a multiple of 16 (cuBLASLt), got [" +
                                  std::to_string(a.size(0)) + ", " + std::to_string(a.size(1)) + "] x [" + std::to_string(b.size(0)) + ", " +
                                  std::to_string(b.size(1)) + "]");
    }
  }
  if (!a.is_cuda()) {
    // CPU: LibTorch's _scaled_mm there is a reference loop (about 20 ms for a 128 x 64 x 64
    // product on this VM); the same product of the fp8 values, dequantised, in float32 (torchao's
    // `emulate`), differs from it only in the order of float32 sums.
    return (a.to(at::kFloat) * a_inverse_scale).mm(b.to(at::kFloat) * b_inverse_scale).to(out);
  }
  return at::_scaled_mm(a, b, a_inverse_scale, b_inverse_scale, std::nullopt, std::nullopt, out, fast_accumulation);
}

at::Tensor forward(const Cast& x, const at::Tensor& w, at::Tensor& w_amax) {
  const Cast wc = cast(w, kForwardType);
  w_amax = wc.amax;
  // w's cast is [n, k] row-major: its transpose is the column-major [k, n] the GEMM takes.
  return mm(x.data, x.inverse_scale, wc.data.t(), wc.inverse_scale, w.scalar_type(), /*fast_accumulation=*/true);
}

at::Tensor input_gradient(const Cast& g, const at::Tensor& w, const at::Tensor& w_amax) {
  const Cast wc = cast(w, kForwardType, w_amax, Layout::kTransposed);
  // [rows, n] x [n, k]: w's cast transposed, [k, n] row-major, whose .t() is [n, k] column-major.
  return mm(g.data, g.inverse_scale, wc.transposed.t(), wc.inverse_scale, w.scalar_type(), /*fast_accumulation=*/false);
}

at::Tensor weight_gradient(const at::Tensor& g_t, const at::Tensor& g_inverse_scale, const at::Tensor& x_t,
                           const at::Tensor& x_inverse_scale, at::ScalarType out) {
  // [n, rows] x [rows, k]: x_t [k, rows] row-major, whose .t() is [rows, k] column-major.
  return mm(g_t, g_inverse_scale, x_t.t(), x_inverse_scale, out, /*fast_accumulation=*/false);
}

}  // namespace trainplan::executor::fp8
