// The estimate's supporting functions: model-state widths, ZeRO's state per device, layers kept
// gathered for reuse, the expected largest of N normals, pipeline partitions and a run's cost
// (estimate.hpp), and the helpers estimate.cpp and estimate_stage.cpp share (estimate_parts.hpp).

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "estimate_parts.hpp"
#include "trainplan/costmodel/compute.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/kernels.hpp"
#include "trainplan/costmodel/network.hpp"
#include "trainplan/costmodel/schedule.hpp"
#include "trainplan/costmodel/stack.hpp"

namespace trainplan::costmodel {

StateWidths state_widths(Precision precision, OptimizerKind optimizer, bool master_weights) {
  const bool fp32 = precision == Precision::kFp32;
  StateWidths w;
  w.weights = fp32 ? 4 : 2;
  w.gradients = fp32 ? 4 : 2;
  w.master = !fp32 && master_weights;
  // Optimizer states per parameter; mixed precision adds a 4-byte fp32 master copy. Without one
  // the parameters are the 16-bit tensors themselves and PyTorch's optimizers create their states
  // in the parameter's dtype (torch/optim/adamw.py, sgd.py at v2.8.0: torch.zeros_like(p)), so the
  // fp32 moments become 16-bit ones; bitsandbytes' 8-bit states stay 8-bit.
  const double width = fp32 || w.master ? 1.0 : 0.5;
  double states = 0;
  switch (optimizer) {
    case OptimizerKind::kAdamW: states = 8 * width; break;        // momentum + variance
    case OptimizerKind::kSgdMomentum: states = 4 * width; break;  // momentum
    case OptimizerKind::kAdafactor: states = 0; break;            // factored second moment: O(rows + cols)
    case OptimizerKind::kAdam8bit: states = 2; break;             // block-wise 8-bit momentum + variance
  }
  w.optimizer = states + (w.master ? 4 : 0);
  return w;
}

ModelStateBytes zero_model_states(double params, Precision precision, OptimizerKind optimizer, int zero_stage, int dp) {
  const StateWidths w = state_widths(precision, optimizer);
  ModelStateBytes b;
  b.weights = params * w.weights / (zero_stage >= 3 ? dp : 1);
  b.gradients = params * w.gradients / (zero_stage >= 2 ? dp : 1);
  b.optimizer = params * w.optimizer / (zero_stage >= 1 ? dp : 1);
  return b;
}

int layers_kept_for_reuse(double max_reuse_distance, double layer_params, double head_params, int stage_layers) {
  const double room = max_reuse_distance / 2.0 - head_params;
  if (max_reuse_distance <= 0 || room <= 0 || layer_params <= 0) return 0;
  return std::min(stage_layers, static_cast<int>(std::ceil(room / layer_params)));
}

namespace estimate_detail {



NodeShare node_share(const ParallelConfig& p, int gpus_per_node) {
  NodeShare n;
  int remaining = gpus_per_node;
  const auto take = [&](int size) {
    const int in_node = std::max(1, std::min(size, remaining));
    remaining = std::max(1, remaining / size);
    return in_node;
  };
  n.tp = take(p.tp);
  n.cp = take(p.cp);
  n.pp = take(p.pp);
  n.dp = take(p.dp);
  return n;
}

namespace {
// Each adapter of one layer on one TP rank: its A (rank x in) and B (out x rank) elements and
// how many of the pair there are (one per expert on MoE MLPs), as lora_params_per_layer splits them.
template <typename F>
void for_each_lora_adapter(const ModelSpec& m, const LoraConfig& lora, int tp, F&& adapter) {
  const double t = tp;
  const double h = static_cast<double>(m.hidden);
  const double f = m.moe ? static_cast<double>(m.moe->expert_ffn_hidden) : static_cast<double>(m.ffn_hidden);
  const double copies = m.moe ? m.moe->experts : 1.0;
  const double kv_split = std::min(t, static_cast<double>(m.kv_heads));
  const std::vector<LinearShape> attention = attention_linears(m);
  for (const auto& target : lora.targets) {
    if (target == "q" || target == "k" || target == "v" || target == "o") {
      for (const LinearShape& l : attention) {
        if (target != lora_target_of(l.name)) continue;
        const bool kv = !m.mla && (target == "k" || target == "v");
        if (l.split == TpSplit::kRow) adapter(lora.rank * l.in / t, l.out * lora.rank, 1.0);
        else if (l.split == TpSplit::kColumn) adapter(lora.rank * l.in, l.out / (kv ? kv_split : t) * lora.rank, 1.0);
        else adapter(lora.rank * l.in, l.out * lora.rank, 1.0);
      }
    } else if ((target == "gate" && m.features().gated_mlp) || target == "up") {
      adapter(lora.rank * h, f / t * lora.rank, copies);
    } else if (target == "down") {
      adapter(lora.rank * f / t, h * lora.rank, copies);
    }
  }
}
}  // namespace

// Adapter parameters of one layer on one TP rank of `tp`: an adapter (B A, A [rank x in], B
// [out x rank]) is split as its projection is, and only where the projection splits: a
// column-parallel projection's B by output rows (A whole on every rank), a row-parallel one's
// (o, down) A by input columns (B whole); key/value outputs over min(tp, kv_heads) ranks (Megatron
// replicates a key/value head over tp / kv_heads ranks). tp = 1: the layer's whole count.
double lora_params_per_layer(const ModelSpec& m, const LoraConfig& lora, int tp) {
  double total = 0;
  for_each_lora_adapter(m, lora, tp, [&](double a, double b, double n) { total += n * (a + b); });
  return total;
}

LayerTensors layer_tensors(const ModelSpec& m, int tp, int ep, double min_elements) {
  const double t = tp;
  const double h = static_cast<double>(m.hidden);
  const ModelFeatures f = m.features();
  const auto add = [&](LayerTensors& x, double elements, double copies) {
    x.all += copies;
    if (elements >= min_elements) x.large += copies;
  };
  const auto add_mlp = [&](LayerTensors& x, double ffn, double copies) {
    const double matrices = f.gated_mlp ? 3.0 : 2.0;
    add(x, h * ffn / t, copies * matrices);
    if (f.mlp_bias) {
      add(x, ffn / t, copies * (matrices - 1.0));  // gate and up (column-parallel)
      add(x, h, copies);                            // down (row-parallel: whole)
    }
  };
  LayerTensors attention;
  // A GPT block keeps Q, K and V in one weight (and one bias) in the codebases that define it:
  // Hugging Face GPT2Attention.c_attn, Megatron's query_key_value, GPT-NeoX's query_key_value.
  const bool one_qkv = m.architecture == Architecture::kGpt && !m.mla;
  double qkv = 0, qkv_bias = 0;
  for (const LinearShape& l : attention_linears(m)) {
    const double weight = l.split == TpSplit::kReplicated ? l.in * l.out : l.in * l.out / t;
    const double bias = l.split == TpSplit::kColumn ? l.out / t : l.out;
    const std::string name = l.name;
    if (one_qkv && (name == "q" || name == "k" || name == "v")) {
      qkv += weight;
      qkv_bias += l.bias ? bias : 0.0;
      continue;
    }
    add(attention, weight, 1.0);
    if (l.bias) add(attention, bias, 1.0);
  }
  if (qkv > 0) add(attention, qkv, 1.0);
  if (qkv_bias > 0) add(attention, qkv_bias, 1.0);
  add(attention, h, f.layer_norm ? 4.0 : 2.0);  // the block's two norms (weight, and bias for LayerNorm)
  if (m.mla) {
    if (m.mla->q_lora_rank > 0) add(attention, static_cast<double>(m.mla->q_lora_rank), 1.0);
    add(attention, static_cast<double>(m.mla->kv_lora_rank), 1.0);
  }
  LayerTensors dense = attention;
  add_mlp(dense, static_cast<double>(m.ffn_hidden), 1.0);
  if (!m.moe) return dense;
  LayerTensors moe = attention;
  add(moe, h * m.moe->experts, 1.0);  // the router
  add_mlp(moe, static_cast<double>(m.moe->expert_ffn_hidden), static_cast<double>(m.moe->experts) / std::max(1, ep));
  if (m.moe->shared_ffn_hidden > 0) add_mlp(moe, static_cast<double>(m.moe->shared_ffn_hidden), 1.0);
  const double L = m.layers, d = m.moe->dense_layers;
  return {(d * dense.all + (L - d) * moe.all) / L, (d * dense.large + (L - d) * moe.large) / L};
}

LayerTensors lora_tensors_per_layer(const ModelSpec& m, const LoraConfig& lora, int tp, double min_elements) {
  LayerTensors x;
  for_each_lora_adapter(m, lora, tp, [&](double a, double b, double n) {
    x.all += 2.0 * n;
    x.large += n * ((a >= min_elements ? 1.0 : 0.0) + (b >= min_elements ? 1.0 : 0.0));
  });
  return x;
}

int gathers_per_layer(const StackSpec& stack, double layer_params, double largest_linear, double large_tensors) {
  if (stack.dp.gather_per_tensor) return std::max(1, static_cast<int>(std::lround(large_tensors)));
  if (stack.dp.gather_bucket_params <= 0) return 1;
  return std::max(1, static_cast<int>(std::ceil(layer_params / std::max(largest_linear, std::min(stack.dp.gather_bucket_params, layer_params)))));
}

// "%.1f GiB" without printf, appended: the search formats a reason for each of thousands of plans
// that do not fit, and snprintf of doubles, then the strings' allocations, were a tenth of its time.
void append_gib(std::string& out, double bytes) {
  const double gib = bytes / 1073741824.0;
  char buf[48];
  if (!std::isfinite(gib) || std::fabs(gib) >= 1e15) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", gib);
    out += buf;
    return;
  }
  const long long tenths = std::llround(std::fabs(gib) * 10.0);
  char* p = buf;
  if (gib < 0 && tenths > 0) *p++ = '-';
  p = std::to_chars(p, buf + sizeof buf, tenths / 10).ptr;
  *p++ = '.';
  *p++ = static_cast<char>('0' + tenths % 10);
  out.append(buf, p);
  out += " GiB";
}

std::string gib_text(double bytes) {
  std::string out;
  append_gib(out, bytes);
  return out;
}

// Daly 2006: optimal checkpoint interval for a checkpoint cost delta and mean time between failures M.
double daly_interval(double delta, double mtbf) {
  if (delta >= 2 * mtbf) return mtbf;
  const double x = std::sqrt(delta / (2 * mtbf));
  return std::sqrt(2 * delta * mtbf) * (1 + x / 3 + x * x / 9) - delta;
}

}  // namespace estimate_detail

double expected_max_of_normals(double n) {
  if (n <= 1) return 0.0;
  // Acklam's rational approximation of the standard normal quantile (relative error < 1.2e-9).
  const double p = (n - 0.375) / (n + 0.25);
  constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00};
  constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01, -1.328068155288572e+01};
  constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00};
  constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00};
  if (p > 0.97575) {
    const double q = std::sqrt(-2 * std::log(1 - p));
    return -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  const double q = p - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

std::vector<int> partition_with_ends(int layers, int stages, int virtual_stages, int first_stage_layers, int last_stage_layers) {
  const int chunks = stages * virtual_stages;
  std::vector<int> n(static_cast<std::size_t>(chunks), 0);
  std::vector<int> free;
  int rest = layers;
  for (int c = 0; c < chunks; ++c) {
    const int stage = c % stages;
    if (stage == 0 && first_stage_layers > 0) {
      n[static_cast<std::size_t>(c)] = first_stage_layers / virtual_stages;
    } else if (stage == stages - 1 && last_stage_layers > 0) {
      n[static_cast<std::size_t>(c)] = last_stage_layers / virtual_stages;
    } else {
      free.push_back(c);
      continue;
    }
    rest -= n[static_cast<std::size_t>(c)];
  }
  // The rest as evenly as it goes, the earlier chunks one layer more.
  for (std::size_t i = 0; i < free.size(); ++i) {
    n[static_cast<std::size_t>(free[i])] = rest / static_cast<int>(free.size()) + (static_cast<int>(i) < rest % static_cast<int>(free.size()) ? 1 : 0);
  }
  return n;
}

namespace {

// A chunk's own work: its layers, and the embedding or the head where it holds them.
double chunk_own(const PipelineTimeline& t, int pos, double layer, double embedding, double head) {
  const int chunks = t.stages * t.virtual_stages;
  return t.chunk_layers[static_cast<std::size_t>(pos)] * layer + (pos == 0 ? embedding : 0.0) + (pos == chunks - 1 ? head : 0.0);
}

// The stage's time over its chunks, each by its own work; `sum` that stage's chunks' own work.
double chunk_share_of(const PipelineTimeline& t, int position, double whole, double sum, double layer, double embedding, double head) {
  return sum > 0 ? whole * chunk_own(t, position, layer, embedding, head) / sum : whole / t.virtual_stages;
}

// A stage's time shared over its chunks in proportion to each chunk's layers and ends (the
// stage's own passes, its gradient pass, copies and host wait, scale with what it holds).
double chunk_share(const PipelineTimeline& t, int position, const std::vector<double>& stage_seconds, double layer, double embedding,
                   double head) {
  const int stage = position % t.stages, chunks = t.stages * t.virtual_stages;
  const double whole = stage_seconds[static_cast<std::size_t>(stage)];
  if (static_cast<int>(t.chunk_layers.size()) != chunks) return whole / t.virtual_stages;
  double sum = 0;
  for (int c = 0; c < t.virtual_stages; ++c) sum += chunk_own(t, c * t.stages + stage, layer, embedding, head);
  return chunk_share_of(t, position, whole, sum, layer, embedding, head);
}

// chunk_share of every position, each told to `visit(position, seconds)`, in
// O(stages x virtual_stages). REQUIRES: chunk_layers names every chunk.
template <class Visit>
void for_each_chunk_share(const PipelineTimeline& t, const std::vector<double>& stage_seconds, double layer, double embedding, double head,
                          Visit&& visit) {
  const int p = t.stages, v = t.virtual_stages;
  for (int stage = 0; stage < p; ++stage) {
    double sum = 0;
    for (int c = 0; c < v; ++c) sum += chunk_own(t, c * p + stage, layer, embedding, head);
    for (int c = 0; c < v; ++c) {
      const int pos = c * p + stage;
      visit(pos, chunk_share_of(t, pos, stage_seconds[static_cast<std::size_t>(stage)], sum, layer, embedding, head));
    }
  }
}

std::vector<double> chunk_shares(const PipelineTimeline& t, const std::vector<double>& stage_seconds, double layer, double embedding,
                                 double head) {
  const int p = t.stages, v = t.virtual_stages, chunks = p * v;
  std::vector<double> out(static_cast<std::size_t>(chunks));
  if (static_cast<int>(t.chunk_layers.size()) != chunks) {
    for (int pos = 0; pos < chunks; ++pos) out[static_cast<std::size_t>(pos)] = stage_seconds[static_cast<std::size_t>(pos % p)] / v;
    return out;
  }
  for_each_chunk_share(t, stage_seconds, layer, embedding, head, [&](int pos, double x) { out[static_cast<std::size_t>(pos)] = x; });
  return out;
}

}  // namespace

double PipelineTimeline::chunk_forward_seconds(int position) const {
  return chunk_share(*this, position, forward_seconds, layer_forward_seconds, embedding_forward_seconds, head_forward_seconds);
}

double PipelineTimeline::chunk_backward_seconds(int position) const {
  return chunk_share(*this, position, backward_seconds, layer_backward_seconds, embedding_backward_seconds, head_backward_seconds);
}

std::vector<double> PipelineTimeline::chunk_forward_seconds_all() const {
  return chunk_shares(*this, forward_seconds, layer_forward_seconds, embedding_forward_seconds, head_forward_seconds);
}

std::vector<double> PipelineTimeline::chunk_backward_seconds_all() const {
  return chunk_shares(*this, backward_seconds, layer_backward_seconds, embedding_backward_seconds, head_backward_seconds);
}

bool PipelineTimeline::uneven_chunks() const {
  // The schedule's makespan is monotone in each pass's length and scales with them, so with every
  // forward (backward) pass between a shortest and a longest within kEvenChunks of it, the
  // makespan lies within that fraction of the even schedule's: the formula's, to the model's
  // resolution. Chunks of as many layers differ where the embedding or the head sits in one;
  // the layers are split to even out the chunks' times (partition_layers), which leaves chunks of
  // unequal layers but equal times where the ends take the place of a layer.
  constexpr double kEvenChunks = 0.005;
  const int chunks = stages * virtual_stages;
  if (static_cast<int>(chunk_layers.size()) != chunks || static_cast<int>(forward_seconds.size()) != stages ||
      static_cast<int>(backward_seconds.size()) != stages) {
    return false;
  }
  const auto spread = [&](const std::vector<double>& stage_seconds, double layer, double embedding, double head) {
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for_each_chunk_share(*this, stage_seconds, layer, embedding, head, [&](int, double x) {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    });
    return hi > 0 ? (hi - lo) / hi : 0.0;
  };
  return spread(forward_seconds, layer_forward_seconds, embedding_forward_seconds, head_forward_seconds) > kEvenChunks ||
         spread(backward_seconds, layer_backward_seconds, embedding_backward_seconds, head_backward_seconds) > kEvenChunks;
}

std::vector<int> partition_ends_in_split(int layers, int chunks) {
  std::vector<int> n(static_cast<std::size_t>(chunks), (layers + 2) / chunks);
  --n.front();
  --n.back();
  return n;
}

std::vector<int> partition_layers(int layers, int chunks, double layer_seconds, double first_seconds, double last_seconds) {
  std::vector<int> n(static_cast<std::size_t>(chunks), 1);
  const auto cost = [&](int c, int count) {
    return count * layer_seconds + (c == 0 ? first_seconds : 0.0) + (c == chunks - 1 ? last_seconds : 0.0);
  };
  // Water-filling: each further layer goes where the slowest chunk stays fastest.
  if (chunks < 3 || !(layer_seconds > 0) || !std::isfinite(layer_seconds)) {
    for (int placed = chunks; placed < layers; ++placed) {
      int best = 0;
      for (int c = 1; c < chunks; ++c) {
        if (cost(c, n[c] + 1) < cost(best, n[best] + 1) - 1e-15 * layer_seconds) best = c;
      }
      ++n[best];
    }
    return n;
  }
  // The same filling in O(layers) (this runs once per estimate, and the search makes thousands):
  // the middle chunks cost alike, so they stay level, the earlier ones one layer ahead: the first
  // `ahead` of them hold level + 1 layers, the others `level`. Of them only the first at `level`
  // can win a layer, and it wins every comparison the scan above would give to another middle chunk.
  const int middle = chunks - 2;
  int level = 1, ahead = 0;
  for (int placed = chunks; placed < layers; ++placed) {
    const double eps = 1e-15 * layer_seconds;
    int best = 0;
    double best_cost = cost(0, n[0] + 1);
    const double middle_cost = cost(1 + ahead, level + 1);
    if (middle_cost < best_cost - eps) {
      best = 1 + ahead;
      best_cost = middle_cost;
    }
    if (cost(chunks - 1, n[static_cast<std::size_t>(chunks - 1)] + 1) < best_cost - eps) best = chunks - 1;
    if (best == 0 || best == chunks - 1) {
      ++n[static_cast<std::size_t>(best)];
    } else if (++ahead == middle) {
      ++level;
      ahead = 0;
    }
  }
  for (int c = 1; c <= middle; ++c) n[static_cast<std::size_t>(c)] = c <= ahead ? level + 1 : level;
  return n;
}

RunCost run_cost(const Plan& plan, Seconds step, double checkpoint_bytes) {
  RunCost r;
  const HardwareProfile& hw = plan.cluster;
  const double tokens_per_step = static_cast<double>(plan.training.global_batch) * plan.training.seq_len;
  r.train_tokens = plan.training.train_tokens;
  r.compute_time = Seconds(r.train_tokens / tokens_per_step * step.value());
  r.checkpoint_bytes = Bytes(checkpoint_bytes);
  r.checkpoint_write_time = Bytes(checkpoint_bytes) / hw.checkpoint_write_bandwidth;
  r.job_mtbf = Seconds::hours(hw.gpu_mtbf_hours / plan.gpus);
  const double delta = r.checkpoint_write_time.value();
  const double mtbf = r.job_mtbf.value();
  const double tau = std::max(estimate_detail::daly_interval(delta, mtbf), step.value());
  r.checkpoint_interval = Seconds(tau);
  // Daly 2006, eq. 20: expected wall time for exponential failures with restart time R.
  const double restart = hw.restart_time.value();
  const double wall = mtbf * std::exp(restart / mtbf) * std::expm1((tau + delta) / mtbf) * r.compute_time.value() / tau;
  r.wall_time = Seconds(std::isfinite(wall) ? wall : r.compute_time.value() * 1e6);
  r.goodput = r.compute_time.value() / r.wall_time.value();
  r.gpu_hours = r.wall_time.in_hours() * plan.gpus;
  r.cost_usd = r.gpu_hours * hw.price_per_gpu_hour_usd;
  return r;
}

}  // namespace trainplan::costmodel
