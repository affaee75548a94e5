#include "trainplan/costmodel/stack.hpp"

namespace trainplan::costmodel {

namespace {

// Optimizer bytes per fp32 parameter (fused mixed-precision AdamW moves 32):
//  trainplan (--kernels fused): at::_fused_adamw_ over each unit's flat fp32 buffers (32); the
//    rest: gradient norm with one _foreach_norm (4), zeroing the fp32 gradients (4), copying the
//    fp32 masters into the bf16 weights (6) = 14; about 1 launch per parameter tensor.
//  trainplan-reference (--kernels reference, the executor before its fused paths): AdamW as ATen
//    ops over each unit's flat fp32 buffers (engine.cpp optimizer_step): g = grad * c (8), exp_avg
//    mul_ (8) and add_ (12), exp_avg_sq mul_ (8) and addcmul_ (16), sqrt (8), division (8), + eps
//    (8), decay mul_ (8), addcdiv_ (16), copy into the bf16 weights (6) = 106 = 3.31 x 32; the
//    rest: gradient norm pow + sum (12), zeroing (4) = 16; about 5 launches per parameter tensor
//    (per-slot decay and norm ops).
//  pytorch-eager / torch-compile (bench/eager_reference.py): fused AdamW (32); the rest:
//    master.grad = w.grad.float() (6), clip_grad_norm_ foreach norm and scale (4 + 8),
//    _foreach_copy_ into the bf16 weights (6) = 24.
//  megatron-te: distributed fused Adam (32); the rest: norm (4), copy of the main params into the
//    bf16 weights (6) = 10.
// Host time per kernel: 9.2 us for one eager op issued from Python on the H100 host
// (shared/data/measured/h100-llama3.2-1b/h100_elementwise.csv, launch_tiny_add); LibTorch from
// C++ skips the interpreter: 5 us assumed; Inductor's generated wrapper: 4 us assumed.
// fp8 casts (Fp8Casting, bytes per element beyond the bf16 path):
//  torchao tensorwise dynamic scaling (torchtitan's float8; pytorch-eager, torch-compile), as
//    torchao/testing/float8/roofline_utils.py counts it: an input or output gradient takes an amax
//    pass (reads 2) and a cast reading 2 and writing fp8 twice (2), 6 in all; under Inductor the
//    amax pass fuses into the op that produced the tensor where that op is Inductor's, a norm or
//    the activation function (4); a weight, every micro-batch: amax (2) and the forward cast (3),
//    the backward's transposed cast (3). Eager casts run as more ATen ops than that: the roofline
//    is the least they move.
//  Megatron-LM with Transformer Engine (megatron-te) and its default --fp8-recipe delayed: the
//    scale comes from earlier steps' amax, taken in the cast kernel itself: cast_transpose reads 2
//    and writes 2 (4). The Q/K/V and fc1 GEMMs are TE LayerNormLinear modules, whose norm writes
//    fp8 itself (1 byte less than bf16) and whose transposed copy reads 1 and writes 1 (net 1).
//    The activation function is Megatron's own (bias_swiglu_impl, bias_gelu_impl) and writes bf16,
//    so fc2's input and fc1's output gradient are cast by fc2's and fc1's modules (4). The fp8
//    weights are cast on the first micro-batch and kept for the step (0 per micro-batch).
//  The executor does not train in fp8 (trainer.cpp): trainplan and trainplan-reference take
//    torchao's unfused casts.
constexpr Fp8Casting kTorchaoEager{6, 6, 6, 6, 6, 5, 3};
constexpr Fp8Casting kTorchaoCompiled{6, 4, 4, 6, 4, 5, 3};
constexpr Fp8Casting kTransformerEngine{4, 1, 4, 4, 4, 0, 0};

constexpr StackSpec kSpecs[] = {
    // The fused paths (executor --kernels fused, the default). Norms: ATen's fused rms_norm
    // forward, recomputed in backward, and one CUDA kernel for the backward (NormLinearsFn);
    // rotary and SwiGLU: one CUDA kernel each way (cuda_kernels.cu); the residual adds go into
    // the norms' kernels (backward: both forks; forward: x + the attention branch), and the block's
    // output add stays an ATen add, a single kernel moving the same 3 bytes per element as a fused
    // add, so fused_elementwise holds for every element-wise op of the block. SwiGLU keeps gate and up only (2): silu(gate)
    // * up is recomputed in the backward kernel. Under ZeRO-0/1 without TP every gradient goes
    // straight into the fp32 buffer from the GEMM (or kernel) that computes it; the Q/K/V and
    // gate/up input gradients are summed by their GEMMs (beta = 1).
    {Stack::kTrainplan, "trainplan",
     "trainplan executor (--kernels fused): fused rotary, SwiGLU and RMSNorm-backward kernels, norms recomputed in backward, "
     "residual adds in the norms, "
     "separate Q/K/V and gate/up GEMMs, chunked linear cross-entropy, gradients accumulated in fp32 by the GEMMs (ZeRO-0/1, "
     "no TP), fused AdamW, the loss read once per step",
     true, false, false, LossKernel::kChunkedFused, GradAccumulation::kFusedInGemmUnsharded, true, 1, 14, 1, 2, true, true, true, false, 5e-6, 1, ContextAttention::kAllGatherKv, false, kTorchaoEager,
     "executor/src/model.cpp (block_forward with Kernels::kFused: norm_linears, rotary_embedding, swiglu_down; head_loss: "
     "linear_cross_entropy), executor/src/fused_ops.cpp (NormLinearsFn, RotaryFn, SwigluDownFn, LinearCrossEntropyFn), "
     "executor/src/cuda_kernels.cu, executor/src/engine.cpp (grad_sums / fused_accumulation, else an fp32 gradient add per micro-batch; fused_optimizer_step: "
     "at::_fused_adamw_, gradient_norm: _foreach_norm, one .item() per step)"},
    // The plain path (executor --kernels reference): the executor as it was before its fused
    // paths, and the stack of the H100 runs in tests/data/h100-llama3.2-1b.
    {Stack::kTrainplanReference, "trainplan-reference",
     "trainplan executor (--kernels reference, the executor before its fused paths): eager ATen kernels, separate Q/K/V and "
     "gate/up GEMMs, fp32 logits for the loss, unfused AdamW, fp32 gradient accumulation, one host sync per micro-batch",
     false, false, false, LossKernel::kFp32Copy, GradAccumulation::kFp32Buffer, false, 106.0 / 32.0, 16, 5, 4, false, false, false, true, 5e-6, 1, ContextAttention::kAllGatherKv, false, kTorchaoEager,
     "executor/src/model.cpp (block_forward with Kernels::kReference: at::rms_norm, three at::linear for q/k/v, rotate-half "
     "rotary, at::silu(gate) * up, head_loss: logits .to(kFloat) then at::cross_entropy_loss), executor/src/engine.cpp "
     "(fp32 gradient add per micro-batch, ATen AdamW), executor/src/engine.cpp forward_chunk (loss.item() per micro-batch)"},
    {Stack::kPytorchEager, "pytorch-eager",
     "PyTorch eager module: same kernels as trainplan-reference, bf16 .grad accumulation, fused AdamW on fp32 masters",
     false, false, false, LossKernel::kFp32Copy, GradAccumulation::kParamDtype, true, 1, 24, 0.5, 4, false, false, false, false, 9.2e-6, 1, ContextAttention::kRing, true, kTorchaoEager,
     "bench/eager_reference.py (nn.RMSNorm, nn.Linear q/k/v, rotate-half rotary, F.silu(gate) * up, "
     "F.cross_entropy(logits.float()), torch.optim.AdamW(fused=True), clip_grad_norm_(foreach=True))"},
    {Stack::kTorchCompile, "torch-compile",
     "torch.compile (Inductor): element-wise work fused around the same GEMMs, fused cross-entropy, fused AdamW",
     true, false, false, LossKernel::kFused, GradAccumulation::kParamDtype, true, 1, 24, 0.5, 2, false, false, false, false, 4e-6, 1, ContextAttention::kRing, true, kTorchaoCompiled,
     "PyTorch 2 Inductor fuses pointwise and reduction ops and its min-cut partitioner recomputes cheap "
     "pointwise results in backward (Ansel et al. 2024, ASPLOS, Sec. 5); measured on H100: 66.7 K tokens/s and "
     "29.9 GiB peak for Llama 3.2 1B at micro-batch 4 against 54.1 K and 41.6 GiB eager (issue 12)"},
    {Stack::kMegatronTe, "megatron-te",
     "Megatron-Core + Transformer Engine: fused norms, RoPE and SwiGLU, fused QKV and fc1 GEMMs, "
     "fp32 main grads accumulated in the wgrad GEMM, distributed fused Adam, vocab padded to 128 x tp",
     true, true, true, LossKernel::kMegatronFp32, GradAccumulation::kFusedInGemm, true, 1, 10, 0.3, 3, false, false, false, false, 9.2e-6, 128, ContextAttention::kRing, false, kTransformerEngine,
     "Megatron-LM (NVIDIA/Megatron-LM: --make-vocab-size-divisible-by 128, gradient_accumulation_fusion, "
     "distributed optimizer, vocab_parallel_cross_entropy in fp32); Transformer Engine LayerNormLinear, "
     "fused RoPE and SwiGLU; Narayanan et al. 2021, Korthikanti et al. 2022"},
};

}  // namespace

const StackSpec& stack_spec(Stack stack) {
  for (const StackSpec& s : kSpecs) {
    if (s.stack == stack) return s;
  }
  return kSpecs[0];
}

const char* stack_name(Stack stack) { return stack_spec(stack).name; }

std::optional<Stack> stack_from_name(const std::string& name) {
  for (const StackSpec& s : kSpecs) {
    if (name == s.name) return s.stack;
  }
  return std::nullopt;
}

const char* stack_choices() { return "trainplan | trainplan-reference | pytorch-eager | torch-compile | megatron-te"; }

}  // namespace trainplan::costmodel
