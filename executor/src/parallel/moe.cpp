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

at::Tensor load_balancing_loss(const Routing& r, Communicator* sequence) {
  const int group = sequence == nullptr ? 1 : sequence->size();
  const int64_t tokens = r.probs.size(0) * group, experts = r.probs.size(1), k = r.experts.size(1);
  at::Tensor counts = at::one_hot(r.experts.reshape({-1}), experts).sum(0).to(at::kFloat).contiguous();  // assignments per expert
  if (group > 1) sequence->all_reduce_sum(counts)->wait();                                             // over the whole sequence
  const at::Tensor share = counts / static_cast<double>(tokens * k);                                    // f_e
  const at::Tensor mean_probability = r.probs.sum(0) / static_cast<double>(tokens);                     // this rank's part of P_e
  return static_cast<double>(experts * group) * (share * mean_probability).sum();
}

namespace {

// Rows of `x` ([n, h]) exchanged over `comm`: send_rows[j] rows to rank j, recv_rows[i] from rank
// i, in rank order. The backward sends the gradients back the way the rows came.
at::Tensor exchange_rows(Communicator& comm, const at::Tensor& x, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows) {
  const int64_t h = x.size(1);
  std::vector<int64_t> send_counts, recv_counts;
  int64_t rows = 0;
  for (int64_t n : send_rows) send_counts.push_back(n * h);
  for (int64_t n : recv_rows) {
    recv_counts.push_back(n * h);
    rows += n;
  }
  const at::Tensor in = x.contiguous();
  at::Tensor out = at::empty({rows, h}, in.options());
  comm.all_to_all(in, send_counts, out, recv_counts)->wait();
  return out;
}

// out[index[i]] += rows[i] into `tokens` zero rows, keeping only the index for backward
// (at::index_add keeps its source, one more [routed copies x h] tensor per layer).
struct ScatterAddRows : torch::autograd::Function<ScatterAddRows> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& index, int64_t tokens) {
    ctx->save_for_backward({index});
    return at::zeros({tokens, rows.size(1)}, rows.options()).index_add_(0, index, rows);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    return {grads[0].index_select(0, ctx->get_saved_variables()[0]), at::Tensor(), at::Tensor()};
  }
};

struct AllToAllRows : torch::autograd::Function<AllToAllRows> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t comm, std::vector<int64_t> send_rows,
                            std::vector<int64_t> recv_rows) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["send"] = send_rows;
    ctx->saved_data["recv"] = recv_rows;
    return exchange_rows(*reinterpret_cast<Communicator*>(comm), x, send_rows, recv_rows);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    auto* comm = reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
    const at::Tensor back = exchange_rows(*comm, grads[0], ctx->saved_data["recv"].toIntVector(), ctx->saved_data["send"].toIntVector());
    return {back, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor moe_mlp(const costmodel::MoeSpec& moe, const at::Tensor& x, const std::vector<at::Tensor>& p, const MoeRun& run,
                   const std::vector<at::Tensor>& grad_sums) {
  const int experts = moe.experts, k = moe.top_k;
  const int ep = run.ep == nullptr ? 1 : run.ep->size();
  const int local = experts / ep;  // this rank's experts: [ep rank x local, ...)
  if (static_cast<int>(p.size()) != 1 + 3 * local) throw std::logic_error("moe_mlp: router and 3 matrices per local expert expected");
  const int64_t h = x.size(-1);
  const at::Tensor flat = x.reshape({-1, h});
  const int64_t tokens = flat.size(0);
  if (!grad_sums.empty() && grad_sums.size() != p.size()) throw std::logic_error("moe_mlp: one gradient sum per parameter expected");
  const auto sum = [&](std::size_t i) { return grad_sums.empty() ? at::Tensor() : grad_sums[i]; };
  const Routing r = route(linear_into(flat, p[0], sum(0)), k, expert_capacity(tokens, k, experts, moe.capacity_factor));
  // The kept assignments grouped by expert with one read of the counts to the host: a stable sort
  // keeps them in token order within each expert; dropped ones sort last. Grouped by expert they
  // are grouped by the rank holding it, which is the dispatch's order.
  const at::Tensor chosen = r.experts.masked_fill(r.kept.logical_not(), experts).reshape({-1});  // [T k]
  const at::Tensor order = std::get<1>(at::sort(chosen, /*stable=*/std::optional<bool>(true), /*dim=*/0));
  const at::Tensor counts = at::bincount(chosen, {}, experts + 1).cpu();  // assignments per expert, then dropped
  const int64_t kept = tokens * k - counts[experts].item<int64_t>();
  const at::Tensor assignment = order.narrow(0, 0, kept);
  const at::Tensor token = assignment.div(k, "floor");
  at::Tensor rows = flat.index_select(0, token);  // [kept, h], by expert

  // Dispatch: rank j gets the rows of its experts; per_source[i][e] rows come from rank i for local expert e.
  std::vector<std::vector<int64_t>> per_source(static_cast<std::size_t>(ep), std::vector<int64_t>(static_cast<std::size_t>(local)));
  std::vector<int64_t> send_rows(static_cast<std::size_t>(ep), 0), recv_rows(static_cast<std::size_t>(ep), 0);
  const auto* c = counts.data_ptr<int64_t>();
  if (ep == 1) {
    for (int e = 0; e < local; ++e) per_source[0][static_cast<std::size_t>(e)] = c[e];
  } else {
    // Each rank tells each other how many rows of each of its experts it sends (ep x local int64).
    at::Tensor mine = counts.narrow(0, 0, experts).to(run.ep->device());
    at::Tensor theirs = at::empty({experts}, mine.options());
    run.ep->all_to_all(mine, std::vector<int64_t>(static_cast<std::size_t>(ep), local), theirs,
                       std::vector<int64_t>(static_cast<std::size_t>(ep), local))->wait();
    const at::Tensor host = theirs.cpu();
    for (int i = 0; i < ep; ++i) {
      for (int e = 0; e < local; ++e) per_source[static_cast<std::size_t>(i)][static_cast<std::size_t>(e)] = host.data_ptr<int64_t>()[i * local + e];
    }
    for (int j = 0; j < ep; ++j) {
      for (int e = j * local; e < (j + 1) * local; ++e) send_rows[static_cast<std::size_t>(j)] += c[e];
    }
    for (int i = 0; i < ep; ++i) {
      for (int64_t n : per_source[static_cast<std::size_t>(i)]) recv_rows[static_cast<std::size_t>(i)] += n;
    }
    rows = AllToAllRows::apply(rows, reinterpret_cast<int64_t>(run.ep), send_rows, recv_rows);
  }
  // The received rows come by source, then expert; the experts take theirs source by source.
  std::vector<int64_t> by_expert;  // received row of each expert-ordered row
  std::vector<int64_t> starts(static_cast<std::size_t>(ep * local), 0);
  for (int64_t i = 0, at_row = 0; i < ep; ++i) {
    for (int e = 0; e < local; ++e) {
      starts[static_cast<std::size_t>(i * local + e)] = at_row;
      at_row += per_source[static_cast<std::size_t>(i)][static_cast<std::size_t>(e)];
    }
  }
  for (int e = 0; e < local; ++e) {
    for (int i = 0; i < ep; ++i) {
      const int64_t from = starts[static_cast<std::size_t>(i * local + e)];
      for (int64_t n = 0; n < per_source[static_cast<std::size_t>(i)][static_cast<std::size_t>(e)]; ++n) by_expert.push_back(from + n);
    }
  }
  const auto index = [&](const std::vector<int64_t>& v) {
    return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(rows.device());
  };
  const bool identity = ep == 1;  // one rank: the rows already come expert by expert
  const at::Tensor grouped = identity ? rows : rows.index_select(0, index(by_expert));
  std::vector<at::Tensor> outputs(static_cast<std::size_t>(local));
  int64_t start = 0;
  for (int e = 0; e < local; ++e) {
    int64_t n = 0;
    for (int i = 0; i < ep; ++i) n += per_source[static_cast<std::size_t>(i)][static_cast<std::size_t>(e)];
    // Every local expert runs, on no rows if none came: its weights are then in the graph on every
    // rank, so their gradient reduction starts everywhere.
    const at::Tensor in = grouped.narrow(0, start, n);
    start += n;
    const auto i = static_cast<std::size_t>(3 * e);
    const at::Tensor &gate = p[1 + i], &up = p[2 + i], &down = p[3 + i];
    outputs[static_cast<std::size_t>(e)] = run.kernels == Kernels::kFused
                                               ? swiglu_down(linear_into(in, gate, sum(1 + i)), linear_into(in, up, sum(2 + i)), down, sum(3 + i))
                                               : at::linear(at::silu(at::linear(in, gate)) * at::linear(in, up), down);
  }
  at::Tensor y = at::cat(outputs, 0);
  if (!identity) {  // back to source order, then combine: every row returns to the rank of its token
    std::vector<int64_t> inverse(by_expert.size());
    for (std::size_t j = 0; j < by_expert.size(); ++j) inverse[static_cast<std::size_t>(by_expert[j])] = static_cast<int64_t>(j);
    y = AllToAllRows::apply(y.index_select(0, index(inverse)), reinterpret_cast<int64_t>(run.ep), recv_rows, send_rows);
  }
  const at::Tensor weight = r.weights.reshape({-1}).index_select(0, assignment).unsqueeze(1).to(y.scalar_type());
  at::Tensor out = ScatterAddRows::apply(y * weight, token, tokens);

  const bool attach = run.aux_scale != 0 && at::GradMode::is_enabled();
  if (run.tally == nullptr && !attach) return out.view_as(x);
  const at::Tensor aux = load_balancing_loss(r, run.sequence);
  if (run.tally != nullptr) {
    MoeTally& t = *run.tally;
    const auto add = [](at::Tensor& sum, const at::Tensor& v) { sum = sum.defined() ? sum + v : v; };
    add(t.dropped, counts[experts].to(at::kDouble));
    add(t.aux_sum, aux.detach().to(at::kDouble));
    t.assignments += static_cast<double>(r.kept.numel());
    ++t.layer_passes;
    t.kept_per_expert.resize(static_cast<std::size_t>(experts), 0.0);
    for (int e = 0; e < experts; ++e) t.kept_per_expert[static_cast<std::size_t>(e)] += static_cast<double>(c[e]);
  }
  out = out.view_as(x);
  return attach ? AttachAuxLoss::apply(out, aux, run.aux_scale) : out;
}

}  // namespace trainplan::executor
