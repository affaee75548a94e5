#pragma once
// Internal to the cost model's compute.cpp and ends_cost.cpp: the kernels of one micro-batch as
// they are added up (Pass), and the predicates both ask of a stack.

#include <algorithm>
#include <cmath>

#include "trainplan/costmodel/compute.hpp"

namespace trainplan::costmodel::compute_detail {

inline constexpr double kMiB = 1048576.0;

inline Dtype activation_dtype(Precision p) {
  return p == Precision::kFp32 ? Dtype::kFp32 : (p == Precision::kFp16 ? Dtype::kFp16 : Dtype::kBf16);
}

// What produced a linear layer's input, or its output's gradient, which fp8 training casts
// (stack.hpp Fp8Casting): a norm or the activation function (its backward for the gradient) may
// write the fp8 copy itself or take the amax pass into its own; otherwise the cast is a kernel of
// its own; kShared: an input the previous linear of its group (Q/K/V, gate/up) already cast, when
// the stack casts a shared input once (Fp8Casting::shared_input_cast_once), else the norm's.
enum class Fp8Cast { kOwn, kFromNorm, kFromActivation, kShared };

// The kernels of one layer (or of the ends) for one micro-batch: forward and backward time and
// the number of launches.
struct Pass {
  const KernelRates& gemm_rates;  // linear layers (fp8 GEMMs when training in fp8)
  const KernelRates& rates;       // everything else, in the activation dtype
  const StackSpec& stack;
  double operand_bytes;           // bytes per element of a linear layer's operands
  double e;                       // bytes per activation element
  bool fp8 = false;               // linear layers quantise their operands (precision fp8)
  double forward = 0, backward = 0, kernels = 0;
  // fp8: the forward time of casting inputs a norm or the activation function produced, which a
  // recompute of those ops runs again.
  double pointwise_input_casts = 0;
  double last_gemm_forward = 0;  // the forward GEMM of the last linear added (its fp8 casts apart)
  // torch.autocast on the fp32 module (LayerSetting::autocast): every linear layer casts its fp32
  // weight to the 16-bit dtype in forward (autocast's cached_cast, aten/src/ATen/autocast_mode.cpp;
  // a cache per autocast region, so once per micro-batch and again in a recompute) and autograd
  // casts the weight's 16-bit gradient back to fp32 (ToCopyBackward) before it reaches .grad.
  // Eager casts at ATen's measured copy rates (ElementwiseOp::kCast: bf16 -> fp32 its forward,
  // fp32 -> bf16 its backward), Inductor's as one kernel reading 4 bytes and writing 2 each way.
  // Under fp8 torchao's Float8Linear casts the fp32 weight to fp8 itself: its amax and cast read 4
  // bytes an element instead of 2 (4 more forward, 2 more for the transposing cast backward).
  bool autocast = false;
  // The casts run as ATen ops in a fusing stack too (torchtitan compiles its blocks and loss only:
  // its final norm and output layer run eagerly).
  bool casts_eager = false;
  double autocast_weight_forward = 0;  // forward time of the weight casts, which a recompute runs again
  double autocast_input_forward = 0;   // forward time of the eager input casts, likewise
  double autocast_seconds = 0;         // every autocast cast of the pass, forward and backward

  // y[T, out] = x[T, in] W[out, in]^T. Backward: dX (unless the input needs no gradient) and,
  // unless the weight is frozen, dW = dY^T X (PyTorch's orientation: out x in, contracting T).
  // The operands' leading dimensions are the features (in and out), never the tokens, so only
  // they decide whether the GEMMs run at the aligned rate (a 50257-row output layer does not).
  // In fp8 the input, the output's gradient and the weight are cast first (stack.fp8).
  void linear(double tokens, double out, double in, bool frozen, bool input_grad = true, Fp8Cast input = Fp8Cast::kOwn,
              Fp8Cast grad_output = Fp8Cast::kOwn) {
    gemms(gemm_rates, operand_bytes, tokens, out, in, frozen, input_grad);
    if (autocast && fp8 && !frozen) {  // the wider reads inside torchao's casts: no launches of their own
      const double f = rates.stream(out * in * 4.0, 0), b = rates.stream(out * in * 2.0, 0);
      forward += f;
      backward += b;
      autocast_weight_forward += f;
      autocast_seconds += f + b;
      autocast_gradient_cast(out * in);
    } else if (autocast) {
      autocast_weight_cast(out * in, frozen);
    }
    if (!fp8) return;
    // A norm that takes the amax in its own kernel saves the cast that kernel (Fp8Casting::kernels_per_cast).
    const int norm_kernels = std::max(1, stack.fp8.kernels_per_cast - 1);
    const double input_cast = cast(forward, tokens * in * input_bytes(input), input == Fp8Cast::kFromNorm ? norm_kernels : stack.fp8.kernels_per_cast);
    if (input != Fp8Cast::kOwn) pointwise_input_casts += input_cast;
    cast(forward, out * in * stack.fp8.weight_forward);
    const Fp8Casting& c = stack.fp8;
    if (input_grad || !frozen) {
      cast(backward, tokens * out * (grad_output == Fp8Cast::kFromActivation ? c.grad_output_from_activation : c.grad_output), c.kernels_per_cast);
      cast(backward, out * in * c.weight_backward);
    }
    if (!frozen && c.weight_gradient_add > 0) {  // an element-wise add at the stream rate
      backward += rates.stream(out * in * c.weight_gradient_add);
      kernels += 1;
    }
  }
  // Bytes per element of casting an input that `from` produced to fp8 (stack.fp8).
  double input_bytes(Fp8Cast from) const {
    const Fp8Casting& c = stack.fp8;
    if (from == Fp8Cast::kShared) return c.shared_input_cast_once ? 0.0 : c.input_from_norm;
    return from == Fp8Cast::kFromNorm ? c.input_from_norm : from == Fp8Cast::kFromActivation ? c.input_from_activation : c.input;
  }
  // A linear layer that stays in the activation dtype when the others train in fp8 (the output
  // layer, a router, LoRA adapters): no casts.
  void linear_unquantised(double tokens, double out, double in, bool frozen, bool input_grad = true) {
    gemms(rates, e, tokens, out, in, frozen, input_grad);
    if (autocast) autocast_weight_cast(out * in, frozen);
  }
  bool fused_casts() const { return stack.fused_elementwise && !casts_eager; }
  // Autocast's cast of a weight of `elements` to the 16-bit dtype, and of its gradient back.
  void autocast_weight_cast(double elements, bool frozen) {
    const double f = fused_casts() ? rates.stream(6.0 * elements) : rates.op(ElementwiseOp::kCast, elements, true, 2.0);
    forward += f;
    kernels += 1;
    autocast_weight_forward += f;
    autocast_seconds += f;
    if (!frozen) autocast_gradient_cast(elements);
  }
  void autocast_gradient_cast(double elements) {
    const double b = fused_casts() ? rates.stream(6.0 * elements) : rates.op(ElementwiseOp::kCast, elements, false, 2.0);
    backward += b;
    kernels += 1;
    autocast_seconds += b;
  }
  // Eager autocast: `count` linear layers each cast their fp32 input of `elements` to the 16-bit
  // dtype (one copy per layer: autocast caches only leaf tensors), and each input's 16-bit
  // gradient is cast back to fp32 to join the fp32 tensor's others. Inductor fuses these casts
  // into the norms that produce the inputs and the sums that take the gradients: none there.
  void autocast_inputs(double count, double elements) {
    if (!autocast || fused_casts() || count <= 0 || elements <= 0) return;
    const double f = count * rates.op(ElementwiseOp::kCast, elements, true, 2.0);
    const double b = count * rates.op(ElementwiseOp::kCast, elements, false, 2.0);
    forward += f;
    backward += b;
    kernels += 2.0 * count;
    autocast_input_forward += f;
    autocast_seconds += f + b;
  }
  // Eager autocast: a 16-bit branch output (attention's, the MLP's) added to the fp32 residual
  // stream; autograd casts the stream's fp32 gradient to the branch's dtype (the engine's
  // validate_outputs) before the branch's backward.
  void autocast_branch(double elements) {
    if (!autocast || fused_casts() || elements <= 0) return;
    const double b = rates.op(ElementwiseOp::kCast, elements, true, 2.0);
    backward += b;
    kernels += 1;
    autocast_seconds += b;
  }
  void gemms(const KernelRates& r, double bytes, double tokens, double out, double in, bool frozen, bool input_grad) {
    const bool aligned = gemm_aligned(out, bytes) && gemm_aligned(in, bytes);
    last_gemm_forward = r.gemm(tokens, out, in, 1, bytes, aligned);
    forward += last_gemm_forward;
    kernels += 1;
    if (input_grad) {
      backward += r.gemm(tokens, in, out, 1, bytes, aligned);
      kernels += 1;
    }
    if (!frozen) {
      backward += r.gemm(out, in, tokens, 1, bytes, aligned);
      kernels += 1;
    }
  }
  // Adds a cast moving `bytes` in `launches` kernels to `time` at the stack's cast rate; returns
  // its time.
  double cast(double& time, double bytes, int launches = 1) {
    if (bytes <= 0) return 0.0;
    const double t = rates.stream(bytes, launches) / stack.fp8.rate;
    time += t;
    kernels += launches;
    return t;
  }
  // An element-wise op over `elements` elements: PyTorch's eager kernels at their measured rates,
  // or, in a fusing stack, one kernel each way moving `fused_forward` / `fused_backward` bytes per
  // element (multiples of the element size; 0: no kernel).
  // `element_bytes`: the eager op's element size where it differs from the activations' (0: e).
  void elementwise(ElementwiseOp op, double elements, double fused_forward, double fused_backward, bool with_backward = true,
                   double element_bytes = 0, double backward_element_bytes = 0) {
    if (elements <= 0) return;
    if (stack.fused_elementwise) {
      if (fused_forward > 0) {
        forward += rates.stream(elements * fused_forward);
        kernels += 1;
      }
      if (with_backward && fused_backward > 0) {
        backward += rates.stream(elements * fused_backward);
        kernels += 1;
      }
      return;
    }
    const ElementwiseOpInfo& info = elementwise_op_info(op);
    const double width = element_bytes > 0 ? element_bytes : e;
    forward += rates.op(op, elements, false, width);
    kernels += info.forward_kernels;
    if (with_backward) {
      backward += rates.op(op, elements, true, backward_element_bytes > 0 ? backward_element_bytes : width);
      kernels += info.backward_kernels;
    }
  }
  // Autograd's sum of two gradients reaching one tensor (a residual junction, an input shared
  // by two GEMMs): one add in backward.
  void gradient_sum(double elements, double element_bytes = 0) {
    if (elements <= 0) return;
    const double width = element_bytes > 0 ? element_bytes : e;
    backward += stack.fused_elementwise ? rates.stream(3.0 * width * elements) : rates.op(ElementwiseOp::kResidualAdd, elements, false, width);
    kernels += 1;
  }
  // LoRA adapter x A B on a linear from `in` to `out` features, rank r (A, B trainable).
  void adapter(double tokens, double in, double out, double r) {
    linear_unquantised(tokens, r, in, false);
    linear_unquantised(tokens, out, r, false);
    gradient_sum(tokens * in);
  }
};

// The trainplan executor (any path) runs its own code, whichever kernels it uses.
// A block's norm: LayerNorm, or RMSNorm as one fused kernel or as transformers' LlamaRMSNorm
// (StackSpec::unfused_rms_norm), and the bytes per element it keeps for backward: its input, or
// LlamaRMSNorm's float32 copy and the normalised tensor (4 + e).
inline bool unfused_norm(const ModelFeatures& feat, const StackSpec& stack) { return !feat.layer_norm && stack.unfused_rms_norm; }
inline ElementwiseOp norm_op(const ModelFeatures& feat, const StackSpec& stack) {
  return feat.layer_norm ? ElementwiseOp::kLayerNorm : unfused_norm(feat, stack) ? ElementwiseOp::kRmsNormUnfused : ElementwiseOp::kRmsNorm;
}
inline double norm_saved_bytes(const ModelFeatures& feat, const StackSpec& stack, double e) { return unfused_norm(feat, stack) ? 4.0 + e : e; }
// The element sizes Pass::elementwise prices a block norm at, forward and backward, for a residual
// stream of `es` bytes an element (float32 under autocast): the fused norm reads and writes it;
// transformers' LlamaRMSNorm of a float32 input skips its two casts (.to(float32) and back are no-ops),
// 28 bytes an element forward against its 36 in bf16, and moves its 92 backward (kernels.cpp).
struct NormWidths {
  double forward, backward;
};
inline NormWidths norm_widths(const ModelFeatures& feat, const StackSpec& stack, double e, double es) {
  if (!unfused_norm(feat, stack)) return {es, es};
  return {es > e ? e * 28.0 / 36.0 : e, e};
}

inline bool is_trainplan(Stack stack) { return stack == Stack::kTrainplan || stack == Stack::kTrainplanReference; }

// Gradients added into the fp32 gradient by the kernels that compute them (stack.hpp,
// kFusedInGemmUnsharded): the executor's fused path under ZeRO-0/1 without TP, weights trained
// (with or without context parallelism: engine.cpp fused_accumulation).
inline bool gradients_in_gemm(const StackSpec& stack, const LayerSetting& s) {
  const bool lora = s.mode == TrainingMode::kLora || s.mode == TrainingMode::kQlora;
  return stack.grads == GradAccumulation::kFusedInGemmUnsharded && !s.sharded_gradients && s.tp == 1 && !lora;
}

}  // namespace trainplan::costmodel::compute_detail
