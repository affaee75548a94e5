// The data-parallel engine: the gradient norm, AdamW (fused, plain, offloaded to the CPU) and the
// compute copies (engine.hpp).

#include "engine.hpp"
#include "engine_unit.hpp"
#include "gpu.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace trainplan::executor {

namespace cm = trainplan::costmodel;

namespace {

// at::_fused_adamw_'s tensor lists: the decay ranges of units and the rest, which take none.
struct AdamWLists {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
};

// Unit `u`'s owned elements, with gradient `grad` (its owned shard), into the two lists.
void add_to_adamw_lists(Unit& u, const at::Tensor& grad, const at::Tensor& step, AdamWLists& decay, AdamWLists& plain) {
  int64_t at_element = 0;
  const auto add = [&](AdamWLists& l, int64_t start, int64_t length) {
    if (length <= 0) return;
    l.params.push_back(u.master.narrow(0, start, length));
    l.grads.push_back(grad.narrow(0, start, length));
    l.exp_avgs.push_back(u.exp_avg.narrow(0, start, length));
    l.exp_avg_sqs.push_back(u.exp_avg_sq.narrow(0, start, length));
    l.steps.push_back(step);
  };
  for (const auto& [start, length] : u.decay_ranges) {  // sorted, disjoint (slot order)
    add(plain, at_element, start - at_element);
    add(decay, start, length);
    at_element = start + length;
  }
  add(plain, at_element, u.shard - at_element);
}

// LibTorch's multi-tensor AdamW (at::_fused_adamw_, the kernel behind torch.optim.AdamW(fused=True),
// on CPU and CUDA): one pass over master, gradient and moments per element instead of the dozen
// of plain_adamw, and no float32 temporaries. The same update: decoupled decay (on decay ranges
// only, so the ranges go in as two lists), bias-corrected moments; the gradient multiplier enters
// as the kernel's grad_scale (it divides by it), which also leaves the unscaled gradient in place.
void fused_adamw(const AdamWLists& decay, const AdamWLists& plain, const AdamWSettings& a, double lr, double gradient_multiplier,
                 const at::TensorOptions& options) {
  const at::Tensor grad_scale = at::full({}, 1.0 / gradient_multiplier, options);
  for (const auto& [l, weight_decay] : {std::pair<const AdamWLists*, double>{&decay, a.weight_decay}, {&plain, 0.0}}) {
    if (l->params.empty()) continue;
    at::_fused_adamw_(l->params, l->grads, l->exp_avgs, l->exp_avg_sqs, {}, l->steps, lr, a.beta1, a.beta2, weight_decay, a.eps,
                      /*amsgrad=*/false, /*maximize=*/false, grad_scale, std::nullopt);
  }
}

// The plain AdamW of `--kernels reference` on one unit's owned elements.
void plain_adamw(Unit& u, const at::Tensor& grad, const AdamWSettings& a, double lr, double gradient_multiplier, int64_t step) {
  const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(step));
  const at::Tensor g = grad * gradient_multiplier;
  u.exp_avg.mul_(a.beta1).add_(g, 1.0 - a.beta1);
  u.exp_avg_sq.mul_(a.beta2).addcmul_(g, g, 1.0 - a.beta2);
  const at::Tensor denom = (u.exp_avg_sq.sqrt() / std::sqrt(bc2)).add_(a.eps);
  for (const auto& [start, length] : u.decay_ranges) u.master.narrow(0, start, length).mul_(1.0 - lr * a.weight_decay);
  u.master.addcdiv_(u.exp_avg, denom, -lr / bc1);
}

}  // namespace

double DataParallelEngine::gradient_norm() {
  // Each element once over every axis: replicas, TP copies and the tied copy count nowhere else.
  // One multi-tensor norm over the ranges (no squared temporary the size of a range), summed on
  // the device and read once (one host synchronisation per step).
  std::vector<at::Tensor> parts;
  for (auto& u : units_) {
    if (u->frozen) continue;
    const at::Tensor g = u->owned_grad(config_.zero_stage);
    for (const auto& [start, length] : u->norm_ranges) parts.push_back(g.narrow(0, start, length));
  }
  double local = 0;
  if (!parts.empty()) local = at::stack(at::_foreach_norm(parts, 2)).to(at::kDouble).pow(2).sum().item<double>();
  return std::sqrt(all_reduce_scalar(*groups_.world, local));
}

bool DataParallelEngine::gradients_finite() {
  double bad = 0;
  at::Tensor count;
  for (auto& u : units_) {
    if (u->frozen) continue;
    const at::Tensor part = at::isfinite(u->owned_grad(config_.zero_stage)).logical_not().sum();
    count = count.defined() ? count + part : part;
  }
  if (count.defined()) bad = count.item<double>();
  return all_reduce_scalar(*groups_.world, bad) == 0;
}

void DataParallelEngine::offloaded_update(std::size_t index, const AdamWSettings& a, double lr, double gradient_multiplier, int64_t step) {
  Unit& u = *units_[index];
  if (u.frozen) return;
  at::Tensor grad = staging_.narrow(0, 0, u.shard);
  grad.copy_(u.owned_grad(config_.zero_stage));  // device to host (a memcpy on CPU ranks)
  u.grad.zero_();
  if (config_.kernels == Kernels::kFused) {
    const auto host = at::TensorOptions().dtype(at::kFloat);
    AdamWLists decay, plain;
    add_to_adamw_lists(u, grad, at::full({}, static_cast<double>(step), host), decay, plain);
    fused_adamw(decay, plain, a, lr, gradient_multiplier, host);
  } else {
    plain_adamw(u, grad, a, lr, gradient_multiplier, step);
  }
  // Host to device: ZeRO-0 the whole unit, ZeRO-3 the shard; ZeRO-1/2 gather in refresh_compute_copies.
  if (config_.zero_stage == 0) u.full.copy_(u.master);
  else if (config_.zero_stage == 3) u.shard_param.copy_(u.master);
}

void DataParallelEngine::await_update(std::size_t unit) {
  if (!offload_thread_.joinable()) return;
  std::unique_lock<std::mutex> lock(offload_mutex_);
  offload_cv_.wait(lock, [&] { return offload_ready_ > unit || offload_error_; });
  if (offload_error_) {
    lock.unlock();
    finish_offload();
  }
}

void DataParallelEngine::finish_offload() {
  if (!offload_thread_.joinable()) return;
  offload_thread_.join();
  if (offload_error_) {
    std::exception_ptr error = offload_error_;
    offload_error_ = nullptr;
    std::rethrow_exception(error);
  }
}

void DataParallelEngine::optimizer_step(const AdamWSettings& a, double lr, double gradient_multiplier, int64_t step) {
  if (config_.offload_optimizer) {
    finish_offload();
    if (config_.device.is_cuda()) cuda_synchronize();  // the gradients are complete before the host reads them
    if (config_.zero_stage == 1 || config_.zero_stage == 2) {
      for (std::size_t i = 0; i < units_.size(); ++i) offloaded_update(i, a, lr, gradient_multiplier, step);
      refresh_compute_copies();
      offload_zeroes_ = true;
      return;
    }
    offload_ready_ = 0;
    offload_zeroes_ = true;
    offload_thread_ = std::thread([this, a, lr, gradient_multiplier, step] {
      try {
        at::NoGradGuard no_grad;
        for (std::size_t i = 0; i < units_.size(); ++i) {
          offloaded_update(i, a, lr, gradient_multiplier, step);
          {
            std::lock_guard<std::mutex> lock(offload_mutex_);
            offload_ready_ = i + 1;
          }
          offload_cv_.notify_all();
        }
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(offload_mutex_);
          offload_error_ = std::current_exception();
        }
        offload_cv_.notify_all();
      }
    });
    return;
  }
  if (config_.kernels == Kernels::kFused) {
    fused_optimizer_step(a, lr, gradient_multiplier, step);
    refresh_compute_copies();
    return;
  }
  for (auto& up : units_) {
    if (!up->frozen) plain_adamw(*up, up->owned_grad(config_.zero_stage), a, lr, gradient_multiplier, step);
  }
  refresh_compute_copies();
}

// One multi-tensor AdamW over every trained unit (fused_adamw).
void DataParallelEngine::fused_optimizer_step(const AdamWSettings& a, double lr, double gradient_multiplier, int64_t step) {
  const auto options = at::TensorOptions().dtype(at::kFloat).device(config_.device);
  const at::Tensor step_tensor = at::full({}, static_cast<double>(step), options);
  AdamWLists decay, plain;
  for (auto& up : units_) {
    if (!up->frozen) add_to_adamw_lists(*up, up->owned_grad(config_.zero_stage), step_tensor, decay, plain);
  }
  fused_adamw(decay, plain, a, lr, gradient_multiplier, options);
}

void DataParallelEngine::refresh_compute_copies() {
  const int stage = config_.zero_stage;
  std::vector<std::pair<std::unique_ptr<Work>, at::Tensor>> gathers;
  for (auto& up : units_) {
    Unit& u = *up;
    if (u.frozen) continue;
    if (stage == 0) {
      if (u.separate_master) u.full.copy_(u.master);
    } else if (stage < 3) {
      at::Tensor mine = u.master.to(u.full.options(), false, /*copy=*/true);  // to the device too, when offloaded
      gathers.emplace_back(u.shard_comm->all_gather(mine, u.full), mine);
    } else if (u.separate_master) {
      u.shard_param.copy_(u.master);
    }
  }
  for (auto& g : gathers) g.first->wait();
}

void DataParallelEngine::zero_gradients() {
  if (offload_zeroes_) {  // the offloaded update zeroed each unit's after reading it
    offload_zeroes_ = false;
    return;
  }
  for (auto& u : units_) {
    if (!u->frozen) u->grad.zero_();
  }
}

}  // namespace trainplan::executor
