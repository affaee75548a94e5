// The data-parallel engine: its state's sizes, the parts a checkpoint saves, and loading a unit
// (engine.hpp).

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

StateBytes DataParallelEngine::state_bytes() const {
  StateBytes b;
  const auto bytes = [](const at::Tensor& t) { return static_cast<double>(t.numel()) * t.element_size(); };
  for (const auto& up : units_) {
    const Unit& u = *up;
    if (u.quantized) {
      b.weights += bytes(u.packed_shard.defined() ? u.packed_shard : u.packed);
      continue;
    }
    b.weights += bytes(u.kept_weights(config_.zero_stage));
    if (u.frozen) continue;
    b.gradients += bytes(u.grad);
    (config_.offload_optimizer ? b.host : b.optimizer) += bytes(u.exp_avg) + bytes(u.exp_avg_sq) + (u.separate_master ? bytes(u.master) : 0.0);
  }
  if (staging_.defined()) b.host += bytes(staging_);
  return b;
}

std::vector<DataParallelEngine::StatePart> DataParallelEngine::state_parts() {
  finish_offload();
  StatePart dense{config_.shard_prefix, shard_comm_->rank(), replica_comm_->rank() == 0, {}};
  StatePart experts;
  if (expert_shard_comm_) {
    char prefix[16];
    std::snprintf(prefix, sizeof(prefix), "ep%02d_", groups_.ep == nullptr ? 0 : groups_.ep->rank());
    experts = StatePart{config_.shard_prefix + prefix, expert_shard_comm_->rank(), expert_replica_comm_->rank() == 0, {}};
  }
  for (auto& u : units_) {
    if (u->frozen) continue;  // LoRA: a checkpoint holds the adapters; the base comes from where it was loaded
    (u->layout.kind == UnitKind::kExperts ? experts : dense).states.push_back(OwnedState{u->master, u->exp_avg, u->exp_avg_sq});
  }
  std::vector<StatePart> parts{std::move(dense)};
  if (expert_shard_comm_) parts.push_back(std::move(experts));
  return parts;
}

int DataParallelEngine::shard_size() const { return shard_comm_->size(); }
int DataParallelEngine::expert_shard_size() const { return expert_shard_comm_ ? expert_shard_comm_->size() : 0; }
int64_t DataParallelEngine::shard_numel(std::size_t unit) const { return units_[unit]->shard; }

void DataParallelEngine::load_masters_done() { refresh_compute_copies(); }

at::Tensor DataParallelEngine::full_master(std::size_t unit) {
  finish_offload();
  Unit& u = *units_[unit];
  if (u.quantized) {  // the dequantised weights
    at::Tensor packed = u.packed;
    if (u.packed_shard.defined()) {
      packed = at::empty({u.packing.bytes}, u.packed_shard.options());
      u.shard_comm->all_gather(u.packed_shard, packed)->wait();
    }
    at::Tensor out = at::zeros({u.layout.numel}, at::TensorOptions().dtype(at::kFloat).device(config_.device));
    dequantize_unit(u, packed, out, false);  // float32: LibTorch's path
    return out;
  }
  const at::Tensor owned = u.frozen ? u.kept_weights(config_.zero_stage).narrow(0, u.offset * (config_.zero_stage < 3), u.shard).to(at::kFloat)
                                    : u.master.to(config_.device);  // offloaded: from the host
  if (u.shard_comm->size() == 1) return owned.narrow(0, 0, u.layout.numel);
  at::Tensor out = at::empty({u.padded}, owned.options());
  u.shard_comm->all_gather(owned.contiguous(), out)->wait();
  return out.narrow(0, 0, u.layout.numel);
}

void DataParallelEngine::load_unit(std::size_t unit, const at::Tensor& values) {
  finish_offload();
  Unit& u = *units_[unit];
  if (values.numel() != u.layout.numel) {
    throw std::logic_error("load_unit: " + u.layout.name + " has " + std::to_string(u.layout.numel) + " elements, got " +
                           std::to_string(values.numel()));
  }
  at::Tensor padded = at::zeros({u.padded}, values.options().dtype(at::kFloat));
  padded.narrow(0, 0, u.layout.numel).copy_(values.reshape({-1}));
  const at::Tensor owned = padded.narrow(0, u.offset, u.shard);
  if (u.quantized) {
    store_quantized(u, padded);
  } else if (u.frozen) {
    if (config_.zero_stage < 3) u.full.copy_(padded);
    else u.shard_param.copy_(owned);
  } else {
    u.master.copy_(owned);
  }
}

}  // namespace trainplan::executor
