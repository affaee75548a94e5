// The data-parallel engine (see engine.hpp for the stages and their state).

#include "engine.hpp"
#include "engine_unit.hpp"
#include "gpu.hpp"
#include "quantize.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace trainplan::executor {

namespace cm = trainplan::costmodel;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// ZeRO-3 frees a unit's gathered parameters between uses but keeps the storage object, because
// tensors autograd saved for backward are views of it; re-gathering refills the same storage.
void allocate_storage(const at::Tensor& t, std::size_t bytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == bytes && s->data() != nullptr) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}
void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

int64_t engine_id(DataParallelEngine* e) { return reinterpret_cast<int64_t>(e); }
DataParallelEngine* engine_of(AutogradContext* ctx) {
  return reinterpret_cast<DataParallelEngine*>(ctx->saved_data["engine"].toInt());
}

// Hands out a unit's parameter views; its backward runs once every use of the unit's parameters
// has its gradient, which is when the unit's reduction starts. A view whose gradient went into the
// unit's float32 sum directly (gradient-accumulation fusion) arrives undefined, not as zeros.
struct UnitViewsFn : torch::autograd::Function<UnitViewsFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& /*anchor*/, int64_t engine, int64_t unit) {
    ctx->set_materialize_grads(false);
    ctx->saved_data["engine"] = engine;
    ctx->saved_data["unit"] = unit;
    return reinterpret_cast<DataParallelEngine*>(engine)->unit_views(static_cast<std::size_t>(unit));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    engine_of(ctx)->on_unit_gradients(static_cast<std::size_t>(ctx->saved_data["unit"].toInt()), grads);
    return {at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// A block's parameter views in the graph, followed by those of its experts unit when it is an MoE
// layer (block_forward takes them in that order), with their gradient sums likewise. The units
// are gathered already.
struct BlockParams {
  variable_list views;
  std::vector<at::Tensor> sums;
};
BlockParams block_params(DataParallelEngine* e, std::size_t unit) {
  BlockParams b{e->views_in_graph(unit), e->grad_sums(unit)};
  if (const int64_t experts = e->companion_of(unit); experts >= 0) {
    const auto x = static_cast<std::size_t>(experts);
    for (at::Tensor& v : e->views_in_graph(x)) b.views.push_back(std::move(v));
    for (at::Tensor& g : e->grad_sums(x)) b.sums.push_back(std::move(g));
  }
  return b;
}

// Identity whose backward runs just before the backward of the unit that produced its input:
// ZeRO-3 gathers that unit's parameters again there.
struct BeforeBackwardFn : torch::autograd::Function<BeforeBackwardFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t engine, int64_t unit) {
    ctx->saved_data["engine"] = engine;
    ctx->saved_data["unit"] = unit;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    engine_of(ctx)->before_unit_backward(static_cast<std::size_t>(ctx->saved_data["unit"].toInt()));
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

// Full activation recompute of one block: forward without a graph, keeping only the input; the
// backward gathers the parameters (ZeRO-3), runs the forward again with a graph and backward.
// `anchor`: a trained unit's (the block's, or its LoRA adapters'), so that the output needs a
// gradient even when `x` does not (LoRA's first block after the frozen embedding).
struct RecomputedBlockFn : torch::autograd::Function<RecomputedBlockFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& /*anchor*/, int64_t engine, int64_t unit) {
    ctx->saved_data["engine"] = engine;
    ctx->saved_data["unit"] = unit;
    ctx->save_for_backward({x});
    DataParallelEngine* e = reinterpret_cast<DataParallelEngine*>(engine);
    ctx->saved_data["aux_scale"] = e->aux_scale();
    const auto u = static_cast<std::size_t>(unit);
    const DropoutRun drop = e->dropout_run(e->layout()[u].layer);
    if (drop.samples.defined()) ctx->saved_data["samples"] = drop.samples;  // the backward's recompute draws the same masks
    const int64_t experts = e->companion_of(u);
    e->gather(u, +1);
    std::vector<at::Tensor> views = e->unit_views(u);
    if (experts >= 0) {
      e->gather(static_cast<std::size_t>(experts), +1);
      for (at::Tensor& v : e->unit_views(static_cast<std::size_t>(experts))) views.push_back(std::move(v));
    }
    at::Tensor out;
    {
      torch::autograd::AutoGradMode no_grad(false);
      // No graph: no sums, no load-balancing gradient; MoE layers count here, not in the recompute.
      out = block_forward(e->model(), e->tp(), e->cp(), views, x, e->rotary(), AttentionRecompute::kNone, e->config().kernels, {},
                          e->moe_run(0, &e->moe_tally()), e->config().lora, drop, e->config().fp8);
    }
    e->release(u);
    if (experts >= 0) e->release(static_cast<std::size_t>(experts));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    DataParallelEngine* e = engine_of(ctx);
    const int64_t unit = ctx->saved_data["unit"].toInt();
    const auto u = static_cast<std::size_t>(unit);
    const int64_t experts = e->companion_of(u);
    at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    DropoutRun drop = e->dropout_run(e->layout()[u].layer);
    if (ctx->saved_data.count("samples") != 0) drop.samples = ctx->saved_data["samples"].toTensor();
    if (experts >= 0) e->gather(static_cast<std::size_t>(experts), -1);
    e->gather(u, -1);
    {
      torch::autograd::AutoGradMode enable(true);
      const BlockParams params = block_params(e, u);
      const at::Tensor out = block_forward(e->model(), e->tp(), e->cp(), params.views, x, e->rotary(), AttentionRecompute::kNone,
                                           e->config().kernels, params.sums, e->moe_run(ctx->saved_data["aux_scale"].toDouble(), nullptr),
                                           e->config().lora, drop, e->config().fp8);
      torch::autograd::backward({out}, {grads[0]});
    }
    // A trained unit is released by its gradients' callback; a frozen one (LoRA's base) here.
    if (e->layout()[u].frozen) e->release(u);
    return {x.grad(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

// Unit, DataParallelEngine::Pending and dequantize_unit: engine_unit.hpp.


DataParallelEngine::DataParallelEngine(const cm::ModelSpec& model, const EngineConfig& config, const EngineGroups& groups,
                                       std::vector<UnitLayout> units, const std::vector<int>& chunk_of_unit, int64_t seq_len)
    : model_(model), config_(config), groups_(groups), dp_(*groups.dp), layout_(std::move(units)) {
  const int dp = dp_.size(), stage = config.zero_stage;
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    const auto chunk = static_cast<std::size_t>(chunk_of_unit.at(i));
    if (chunk_ranges_.size() <= chunk) chunk_ranges_.resize(chunk + 1, {i, i});
    chunk_ranges_[chunk].second = i + 1;
  }
  bool has_embedding = false, has_head = false;
  for (const UnitLayout& l : layout_) {
    has_embedding |= l.kind == UnitKind::kEmbedding;
    has_head |= l.kind == UnitKind::kHead;
  }
  local_tied_ = model.tied_embeddings && has_embedding && has_head;
  // recompute_layers counts the blocks of each pipeline stage, as the cost model and Megatron's
  // --recompute-num-layers do: the stage's first n blocks (over all its chunks), or all of them.
  if (config.recompute == cm::Recompute::kFull) {
    for (const UnitLayout& l : layout_) {
      const auto n = static_cast<int>(recomputed_layers_.size());
      if (l.kind == UnitKind::kBlock && (config.recompute_layers == 0 || n < config.recompute_layers)) recomputed_layers_.push_back(l.layer);
    }
  }
  const int s = stage == 0 ? 1 : stage == 3 && config.shard_group > 0 ? config.shard_group : dp;
  shard_comm_ = dp_.split(dp_.rank() / s, dp_.rank(), "shard");
  replica_comm_ = dp_.split(dp_.rank() % s, dp_.rank(), "replica");
  bool has_experts = false;  // the same on every rank of the expert-data-parallel group (one stage)
  for (const UnitLayout& l : layout_) has_experts |= l.kind == UnitKind::kExperts;
  if (has_experts) {  // the expert-data-parallel ranks within this rank's shard group shard the experts
    Communicator& edp = groups.edp != nullptr ? *groups.edp : dp_;
    expert_shard_comm_ = edp.split(dp_.rank() / s, edp.rank(), "expert-shard");
    expert_replica_comm_ = edp.split(expert_shard_comm_->rank(), edp.rank(), "expert-replica");
  }
  rotary_ = make_rotary(model, seq_len, config.device, config.compute_dtype);
  positions_ = groups.cp.active() ? groups.cp.positions.to(config.device) : at::arange(seq_len, at::TensorOptions().dtype(at::kLong).device(config.device));
  if (groups.cp.active()) {  // the rows of this rank's tokens (context_parallel.hpp)
    const at::Tensor rows = groups.cp.positions.to(config.device);
    rotary_ = Rotary{rotary_.cos.index_select(0, rows), rotary_.sin.index_select(0, rows)};
  }

  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(config.device);
  const auto compute = f32.dtype(config.compute_dtype);
  const bool fp32 = config.compute_dtype == at::kFloat;
  // Optimizer offload: master and moments in host memory, pinned for asynchronous copies on GPUs.
  const bool offload = config.offload_optimizer;
  const auto state_options = offload ? at::TensorOptions().dtype(at::kFloat).device(at::kCPU).pinned_memory(config.device.is_cuda()) : f32;
  int64_t largest_shard = 0;
  for (const UnitLayout& l : layout_) {
    auto u = std::make_unique<Unit>();
    u->layout = l;
    const bool expert = l.kind == UnitKind::kExperts;
    u->shard_comm = expert ? expert_shard_comm_.get() : shard_comm_.get();
    u->replica_comm = expert ? expert_replica_comm_.get() : replica_comm_.get();
    const int shards = u->shard_comm->size();
    u->padded = (l.numel + shards - 1) / shards * shards;
    u->shard = u->padded / shards;
    u->offset = u->shard_comm->rank() * u->shard;
    // Written once: drawn values over the unit's parameters (init_unit writes all of them), zeros
    // over the padding, or zeros throughout for weights an import overwrites.
    at::Tensor init = at::empty({u->padded}, at::TensorOptions().dtype(at::kFloat));
    if (config.draw_base_weights || l.kind == UnitKind::kAdapters) {
      init_unit(l, model, config.seed, init, config.lora);
      init.narrow(0, l.numel, u->padded - l.numel).zero_();
    } else {
      init.zero_();
    }
    const at::Tensor owned = init.narrow(0, u->offset, u->shard);
    u->anchor = at::zeros({}, at::TensorOptions().dtype(at::kFloat)).requires_grad_(true);
    if (l.frozen) {  // the compute copy alone
      u->frozen = true;
      if (config.quantized_base && l.kind == UnitKind::kBlock) {  // QLoRA: quantised, dequantised on use
        u->quantized = true;
        store_quantized(*u, init);
        u->full = at::empty({u->padded}, compute);
        free_storage(u->full);
        u->gathered = false;
      } else if (stage < 3) {
        u->full = init.to(compute, false, true);
      } else {
        u->shard_param = owned.to(compute, false, true);
        u->full = at::empty({u->padded}, compute);
        free_storage(u->full);
        u->gathered = false;
      }
      units_.push_back(std::move(u));
      continue;
    }
    u->separate_master = !fp32 || offload;  // offloaded: a host copy even in fp32
    if (stage < 3) {
      u->full = init.to(compute, /*non_blocking=*/false, /*copy=*/true);
      u->master = u->separate_master ? owned.to(state_options, false, true) : u->full.narrow(0, u->offset, u->shard);
    } else {
      u->shard_param = owned.to(compute, false, true);
      u->master = u->separate_master ? owned.to(state_options, false, true) : u->shard_param;
      u->full = at::empty({u->padded}, compute);
      free_storage(u->full);
      u->gathered = false;
    }
    u->grad = at::zeros({stage <= 1 ? u->padded : u->shard}, f32);
    u->exp_avg = at::zeros({u->shard}, state_options);
    u->exp_avg_sq = at::zeros({u->shard}, state_options);
    largest_shard = std::max(largest_shard, u->shard);
    const bool counts = u->replica_comm->rank() == 0;  // replicas hold the same gradient shard
    for (const ParamSlot& slot : l.slots) {
      const int64_t begin = std::max(slot.offset, u->offset), end = std::min(slot.offset + slot.numel, u->offset + u->shard);
      if (begin >= end) continue;
      if (slot.weight_decay) u->decay_ranges.emplace_back(begin - u->offset, end - begin);
      if (counts && slot.primary && !slot.tied_copy) u->norm_ranges.emplace_back(begin - u->offset, end - begin);
    }
    units_.push_back(std::move(u));
  }
  if (offload) staging_ = at::empty({largest_shard}, state_options);
}

DataParallelEngine::~DataParallelEngine() {
  if (offload_thread_.joinable()) offload_thread_.join();
}

void DataParallelEngine::set_step_samples(int64_t first_sample, int64_t micro_batch) {
  first_sample_ = first_sample;
  micro_batch_size_ = micro_batch;
  begin_micro_batch(0);
}

void DataParallelEngine::begin_micro_batch(int micro_batch) {
  if (config_.hidden_dropout <= 0 && config_.lora_dropout <= 0) return;
  const int64_t first = first_sample_ + static_cast<int64_t>(micro_batch) * micro_batch_size_;
  samples_ = at::arange(first, first + micro_batch_size_, at::TensorOptions().dtype(at::kLong).device(config_.device));
}

DropoutRun DataParallelEngine::dropout_run(int layer) const {
  DropoutRun run;
  run.hidden = config_.hidden_dropout;
  run.lora = config_.lora_dropout;
  run.seed = config_.seed;
  run.samples = samples_;
  run.positions = positions_;
  run.layer = layer;
  return run;
}

std::vector<at::Tensor> DataParallelEngine::unit_views(std::size_t unit) {
  await_update(unit);
  Unit& u = *units_[unit];
  std::vector<at::Tensor> views;
  const at::Tensor base = u.full.variable_data();
  for (const ParamSlot& s : u.layout.slots) views.push_back(base.narrow(0, s.offset, s.numel).view(s.shape));
  return views;
}

at::Tensor DataParallelEngine::anchor(std::size_t unit) { return units_[unit]->anchor; }

std::vector<at::Tensor> DataParallelEngine::views_in_graph(std::size_t unit) {
  if (units_[unit]->frozen) return unit_views(unit);
  return UnitViewsFn::apply(anchor(unit), engine_id(this), static_cast<int64_t>(unit));
}

bool DataParallelEngine::gathered_on_use(std::size_t unit) const { return config_.zero_stage == 3 || units_[unit]->quantized; }

// Every rank quantises the whole unit (the same bytes everywhere) and keeps what ZeRO gives it.
void DataParallelEngine::store_quantized(Unit& u, const at::Tensor& values) {
  std::vector<QuantizedMatrix> matrices(u.layout.slots.size());
  std::vector<at::Tensor> plain(u.layout.slots.size());
  for (std::size_t k = 0; k < u.layout.slots.size(); ++k) {
    const ParamSlot& s = u.layout.slots[k];
    const at::Tensor v = values.narrow(0, s.offset, s.numel).to(config_.device).view(s.shape);
    if (s.shape.size() == 2) matrices[k] = quantize(v, *config_.quantized_base);  // the block's linear weights
    else plain[k] = v.to(config_.compute_dtype);
  }
  const int shards = config_.zero_stage == 3 ? u.shard_comm->size() : 1;
  u.packed = pack_unit(matrices, plain, shards, config_.device, u.packing);
  if (shards == 1) return;
  const int64_t shard_bytes = u.packing.bytes / shards;
  u.packed_shard = u.packed.narrow(0, u.shard_comm->rank() * shard_bytes, shard_bytes).clone();
  free_storage(u.packed);
}

bool DataParallelEngine::recompute_block(int layer) const {
  return std::find(recomputed_layers_.begin(), recomputed_layers_.end(), layer) != recomputed_layers_.end();
}

void DataParallelEngine::gather(std::size_t unit, int prefetch_direction) {
  if (!gathered_on_use(unit)) return;
  const auto start_gather = [&](std::size_t index) {
    await_update(index);  // an offloaded update's new shard
    Unit& u = *units_[index];
    if (u.quantized && !u.packed_shard.defined()) return;  // its bytes are all here: dequantised on use
    PhaseScope scope(timer_, Phase::kDataParallelWait);
    if (u.quantized) {  // ZeRO-3: the packed bytes, dequantised once they are here
      allocate_storage(u.packed, static_cast<std::size_t>(u.packing.bytes));
      u.gather_work = u.shard_comm->all_gather(u.packed_shard, u.packed);
      return;
    }
    allocate_storage(u.full, static_cast<std::size_t>(u.padded) * u.full.element_size());
    u.gather_work = u.shard_comm->all_gather(u.shard_param, u.full);
  };
  Unit& u = *units_[unit];
  if (!u.gathered) {
    if (!u.gather_work) start_gather(unit);
    if (u.gather_work) {
      PhaseScope scope(timer_, Phase::kDataParallelWait);
      u.gather_work->wait();
      u.gather_work.reset();
    }
    if (u.quantized) {  // into the compute dtype; gathered bytes go at once
      allocate_storage(u.full, static_cast<std::size_t>(u.padded) * u.full.element_size());
      dequantize_unit(u, u.packed, u.full, config_.kernels == Kernels::kFused);
      if (u.packed_shard.defined()) free_storage(u.packed);
    }
    u.gathered = true;
  }
  const auto next = static_cast<int64_t>(unit) + prefetch_direction;
  if (config_.prefetch && config_.zero_stage == 3 && next >= 0 && next < static_cast<int64_t>(units_.size())) {
    Unit& n = *units_[static_cast<std::size_t>(next)];
    if (!n.gathered && !n.gather_work) start_gather(static_cast<std::size_t>(next));
  }
}

void DataParallelEngine::release(std::size_t unit) {
  if (!gathered_on_use(unit)) return;
  Unit& u = *units_[unit];
  if (u.gather_work) {
    u.gather_work->wait();
    u.gather_work.reset();
  }
  free_storage(u.full);
  if (u.packed_shard.defined()) free_storage(u.packed);  // a prefetched unit's bytes, never dequantised
  u.gathered = false;
}

// Frozen units have no gradients to announce the end of their backward (on_unit_gradients
// releases the others): a frozen unit gathered for backward is released once the backward of a
// unit before it begins, or at the end of the micro-batch's backward.
void DataParallelEngine::release_frozen_after(int64_t unit) {
  for (auto i = static_cast<std::size_t>(unit + 1); i < units_.size(); ++i) {
    if (units_[i]->frozen && gathered_on_use(i) && (units_[i]->gathered || units_[i]->gather_work)) release(i);
  }
}

void DataParallelEngine::before_unit_backward(std::size_t unit) {
  release_frozen_after(static_cast<int64_t>(unit));
  gather(unit, -1);
}

int64_t DataParallelEngine::companion_of(std::size_t unit) const {
  const std::size_t next = unit + 1;
  if (next >= units_.size()) return -1;
  const UnitKind kind = units_[next]->layout.kind;
  return kind == UnitKind::kExperts || kind == UnitKind::kAdapters ? static_cast<int64_t>(next) : -1;
}

// A block, and the experts unit after it when it is an MoE layer: block_forward takes the
// block's parameters followed by the experts'.
at::Tensor DataParallelEngine::run_unit_forward(std::size_t unit, const at::Tensor& x) {
  const int64_t id = engine_id(this), index = static_cast<int64_t>(unit);
  const int layer = units_[unit]->layout.layer;
  if (recompute_block(layer)) {
    const int64_t companion = companion_of(unit);
    return RecomputedBlockFn::apply(x, anchor(companion >= 0 ? static_cast<std::size_t>(companion) : unit), id, index);
  }
  const int64_t experts = companion_of(unit);
  gather(unit, +1);
  if (experts >= 0) gather(static_cast<std::size_t>(experts), +1);
  const BlockParams params = block_params(this, unit);
  const auto attention = config_.recompute == cm::Recompute::kSelective ? AttentionRecompute::kSelective : AttentionRecompute::kNone;
  at::Tensor y = block_forward(model_, groups_.tp, groups_.cp, params.views, x, rotary_, attention, config_.kernels, params.sums,
                               moe_run(aux_scale_, &moe_tally_), config_.lora, dropout_run(layer), config_.fp8);
  if (gathered_on_use(unit)) {
    y = BeforeBackwardFn::apply(y, id, index);
    if (experts >= 0) y = BeforeBackwardFn::apply(y, id, experts);  // runs first: the experts' backward comes first
  }
  release(unit);
  if (experts >= 0) release(static_cast<std::size_t>(experts));
  return y;
}

at::Tensor DataParallelEngine::forward_chunk(int chunk, const at::Tensor& input, const at::Tensor& targets,
                                             double loss_multiplier, at::Tensor* loss_value) {
  const int64_t id = engine_id(this);
  const bool stage3 = config_.zero_stage == 3;
  const auto [begin, end] = chunk_ranges_.at(static_cast<std::size_t>(chunk));
  aux_scale_ = model_.moe ? model_.moe->aux_loss_coeff * loss_multiplier : 0.0;  // as if added to the loss
  at::Tensor x = input;
  variable_list embedding;
  std::size_t embedding_unit = 0;
  for (std::size_t i = begin; i < end; ++i) {
    const auto index = static_cast<int64_t>(i);
    switch (units_[i]->layout.kind) {
      case UnitKind::kEmbedding: {
        gather(i, +1);
        embedding = views_in_graph(i);
        const std::vector<at::Tensor> sums = grad_sums(i);
        x = embedding_forward(model_, groups_.tp, groups_.cp, embedding, input, sums.empty() ? at::Tensor() : sums.front());
        if (const DropoutRun drop = dropout_run(-1); drop.active() && drop.hidden > 0) {
          const at::Tensor rows = groups_.tp.sharded_sequence() ? positions_.narrow(0, groups_.tp.rank() * x.size(1), x.size(1)) : positions_;
          x = dropout(x, drop, drop.hidden, dropout_site(-1, static_cast<uint64_t>(DropoutSite::kEmbedding)), rows, 0);
        }
        if (stage3) x = BeforeBackwardFn::apply(x, id, index);
        embedding_unit = i;
        if (!local_tied_) release(i);
        break;
      }
      case UnitKind::kBlock: x = run_unit_forward(i, x); break;
      case UnitKind::kExperts:
      case UnitKind::kAdapters: break;  // with its block
      case UnitKind::kHead: {
        gather(i, +1);
        const variable_list head_params = views_in_graph(i);
        const at::Tensor& output_weight = local_tied_ ? embedding[0] : head_params.back();
        const at::Tensor loss = head_loss(model_, groups_.tp, head_params, output_weight, x, targets, config_.kernels,
                                          output_weight_grad_sum(local_tied_ ? embedding_unit : i), loss_multiplier, loss_denominator_);
        at::Tensor scaled = loss * loss_multiplier;
        if (stage3) {
          scaled = BeforeBackwardFn::apply(scaled, id, index);
          if (local_tied_) scaled = BeforeBackwardFn::apply(scaled, id, static_cast<int64_t>(embedding_unit));
        }
        release(i);
        if (local_tied_) release(embedding_unit);
        if (loss_value != nullptr) *loss_value = loss.detach();  // read once per step, not per micro-batch
        return scaled;
      }
    }
  }
  return x;
}

// Gradient-accumulation fusion (fused_ops.hpp): on the fused path the weight-gradient GEMMs, the
// fused loss and the embedding add their gradients straight into the unit's float32 gradient,
// which holds the whole step's gradient only under ZeRO-0/1 (ZeRO-2/3 reduce each micro-batch's
// gradient as it comes) and only without TP (under TP the block keeps its plain linears and the
// loss is the vocabulary-parallel one). Then: one float32 view per slot, else none.
bool DataParallelEngine::fused_accumulation() const {
  return config_.kernels == Kernels::kFused && config_.zero_stage <= 1 && !groups_.tp.active();
}

std::vector<at::Tensor> DataParallelEngine::grad_sums(std::size_t unit) {
  if (!fused_accumulation()) return {};
  Unit& u = *units_[unit];
  if (u.frozen) return std::vector<at::Tensor>(u.layout.slots.size());
  std::vector<at::Tensor> views;
  for (const ParamSlot& s : u.layout.slots) views.push_back(u.grad.narrow(0, s.offset, s.numel).view(s.shape));
  return views;
}

// The output weight's sum: the head's last slot, or the embedding's token table (its first) when
// tied on this rank.
at::Tensor DataParallelEngine::output_weight_grad_sum(std::size_t unit) {
  const std::vector<at::Tensor> sums = grad_sums(unit);
  if (sums.empty()) return {};
  return units_[unit]->layout.kind == UnitKind::kEmbedding ? sums.front() : sums.back();
}

void DataParallelEngine::backward_begin(bool last) { last_micro_batch_ = last; }

void DataParallelEngine::backward_end() {
  drain();
  release_frozen_after(-1);
}

int DataParallelEngine::tied_slot(std::size_t unit) const {
  if (groups_.tied == nullptr || groups_.tied->size() == 1 || !model_.tied_embeddings) return -1;
  const UnitLayout& l = units_[unit]->layout;
  if (l.kind == UnitKind::kEmbedding) return 0;  // tokens.weight
  for (std::size_t k = 0; k < l.slots.size(); ++k) {
    if (l.slots[k].tied_copy) return static_cast<int>(k);
  }
  return -1;
}

}  // namespace trainplan::executor
