// The data-parallel engine (see engine.hpp for the stages and their state).

#include "engine.hpp"
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

class Unit {
 public:
  UnitLayout layout;
  int64_t padded = 0;        // numel rounded up to a multiple of the shard group
  int64_t shard = 0;         // owned elements
  int64_t offset = 0;        // start of the owned range in the padded buffer
  at::Tensor full;           // compute dtype, padded; ZeRO-3: storage only while gathered
  at::Tensor shard_param;    // ZeRO-3: the compute-dtype shard
  at::Tensor master;         // float32 owned range (a view of full/shard_param in fp32 runs)
  bool separate_master = false;
  at::Tensor grad;           // float32: padded (stage 0/1) or owned shard (stage 2/3)
  at::Tensor exp_avg, exp_avg_sq;
  at::Tensor anchor;         // 0-dim leaf that makes the unit's views part of the graph
  bool gathered = true;
  std::unique_ptr<Work> gather_work;
  bool frozen = false;       // LoRA's base: compute-dtype weights only (no master, gradient or moments)
  // QLoRA's frozen blocks: the linear weights quantised, the other slots' values in the compute
  // dtype, all packed into one byte buffer (quantize.hpp PackedUnit); `full` holds the dequantised
  // unit only while it runs. Under ZeRO-3 a rank keeps its shard of the bytes and gathers the
  // whole before the unit runs (FSDP-QLoRA).
  bool quantized = false;
  PackedUnit packing;
  at::Tensor packed;        // uint8, packing.bytes: kept (ZeRO 0-2), or held only while gathered (ZeRO-3)
  at::Tensor packed_shard;  // ZeRO-3: this rank's packing.bytes / shards
  std::vector<std::pair<int64_t, int64_t>> decay_ranges;  // (start, length) within the owned range
  std::vector<std::pair<int64_t, int64_t>> norm_ranges;   // owned elements this rank counts in the norm
  at::Tensor tied_grad;      // ZeRO-2/3 with a split tied embedding: the token table's gradient
  Communicator* shard_comm = nullptr;    // the ranks this unit is sharded over
  Communicator* replica_comm = nullptr;  // the ranks holding the same shard

  [[nodiscard]] at::Tensor owned_grad(int stage) const { return stage <= 1 ? grad.narrow(0, offset, shard) : grad; }
  // The compute-dtype weights this rank keeps between uses: the whole unit, or its ZeRO-3 shard.
  [[nodiscard]] at::Tensor kept_weights(int stage) const { return stage < 3 ? full : shard_param; }
};

namespace {

// A QLoRA unit's weights from its whole packed bytes into `dst` (the unit's flat compute tensor):
// quantised slots dequantised (`fused`: quantize.hpp dequantize_into), the others copied.
void dequantize_unit(const Unit& u, const at::Tensor& packed, at::Tensor dst, bool fused) {
  for (std::size_t k = 0; k < u.layout.slots.size(); ++k) {
    const ParamSlot& s = u.layout.slots[k];
    at::Tensor part = dst.narrow(0, s.offset, s.numel);
    if (u.packing.slots[k].quantized) dequantize_into(packed_matrix(u.packing, k, packed), part, fused);
    else part.copy_(packed_tensor(u.packing, k, packed).reshape({-1}));
  }
}

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

struct DataParallelEngine::Pending {
  std::size_t unit = 0;
  std::unique_ptr<Work> work;
  at::Tensor source;  // kept alive until the collective completed
  at::Tensor result;  // the reduce-scattered shard, or undefined for an in-place all-reduce
};

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
