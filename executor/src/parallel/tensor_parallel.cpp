// Tensor- and sequence-parallel autograd functions (see tensor_parallel.hpp).

#include "tensor_parallel.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include <torch/csrc/autograd/custom_function.h>

namespace trainplan::executor {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

Communicator* comm_of(AutogradContext* ctx) { return reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt()); }

at::Tensor all_reduce(Communicator& comm, const at::Tensor& x) {
  at::Tensor buffer = reducible(x).clone();
  comm.all_reduce_sum(buffer)->wait();
  return buffer.to(x.scalar_type());
}

// [b, s/n, h] shards -> [b, s, h].
at::Tensor gather_sequence(Communicator& comm, const at::Tensor& x) {
  const int n = comm.size();
  const at::Tensor in = x.contiguous();
  at::Tensor out = at::empty({n, x.size(0), x.size(1), x.size(2)}, x.options());
  comm.all_gather(in, out)->wait();
  return out.permute({1, 0, 2, 3}).reshape({x.size(0), n * x.size(1), x.size(2)});
}

// [b, s, h] partial sums -> this rank's [b, s/n, h] shard of the sum.
at::Tensor reduce_scatter_sequence(Communicator& comm, const at::Tensor& x) {
  const int n = comm.size();
  const int64_t b = x.size(0), s = x.size(1), h = x.size(2);
  if (s % n != 0) throw CommError("sequence parallelism: sequence length " + std::to_string(s) + " is not divisible by tp " + std::to_string(n));
  const at::Tensor in = reducible(x.reshape({b, n, s / n, h}).permute({1, 0, 2, 3}).contiguous());
  at::Tensor out = at::empty({b, s / n, h}, in.options());
  comm.reduce_scatter_sum(in, out)->wait();
  return out.to(x.scalar_type());
}

struct EnterFn : torch::autograd::Function<EnterFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm, bool sequence) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["sequence"] = sequence;
    return sequence ? gather_sequence(*reinterpret_cast<Communicator*>(comm), x) : x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Communicator& c = *comm_of(ctx);
    const at::Tensor g = ctx->saved_data["sequence"].toBool() ? reduce_scatter_sequence(c, grads[0]) : all_reduce(c, grads[0]);
    return {g, at::Tensor(), at::Tensor()};
  }
};

struct LeaveFn : torch::autograd::Function<LeaveFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm, bool sequence) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["sequence"] = sequence;
    Communicator& c = *reinterpret_cast<Communicator*>(comm);
    return sequence ? reduce_scatter_sequence(c, x) : all_reduce(c, x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor g = ctx->saved_data["sequence"].toBool() ? gather_sequence(*comm_of(ctx), grads[0]) : grads[0];
    return {g, at::Tensor(), at::Tensor()};
  }
};

struct GatheredLinearsFn : torch::autograd::Function<GatheredLinearsFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm, at::TensorList weights) {
    ctx->saved_data["comm"] = comm;
    bool any_trained = false;
    variable_list saved{x};
    for (std::size_t i = 0; i < weights.size(); ++i) {
      saved.push_back(weights[i]);
      ctx->saved_data["frozen" + std::to_string(i)] = !weights[i].requires_grad();
      any_trained |= weights[i].requires_grad();
    }
    if (!any_trained) saved[0] = at::Tensor();  // frozen weights (LoRA's base): the input is not needed again
    ctx->save_for_backward(saved);
    const at::Tensor gathered = gather_sequence(*reinterpret_cast<Communicator*>(comm), x);
    variable_list out;
    for (const at::Tensor& w : weights) out.push_back(at::linear(gathered, w));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    Communicator& c = *comm_of(ctx);
    // Again: only the shard was kept (none when every weight is frozen).
    const at::Tensor input = saved[0].defined() ? gather_sequence(c, saved[0]).reshape({-1, saved[0].size(-1)}) : at::Tensor();
    at::Tensor grad_input;
    variable_list out(2 + grads.size());
    std::vector<int64_t> shape;
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) continue;
      const at::Tensor& w = saved[1 + i];
      if (shape.empty()) {
        shape = grads[i].sizes().vec();
        shape.back() = w.size(1);
      }
      const at::Tensor g = grads[i].reshape({-1, w.size(0)});
      if (!ctx->saved_data["frozen" + std::to_string(i)].toBool()) out[2 + i] = g.t().mm(input);
      if (grad_input.defined()) grad_input.addmm_(g, w);
      else grad_input = g.mm(w);
    }
    if (grad_input.defined()) out[0] = reduce_scatter_sequence(c, grad_input.view(shape));
    return out;
  }
};

struct VocabParallelCrossEntropyFn : torch::autograd::Function<VocabParallelCrossEntropyFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets_in, int64_t comm,
                            int64_t vocab_start, double denominator) {
    Communicator& c = *reinterpret_cast<Communicator*>(comm);
    const int64_t n = logits.size(0), columns = logits.size(1);
    // Negative targets take no loss (denominator > 0): their rows are masked out of both passes.
    const at::Tensor valid = targets_in.ge(0);
    const at::Tensor targets = targets_in.clamp_min(0);
    const double divisor = denominator > 0 ? denominator : static_cast<double>(n);
    // Global max per row (for a stable exp): gather each rank's row maxima.
    const at::Tensor local_max = std::get<0>(logits.max(1)).contiguous();
    at::Tensor maxima = at::empty({c.size(), n}, logits.options());
    c.all_gather(local_max, maxima)->wait();
    // One [rows x columns] tensor besides the logits: shifted, exponentiated, then normalised in
    // place into the softmax that backward keeps.
    at::Tensor softmax = logits - std::get<0>(maxima.max(0)).unsqueeze(1);
    // The target's logit lives on one rank; the others add zero.
    const at::Tensor local = targets - vocab_start;
    const at::Tensor mine = (local >= 0).logical_and(local < columns).logical_and(valid);
    const at::Tensor index = at::where(mine, local, at::zeros_like(local));
    at::Tensor target_logit = softmax.gather(1, index.unsqueeze(1)).squeeze(1) * mine.to(softmax.scalar_type());
    target_logit = target_logit.contiguous();
    at::Tensor sum_exp = softmax.exp_().sum(1);
    c.all_reduce_sum(sum_exp)->wait();
    c.all_reduce_sum(target_logit)->wait();
    const at::Tensor loss = denominator > 0 ? ((sum_exp.log() - target_logit) * valid).sum() / divisor : (sum_exp.log() - target_logit).mean();
    softmax.div_(sum_exp.unsqueeze(1));
    ctx->saved_data["divisor"] = divisor;
    ctx->saved_data["masked"] = denominator > 0;
    ctx->save_for_backward({softmax, index, mine, valid});
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor g = saved[0].clone();  // softmax over the full vocabulary, this rank's columns
    const at::Tensor& index = saved[1];
    const at::Tensor& mine = saved[2];
    g.scatter_add_(1, index.unsqueeze(1), -mine.to(g.scalar_type()).unsqueeze(1));
    if (ctx->saved_data["masked"].toBool()) g.mul_(saved[3].unsqueeze(1));
    g.mul_(grads[0] / ctx->saved_data["divisor"].toDouble());
    return {g, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

int64_t id(Communicator* c) { return reinterpret_cast<int64_t>(c); }

}  // namespace

at::Tensor enter_tp_region(const TensorParallel& tp, const at::Tensor& x) {
  if (!tp.active()) return x;
  return EnterFn::apply(x, id(tp.comm), tp.sequence_parallel);
}

at::Tensor leave_tp_region(const TensorParallel& tp, const at::Tensor& x) {
  if (!tp.active()) return x;
  return LeaveFn::apply(x, id(tp.comm), tp.sequence_parallel);
}

std::vector<at::Tensor> gathered_linears(const TensorParallel& tp, const at::Tensor& x, const std::vector<at::Tensor>& weights) {
  if (!tp.sharded_sequence()) throw std::logic_error("gathered_linears: sequence parallelism is not active");
  return GatheredLinearsFn::apply(x, id(tp.comm), at::TensorList(weights));
}

at::Tensor vocab_parallel_embedding(const at::Tensor& weight, const at::Tensor& tokens, int64_t vocab_start) {
  const at::Tensor local = tokens - vocab_start;
  const at::Tensor mine = (local >= 0).logical_and(local < weight.size(0));
  const at::Tensor rows = at::embedding(weight, at::where(mine, local, at::zeros_like(local)));
  return rows * mine.unsqueeze(-1).to(rows.scalar_type());
}

at::Tensor vocab_parallel_cross_entropy(const TensorParallel& tp, const at::Tensor& logits, const at::Tensor& targets,
                                        int64_t vocab_start, double denominator) {
  if (!tp.active()) {
    if (denominator > 0) return at::cross_entropy_loss(logits, targets, {}, at::Reduction::Sum, /*ignore_index=*/-1) / denominator;
    return at::cross_entropy_loss(logits, targets);
  }
  return VocabParallelCrossEntropyFn::apply(logits, targets, id(tp.comm), vocab_start, denominator);
}

}  // namespace trainplan::executor
