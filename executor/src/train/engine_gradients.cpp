// The data-parallel engine: the end of a step's backward and the gradient reductions (engine.hpp).

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

void DataParallelEngine::finish_step() {
  PhaseScope scope(timer_, Phase::kDataParallelWait);
  const int stage = config_.zero_stage;
  for (std::size_t unit : tied_deferred_) {
    Unit& u = *units_[unit];
    const ParamSlot& slot = u.layout.slots[static_cast<std::size_t>(tied_slot(unit))];
    if (stage <= 1) {
      at::Tensor region = u.grad.narrow(0, slot.offset, slot.numel);
      groups_.tied->all_reduce_sum(region)->wait();
      launch_reduction(unit, u.grad);
    } else {
      groups_.tied->all_reduce_sum(u.tied_grad)->wait();
      at::Tensor full = at::zeros({u.padded}, u.grad.options());
      full.narrow(0, slot.offset, slot.numel).copy_(u.tied_grad);
      u.tied_grad.zero_();
      launch_reduction(unit, full);
    }
  }
  tied_deferred_.clear();
  drain();
  if (stage >= 2) {
    std::vector<std::unique_ptr<Work>> works;
    for (auto& u : units_) {
      if (!u->frozen && u->replica_comm->size() > 1) works.push_back(u->replica_comm->all_reduce_sum(u->grad));
    }
    for (auto& w : works) w->wait();
  }
  if (dp_.size() > 1) {
    const double inverse = 1.0 / dp_.size();
    for (auto& u : units_) {
      if (!u->frozen) u->owned_grad(stage).mul_(inverse);
    }
  }
}

void DataParallelEngine::on_unit_gradients(std::size_t unit, const std::vector<at::Tensor>& grads_in) {
  Unit& u = *units_[unit];
  const int stage = config_.zero_stage;
  // Complete replicated parameters' gradients over the TP ranks that share them (float32).
  std::vector<at::Tensor> grads(grads_in.size());
  for (std::size_t k = 0; k < grads_in.size(); ++k) {
    if (!grads_in[k].defined()) continue;
    // In the compute dtype: add_ and copy_ below widen to float32 as they go, with no float32
    // temporary per parameter and micro-batch.
    grads[k] = grads_in[k];
    const GradSum sum = u.layout.slots[k].grad_sum;
    Communicator* group = sum == GradSum::kTensorParallel ? groups_.tp.comm : sum == GradSum::kKvGroup ? groups_.kv : nullptr;
    if (group != nullptr && group->size() > 1) {
      grads[k] = grads_in[k].to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
      group->all_reduce_sum(grads[k])->wait();
    }
  }
  const int tied = tied_slot(unit);
  if (stage <= 1) {
    for (std::size_t k = 0; k < grads.size(); ++k) {
      if (!grads[k].defined()) continue;
      const ParamSlot& s = u.layout.slots[k];
      u.grad.narrow(0, s.offset, s.numel).add_(grads[k].reshape({-1}));
    }
    if (last_micro_batch_) {
      if (tied >= 0) tied_deferred_.push_back(unit);
      else if (config_.overlap_grad_reduce) launch_reduction(unit, u.grad);
      else deferred_.emplace_back(unit, u.grad);
    }
  } else {
    at::Tensor full = at::zeros({u.padded}, u.grad.options());
    for (std::size_t k = 0; k < grads.size(); ++k) {
      if (!grads[k].defined()) continue;
      const ParamSlot& s = u.layout.slots[k];
      if (static_cast<int>(k) == tied) {  // summed with the other stage's copy once per step
        if (!u.tied_grad.defined()) u.tied_grad = at::zeros({s.numel}, u.grad.options());
        u.tied_grad.add_(grads[k].reshape({-1}));
        if (last_micro_batch_) tied_deferred_.push_back(unit);
        continue;
      }
      full.narrow(0, s.offset, s.numel).copy_(grads[k].reshape({-1}));
    }
    if (config_.overlap_grad_reduce) launch_reduction(unit, full);
    else deferred_.emplace_back(unit, full);
  }
  release(unit);
}

void DataParallelEngine::launch_reduction(std::size_t unit, at::Tensor full_grad) {
  PhaseScope scope(timer_, Phase::kDataParallelWait);
  Unit& u = *units_[unit];
  Pending p;
  p.unit = unit;
  if (config_.zero_stage == 0) {
    p.work = u.replica_comm->all_reduce_sum(full_grad);
  } else {
    p.result = at::empty({u.shard}, full_grad.options());
    p.work = u.shard_comm->reduce_scatter_sum(full_grad, p.result);
  }
  p.source = std::move(full_grad);
  pending_.push_back(std::move(p));
}

void DataParallelEngine::drain() {
  PhaseScope scope(timer_, Phase::kDataParallelWait);
  for (auto& [unit, grad] : deferred_) launch_reduction(unit, grad);
  deferred_.clear();
  const int stage = config_.zero_stage;
  for (Pending& p : pending_) {
    p.work->wait();
    Unit& u = *units_[p.unit];
    if (stage == 1) u.grad.narrow(0, u.offset, u.shard).copy_(p.result);
    if (stage >= 2) u.grad.add_(p.result);
  }
  pending_.clear();
}

}  // namespace trainplan::executor
