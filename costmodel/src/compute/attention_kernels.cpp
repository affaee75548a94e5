// FlashAttention-2's and FlashAttention-3's published kernel rates (KernelRates with
// AttentionImpl::kFlash2, kFlash3). The papers
// count a forward as 4 s^2 d heads FLOPs, half of it for a causal kernel, and a backward as 2.5
// times its forward; the rates below are TFLOP/s on that count, at batch x seq = 16K tokens and
// hidden 2048 (Dao 2023 and Shah et al. 2024, Sec. 4.1), for head sizes 64 and 128 at seq 512,
// 1K, 2K, 4K, 8K and 16K, and on H100 the forward at head size 256 too. Longer sequences take
// the 16K rate (the kernels are compute-bound there); other head sizes interpolate in log d
// between the published ones and clamp outside (a backward above 128 takes 128's rate: no
// backward at 256 is published).

#include <algorithm>
#include <array>
#include <cmath>

#include "trainplan/costmodel/kernels.hpp"

namespace trainplan::costmodel {

namespace {

constexpr std::array<double, 6> kSeqs = {512, 1024, 2048, 4096, 8192, 16384};
using Row = std::array<double, 6>;

// A100 80GB SXM4: forward + backward together (Dao 2023, "FlashAttention-2", arXiv 2307.08691,
// Fig. 4, FlashAttention-2 bars; the paper prints no per-pass rate, so both passes take the joint
// rate, which gives their summed time exactly). Labels hidden by the legend (hd64 non-causal 1K,
// hd128 non-causal 512 and 1K) were read from the bars' heights: 153, 151, 173.
constexpr Row kA100Causal64 = {88, 119, 140, 156, 165, 171};
constexpr Row kA100Causal128 = {99, 133, 155, 173, 182, 189};
constexpr Row kA100Full64 = {132, 153, 162, 171, 175, 176};
constexpr Row kA100Full128 = {151, 173, 187, 196, 201, 203};

// H100 SXM5: FlashAttention-2 as the baseline of Shah et al. 2024, "FlashAttention-3", arXiv
// 2407.08608v2, Fig. 5 (forward, causal and not) and Fig. 6 (backward, non-causal only).
constexpr Row kH100ForwardCausal64 = {180, 229, 262, 284, 295, 299};
constexpr Row kH100ForwardCausal128 = {191, 260, 298, 319, 333, 335};
constexpr Row kH100ForwardFull64 = {282, 306, 318, 321, 322, 324};
constexpr Row kH100ForwardFull128 = {309, 350, 362, 368, 370, 370};
constexpr Row kH100ForwardCausal256 = {208, 251, 278, 293, 297, 298};
constexpr Row kH100ForwardFull256 = {275, 313, 321, 323, 324, 326};
constexpr Row kH100BackwardFull64 = {198, 238, 264, 279, 287, 291};
constexpr Row kH100BackwardFull128 = {214, 260, 291, 310, 318, 322};
// No causal backward is published; it is taken as the non-causal backward times the forward's
// causal / non-causal ratio at the same length. At hd128 and 8K that gives 286 TFLOP/s and a
// forward + backward rate of 298, against 308 in the FlashAttention-2 paper's H100 chart
// (Dao 2023, Fig. 7: causal, hd128, 8K).

// H100 SXM5: FlashAttention-3 in bf16/fp16, the same figures of Shah et al. 2024 (Fig. 5 forward,
// causal and not; Fig. 6 backward, non-causal), FlashAttention-3 bars. At 512 non-causal hd128
// the chart's labels of FlashAttention-3 (467) and cuDNN (497) stand close; as at every other
// head size at 512, cuDNN's is the higher. Fig. 5's head-size-256 panels were read the same way;
// their FlashAttention-2 bars are the ones above.
constexpr Row kFa3ForwardCausal64 = {197, 265, 371, 420, 460, 473};
constexpr Row kFa3ForwardCausal128 = {292, 423, 521, 579, 602, 616};
constexpr Row kFa3ForwardFull64 = {333, 392, 460, 476, 496, 497};
constexpr Row kFa3ForwardFull128 = {467, 565, 625, 638, 646, 648};
constexpr Row kFa3ForwardCausal256 = {286, 427, 537, 612, 628, 642};
constexpr Row kFa3ForwardFull256 = {482, 639, 707, 736, 746, 756};
constexpr Row kFa3BackwardFull64 = {272, 363, 422, 453, 472, 474};
constexpr Row kFa3BackwardFull128 = {316, 424, 501, 542, 559, 561};

double at_seq(const Row& r, double seq) {
  if (seq <= kSeqs.front()) return r.front();
  if (seq >= kSeqs.back()) return r.back();
  const auto hi = static_cast<std::size_t>(std::upper_bound(kSeqs.begin(), kSeqs.end(), seq) - kSeqs.begin());
  const double f = std::log(seq / kSeqs[hi - 1]) / std::log(kSeqs[hi] / kSeqs[hi - 1]);
  return r[hi - 1] + f * (r[hi] - r[hi - 1]);
}

// Between head sizes 64 and 128 in log d, and on to 256 where that row is published; clamped.
double at(const Row& r64, const Row& r128, double d, double seq, const Row* r256 = nullptr) {
  if (r256 != nullptr && d > 128.0) {
    const double f = std::min(1.0, std::log2(d / 128.0));
    return at_seq(r128, seq) + f * (at_seq(*r256, seq) - at_seq(r128, seq));
  }
  const double f = std::clamp(std::log2(std::max(d, 1.0) / 64.0), 0.0, 1.0);
  return at_seq(r64, seq) + f * (at_seq(r128, seq) - at_seq(r64, seq));
}

}  // namespace

std::optional<double> flash2_rate(int generation, double d, double seq, bool causal, bool backward) {
  double tflops = 0;
  if (generation == 1) {
    tflops = causal ? at(kA100Causal64, kA100Causal128, d, seq) : at(kA100Full64, kA100Full128, d, seq);
  } else if (generation == 2) {
    if (!backward) {
      tflops = causal ? at(kH100ForwardCausal64, kH100ForwardCausal128, d, seq, &kH100ForwardCausal256)
                      : at(kH100ForwardFull64, kH100ForwardFull128, d, seq, &kH100ForwardFull256);
    } else {
      tflops = at(kH100BackwardFull64, kH100BackwardFull128, d, seq);
      if (causal) tflops *= at(kH100ForwardCausal64, kH100ForwardCausal128, d, seq) / at(kH100ForwardFull64, kH100ForwardFull128, d, seq);
    }
  } else {
    return std::nullopt;
  }
  return tflops * 1e12;
}

std::optional<double> flash3_rate(int generation, double d, double seq, bool causal, bool backward) {
  if (generation != 2) return std::nullopt;
  double tflops = 0;
  if (!backward) {
    tflops = causal ? at(kFa3ForwardCausal64, kFa3ForwardCausal128, d, seq, &kFa3ForwardCausal256)
                    : at(kFa3ForwardFull64, kFa3ForwardFull128, d, seq, &kFa3ForwardFull256);
  } else {
    // No causal backward is published for FlashAttention-3 either: the non-causal backward times
    // the forward's causal / non-causal ratio, as for FlashAttention-2 above.
    tflops = at(kFa3BackwardFull64, kFa3BackwardFull128, d, seq);
    if (causal) tflops *= at(kFa3ForwardCausal64, kFa3ForwardCausal128, d, seq) / at(kFa3ForwardFull64, kFa3ForwardFull128, d, seq);
  }
  return tflops * 1e12;
}

namespace {
struct ImplName {
  AttentionImpl impl;
  const char* name;
};
constexpr ImplName kImplNames[] = {{AttentionImpl::kProfile, "profile"}, {AttentionImpl::kFlash2, "flash2"}, {AttentionImpl::kFlash3, "flash3"}};
}  // namespace

const char* attention_impl_name(AttentionImpl impl) {
  for (const ImplName& n : kImplNames) {
    if (n.impl == impl) return n.name;
  }
  return "profile";
}

std::optional<AttentionImpl> attention_impl_from_name(const std::string& name) {
  for (const ImplName& n : kImplNames) {
    if (name == n.name) return n.impl;
  }
  return std::nullopt;
}

const char* attention_impl_choices() { return "profile | flash2 | flash3"; }

}  // namespace trainplan::costmodel
