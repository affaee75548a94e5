// Layout-independent dropout (see dropout.hpp).

#include "dropout.hpp"

#include <cmath>

#include <torch/csrc/autograd/custom_function.h>

namespace trainplan::executor {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Logical shift right of int64 values (ATen's >> is arithmetic).
at::Tensor shift_right(const at::Tensor& z, int bits) {
  return at::bitwise_and(at::bitwise_right_shift(z, bits), static_cast<int64_t>((~0ULL) >> bits));
}

// SplitMix64's finaliser on int64 tensors (multiplication wraps modulo 2^64 as on uint64).
at::Tensor mix(at::Tensor z) {
  z = at::bitwise_xor(z, shift_right(z, 30)).mul_(static_cast<int64_t>(0xBF58476D1CE4E5B9ULL));
  z = at::bitwise_xor(z, shift_right(z, 27)).mul_(static_cast<int64_t>(0x94D049BB133111EBULL));
  return at::bitwise_xor(z, shift_right(z, 31));
}

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

struct DropoutFn : torch::autograd::Function<DropoutFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& keep, double scale) {
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({keep});
    return x * keep * scale;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor keep = ctx->get_saved_variables()[0];
    return {grads[0] * keep * ctx->saved_data["scale"].toDouble(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

uint64_t dropout_site(int layer, uint64_t site) { return static_cast<uint64_t>(layer + 1) * 16 + site; }

at::Tensor dropout_keep(const at::Tensor& samples, const at::Tensor& positions, int64_t feature_offset, int64_t width, uint64_t seed,
                        uint64_t site, double rate) {
  const auto key = static_cast<int64_t>(mix(mix(seed ^ 0x5EEDD7090D7ULL) + site));
  const auto options = samples.options().dtype(at::kLong);
  const at::Tensor per_sample = mix(samples.to(at::kLong).add(key)).view({-1, 1, 1});
  const at::Tensor per_token = mix(at::bitwise_xor(per_sample, positions.to(options.device()).to(at::kLong).view({1, -1, 1})));
  const at::Tensor features = at::arange(feature_offset, feature_offset + width, options).view({1, 1, -1});
  const at::Tensor z = mix(at::bitwise_xor(per_token, features));
  // The top 53 bits as a uniform number in [0, 1): kept where it is >= rate.
  const auto threshold = static_cast<int64_t>(std::ldexp(rate, 53));
  return shift_right(z, 11).ge(threshold);
}

at::Tensor dropout(const at::Tensor& x, const DropoutRun& run, double rate, uint64_t site, const at::Tensor& positions, int64_t feature_offset) {
  if (rate <= 0 || !run.active()) return x;
  const at::Tensor keep = dropout_keep(run.samples.to(x.device()), positions.to(x.device()), feature_offset, x.size(-1), run.seed, site, rate);
  return DropoutFn::apply(x, keep, 1.0 / (1.0 - rate));
}

}  // namespace trainplan::executor
