// Mixture-of-experts routing and MLP (see moe.hpp).

#include "moe.hpp"

#include <cmath>
#include <stdexcept>

#include <torch/csrc/autograd/custom_function.h>

namespace trainplan::executor {

namespace {

// Identity on the block's output whose backward also feeds `aux` the gradient `scale`, as if
// scale x aux had been added to the loss (Megatron-Core's MoEAuxLossAutoScaler).
struct AttachAuxLoss : torch::autograd::Function<AttachAuxLoss> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& out, const at::Tensor& aux, double scale) {
    ctx->saved_data["scale"] = scale;
    return out.view_as(out);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const double scale = ctx->saved_data["scale"].toDouble();
    return {grads[0], at::full({}, scale, at::TensorOptions().dtype(at::kFloat).device(grads[0].device())), at::Tensor()};
  }
};

}  // namespace

int64_t expert_capacity(int64_t tokens, int top_k, int experts, double capacity_factor) {
  if (capacity_factor <= 0) return 0;
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(capacity_factor * static_cast<double>(tokens * top_k) / experts)));
}

Routing route(const at::Tensor& logits, int top_k, int64_t capacity) {
  Routing r;
  r.probs = at::softmax(logits.to(at::kFloat), -1);
  auto [top, index] = at::topk(r.probs, top_k, -1);  // sorted, most probable first
  r.experts = index;
  r.weights = top / top.sum(-1, /*keepdim=*/true);
  if (capacity <= 0) {
    r.kept = at::ones_like(index, at::TensorOptions().dtype(at::kBool));
    return r;
  }
  const int64_t experts = logits.size(-1);
  // Each assignment's place in its expert's queue: first choices of tokens 0..T-1, then second
  // choices, and so on (GShard).
  const at::Tensor one_hot = at::one_hot(index.detach().t().reshape({-1}), experts);  // [k T, E]
  const at::Tensor place = (one_hot.cumsum(0) * one_hot).sum(-1) - 1;                // [k T]
  r.kept = (place < capacity).reshape({top_k, -1}).t().contiguous();
  return r;
}

at::Tensor load_balancing_loss(const Routing& r) {
  const int64_t tokens = r.probs.size(0), experts = r.probs.size(1), k = r.experts.size(1);
  const at::Tensor counts = at::one_hot(r.experts.reshape({-1}), experts).sum(0).to(at::kFloat);  // assignments per expert
  const at::Tensor share = counts / static_cast<double>(tokens * k);                              // f_e
  return static_cast<double>(experts) * (share * r.probs.mean(0)).sum();
}

at::Tensor moe_mlp(const costmodel::MoeSpec& moe, const at::Tensor& x, const std::vector<at::Tensor>& p, const MoeRun& run) {
  const int experts = moe.experts;
  if (static_cast<int>(p.size()) != 1 + 3 * experts) throw std::logic_error("moe_mlp: router and 3 matrices per expert expected");
  const int64_t h = x.size(-1);
  const at::Tensor flat = x.reshape({-1, h});
  const int64_t tokens = flat.size(0);
  const Routing r = route(at::linear(flat, p[0]), moe.top_k, expert_capacity(tokens, moe.top_k, experts, moe.capacity_factor));
  at::Tensor out = at::zeros_like(flat);
  // The assignments grouped by expert with one read of the counts to the host (not one per
  // expert): a stable sort keeps them in token order within each expert; dropped ones sort last.
  const int k = moe.top_k;
  const at::Tensor chosen = r.experts.masked_fill(r.kept.logical_not(), experts).reshape({-1});  // [T k]
  const at::Tensor order = std::get<1>(at::sort(chosen, /*stable=*/std::optional<bool>(true), /*dim=*/0));
  const at::Tensor counts = at::bincount(chosen, {}, experts + 1).cpu();
  const at::Tensor weights = r.weights.reshape({-1});
  int64_t start = 0;
  for (int e = 0; e < experts; ++e) {
    const int64_t n = counts[e].item<int64_t>();
    if (n == 0) continue;
    const at::Tensor assignment = order.narrow(0, start, n);
    start += n;
    const at::Tensor token = assignment.div(k, "floor");
    const at::Tensor in = flat.index_select(0, token);
    const at::Tensor &gate = p[1 + 3 * e], &up = p[2 + 3 * e], &down = p[3 + 3 * e];
    const at::Tensor y = at::linear(at::silu(at::linear(in, gate)) * at::linear(in, up), down);
    out = out.index_add(0, token, y * weights.index_select(0, assignment).unsqueeze(1).to(y.scalar_type()));
  }
  const bool attach = run.aux_scale != 0 && at::GradMode::is_enabled();
  if (run.tally == nullptr && !attach) return out.view_as(x);
  const at::Tensor aux = load_balancing_loss(r);
  if (run.tally != nullptr) {
    MoeTally& t = *run.tally;
    const auto add = [](at::Tensor& sum, const at::Tensor& v) { sum = sum.defined() ? sum + v : v; };
    add(t.dropped, counts[experts].to(at::kDouble));
    add(t.aux_sum, aux.detach().to(at::kDouble));
    t.assignments += static_cast<double>(r.kept.numel());
    ++t.layer_passes;
  }
  out = out.view_as(x);
  return attach ? AttachAuxLoss::apply(out, aux, run.aux_scale) : out;
}

}  // namespace trainplan::executor
