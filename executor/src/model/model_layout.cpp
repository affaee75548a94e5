// The executor's model layout (model.hpp): the units, their parameter slots and shards, and the
// seeded initial weights of each unit. model.cpp holds the forward.

#include "model.hpp"

#include <cmath>
#include <initializer_list>
#include <map>
#include <stdexcept>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace trainplan::executor {

namespace cm = trainplan::costmodel;

namespace {

constexpr double kInitStd = 0.02;

// How one parameter is cut over the TP group.
struct Cut {
  int split_dim = -1;
  int shard_index = 0, shard_count = 1;
  bool primary = true;
  GradSum grad_sum = GradSum::kNone;
  bool tied_copy = false;
};

void add_slot(UnitLayout& u, const std::string& name, std::vector<int64_t> full_shape, InitKind init, bool decay,
              const Cut& cut = {}) {
  ParamSlot s;
  s.name = (u.kind == UnitKind::kExperts || u.kind == UnitKind::kAdapters ? "layers." + std::to_string(u.layer) : u.name) + "." + name;
  s.full_shape = full_shape;
  s.shape = std::move(full_shape);
  if (cut.split_dim >= 0) s.shape[static_cast<std::size_t>(cut.split_dim)] /= cut.shard_count;
  s.split_dim = cut.split_dim;
  s.shard_index = cut.shard_index;
  s.shard_count = cut.shard_count;
  s.primary = cut.primary;
  s.grad_sum = cut.grad_sum;
  s.tied_copy = cut.tied_copy;
  s.numel = 1;
  for (int64_t d : s.shape) s.numel *= d;
  s.offset = u.numel;
  s.init = init;
  s.weight_decay = decay;
  u.numel += s.numel;
  u.slots.push_back(std::move(s));
}

// The cuts of a Megatron-style layout for one TP rank.
struct Cuts {
  Cut column, row, replicated, kv;
  explicit Cuts(const cm::ModelSpec& m, const ModelSharding& s) {
    const int tp = s.tp, r = s.tp_rank;
    column = {0, r, tp, true, GradSum::kNone, false};
    row = {1, r, tp, true, GradSum::kNone, false};
    replicated = {-1, 0, 1, r == 0, tp > 1 && s.sequence_parallel ? GradSum::kTensorParallel : GradSum::kNone, false};
    if (tp <= m.kv_heads) {
      kv = column;
    } else {  // tp / kv_heads ranks share each key/value head
      const int share = tp / m.kv_heads;
      kv = {0, r / share, m.kv_heads, r % share == 0, GradSum::kKvGroup, false};
    }
    if (tp == 1) column = row = replicated = kv = Cut{};
  }
};

uint64_t name_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a 64
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

// The adapters of one block (LoraSpec): for each target, A [rank x in] and B [out x rank], cut as
// the base projection is where it is cut (model.hpp) and whole elsewhere, their gradients then
// summed over the TP group: a column-parallel projection's A meets every rank's part of the
// output gradient; a row-parallel one's B every rank's partial product.
UnitLayout adapters_unit(const cm::ModelSpec& m, const ModelSharding& sharding, const Cuts& c, int layer) {
  const int64_t h = m.hidden, kv = m.kv_dim(), f = m.ffn_hidden;
  Cut summed{-1, 0, 1, sharding.tp_rank == 0, sharding.tp > 1 ? GradSum::kTensorParallel : GradSum::kNone, false};
  UnitLayout u{"layers." + std::to_string(layer) + ".lora", UnitKind::kAdapters, layer, {}, 0};
  const int64_t r = sharding.lora.rank;
  for (const std::string& t : lora_target_order()) {
    if (!sharding.lora.has(t)) continue;
    const bool row = t == "o" || t == "down";
    const int64_t in = t == "down" ? f : h;
    const int64_t out = t == "k" || t == "v" ? kv : t == "gate" || t == "up" ? f : h;
    const Cut& base = row ? c.row : t == "k" || t == "v" ? c.kv : c.column;
    const std::string name = lora_base_slot(t);
    add_slot(u, name + ".lora_A.weight", {r, in}, InitKind::kFanInUniform, true, row ? base : summed);
    add_slot(u, name + ".lora_B.weight", {out, r}, InitKind::kZeros, true, row ? summed : base);
  }
  return u;
}

}  // namespace

const std::vector<std::string>& lora_target_order() {
  static const std::vector<std::string> order{"q", "k", "v", "o", "gate", "up", "down"};
  return order;
}

std::string lora_base_slot(const std::string& target) {
  if (target == "q" || target == "k" || target == "v" || target == "o") return "attention.w" + target;
  return "mlp." + target;
}

bool LoraSpec::has(const std::string& target) const {
  for (const std::string& t : targets) {
    if (t == target) return true;
  }
  return false;
}

std::vector<UnitLayout> model_layout(const cm::ModelSpec& m, const ModelSharding& sharding) {
  const bool gpt = m.architecture == cm::Architecture::kGpt;
  const int64_t h = m.hidden, kv = m.kv_dim(), f = m.ffn_hidden;
  const Cuts c(m, sharding);
  std::vector<UnitLayout> units;

  UnitLayout emb{"embedding", UnitKind::kEmbedding, -1, {}, 0};
  add_slot(emb, "tokens.weight", {m.vocab, h}, InitKind::kNormal, true, c.column);
  if (gpt) add_slot(emb, "positions.weight", {m.max_seq_len, h}, InitKind::kNormal, false, c.replicated);
  units.push_back(std::move(emb));

  for (int l = 0; l < m.layers; ++l) {
    UnitLayout b{"layers." + std::to_string(l), UnitKind::kBlock, l, {}, 0};
    add_slot(b, "attention_norm.weight", {h}, InitKind::kOnes, false, c.replicated);
    if (gpt) add_slot(b, "attention_norm.bias", {h}, InitKind::kZeros, false, c.replicated);
    add_slot(b, "attention.wq.weight", {h, h}, InitKind::kNormal, true, c.column);
    add_slot(b, "attention.wk.weight", {kv, h}, InitKind::kNormal, true, c.kv);
    add_slot(b, "attention.wv.weight", {kv, h}, InitKind::kNormal, true, c.kv);
    add_slot(b, "attention.wo.weight", {h, h}, InitKind::kScaledNormal, true, c.row);
    if (gpt) {
      add_slot(b, "attention.wq.bias", {h}, InitKind::kZeros, false, c.column);
      add_slot(b, "attention.wk.bias", {kv}, InitKind::kZeros, false, c.kv);
      add_slot(b, "attention.wv.bias", {kv}, InitKind::kZeros, false, c.kv);
      add_slot(b, "attention.wo.bias", {h}, InitKind::kZeros, false, c.replicated);
    }
    add_slot(b, "mlp_norm.weight", {h}, InitKind::kOnes, false, c.replicated);
    if (gpt) {
      add_slot(b, "mlp_norm.bias", {h}, InitKind::kZeros, false, c.replicated);
      add_slot(b, "mlp.fc1.weight", {f, h}, InitKind::kNormal, true, c.column);
      add_slot(b, "mlp.fc1.bias", {f}, InitKind::kZeros, false, c.column);
      add_slot(b, "mlp.fc2.weight", {h, f}, InitKind::kScaledNormal, true, c.row);
      add_slot(b, "mlp.fc2.bias", {h}, InitKind::kZeros, false, c.replicated);
    } else if (is_moe_layer(m, l)) {  // moe.hpp; REQUIRES tp = 1 (the trainer refuses more)
      add_slot(b, "moe.router.weight", {m.moe->experts, h}, InitKind::kNormal, true, c.replicated);
    } else {
      add_slot(b, "mlp.gate.weight", {f, h}, InitKind::kNormal, true, c.column);
      add_slot(b, "mlp.up.weight", {f, h}, InitKind::kNormal, true, c.column);
      add_slot(b, "mlp.down.weight", {h, f}, InitKind::kScaledNormal, true, c.row);
    }
    b.frozen = sharding.lora.active();
    units.push_back(std::move(b));
    if (sharding.lora.active()) units.push_back(adapters_unit(m, sharding, c, l));
    if (!gpt && is_moe_layer(m, l)) {
      const int64_t fe = m.moe->expert_ffn_hidden;
      const int local = m.moe->experts / sharding.ep;
      UnitLayout x{"layers." + std::to_string(l) + ".experts", UnitKind::kExperts, l, {}, 0};
      for (int e = sharding.ep_rank * local; e < (sharding.ep_rank + 1) * local; ++e) {
        const std::string expert = "moe.experts." + std::to_string(e) + ".";
        add_slot(x, expert + "gate.weight", {fe, h}, InitKind::kNormal, true, c.replicated);
        add_slot(x, expert + "up.weight", {fe, h}, InitKind::kNormal, true, c.replicated);
        add_slot(x, expert + "down.weight", {h, fe}, InitKind::kScaledNormal, true, c.replicated);
        for (std::size_t k = x.slots.size() - 3; k < x.slots.size(); ++k) x.slots[k].expert = e;
      }
      units.push_back(std::move(x));
    }
  }

  UnitLayout head{"head", UnitKind::kHead, -1, {}, 0};
  add_slot(head, "norm.weight", {h}, InitKind::kOnes, false, c.replicated);
  if (gpt) add_slot(head, "norm.bias", {h}, InitKind::kZeros, false, c.replicated);
  if (!m.tied_embeddings) {
    add_slot(head, "output.weight", {m.vocab, h}, InitKind::kNormal, true, c.column);
  } else if (sharding.split_tied_embedding) {
    Cut copy = c.column;
    copy.tied_copy = true;
    add_slot(head, "output.weight", {m.vocab, h}, InitKind::kNormal, true, copy);
  }
  units.push_back(std::move(head));
  if (sharding.lora.active()) {
    for (UnitLayout& u : units) u.frozen = u.kind != UnitKind::kAdapters;
  }
  return units;
}

at::Tensor slot_piece(const ParamSlot& s, const at::Tensor& full) {
  const at::Tensor whole = full.reshape(s.full_shape);
  if (s.split_dim < 0) return whole;
  const int64_t size = s.shape[static_cast<std::size_t>(s.split_dim)];
  return whole.narrow(s.split_dim, s.shard_index * size, size);
}

namespace {

// Values are drawn in chunks of kInitChunk, each from its own generator seeded by (the run's seed,
// the unit, the parameter, the chunk): the same values whatever the threads or the layout, drawn
// on every core at once (one generator is a serial stream: a 70 B model's 280 GB of float32 took
// minutes from one).
constexpr int64_t kInitChunk = int64_t{1} << 20;

// SplitMix64's finaliser: a chunk's seed from its coordinates.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The whole (unsharded) unit's initial values into `flat` (float32, whole.numel elements).
void draw_whole_unit(const UnitLayout& whole, const cm::ModelSpec& m, uint64_t seed, const at::Tensor& flat) {
  const uint64_t unit_seed = mix(seed ^ name_hash(whole.name));
  const double scaled = kInitStd / std::sqrt(2.0 * m.layers);
  for (std::size_t k = 0; k < whole.slots.size(); ++k) {
    const ParamSlot& s = whole.slots[k];
    at::Tensor dst = flat.narrow(0, s.offset, s.numel);
    if (s.init == InitKind::kOnes || s.init == InitKind::kZeros) {
      dst.fill_(s.init == InitKind::kOnes ? 1.0 : 0.0);
      continue;
    }
    const uint64_t slot_seed = mix(unit_seed ^ mix(k));
    const double bound = 1.0 / std::sqrt(static_cast<double>(s.full_shape.back()));
    at::parallel_for(0, (s.numel + kInitChunk - 1) / kInitChunk, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        auto gen = at::make_generator<at::CPUGeneratorImpl>(mix(slot_seed ^ static_cast<uint64_t>(c)));
        at::Tensor piece = dst.narrow(0, c * kInitChunk, std::min(kInitChunk, s.numel - c * kInitChunk));
        if (s.init == InitKind::kNormal) piece.normal_(0.0, kInitStd, gen);
        else if (s.init == InitKind::kScaledNormal) piece.normal_(0.0, scaled, gen);
        else piece.uniform_(-bound, bound, gen);  // kFanInUniform
      }
    });
  }
}

at::Tensor init_whole_unit(const UnitLayout& whole, const cm::ModelSpec& m, uint64_t seed) {
  at::Tensor flat = at::empty({whole.numel}, at::TensorOptions().dtype(at::kFloat));
  draw_whole_unit(whole, m, seed, flat);
  return flat;
}

// Whether `unit` holds the whole unit as it is laid out unsharded: every parameter whole, at
// the same place (no TP pieces, no tied copy), so its values can be drawn in place.
bool holds_whole(const UnitLayout& unit, const UnitLayout& whole) {
  if (unit.numel != whole.numel || unit.slots.size() != whole.slots.size()) return false;
  for (std::size_t k = 0; k < unit.slots.size(); ++k) {
    const ParamSlot &a = unit.slots[k], &b = whole.slots[k];
    if (a.name != b.name || a.offset != b.offset || a.numel != b.numel || a.split_dim >= 0 || a.tied_copy) return false;
  }
  return true;
}

const UnitLayout& find_unit(const std::vector<UnitLayout>& units, const std::string& name) {
  for (const auto& u : units) {
    if (u.name == name) return u;
  }
  throw std::logic_error("model layout has no unit " + name);
}

}  // namespace

void init_unit(const UnitLayout& unit, const cm::ModelSpec& m, uint64_t seed, at::Tensor& flat, const LoraSpec& lora) {
  ModelSharding whole_model;
  whole_model.lora = lora;
  const std::vector<UnitLayout> whole_units = model_layout(m, whole_model);
  const UnitLayout& whole = find_unit(whole_units, unit.name);
  if (holds_whole(unit, whole)) {  // no TP pieces: drawn where they live
    draw_whole_unit(whole, m, seed, flat.narrow(0, 0, whole.numel));
    return;
  }
  const at::Tensor values = init_whole_unit(whole, m, seed);
  for (const ParamSlot& s : unit.slots) {
    at::Tensor full;
    if (s.tied_copy) {  // the token table, from the embedding unit
      const UnitLayout& embedding = find_unit(whole_units, "embedding");
      full = init_whole_unit(embedding, m, seed).narrow(0, embedding.slots[0].offset, embedding.slots[0].numel);
    } else {
      const ParamSlot* match = nullptr;
      for (const ParamSlot& w : whole.slots) {
        if (w.name == s.name) match = &w;
      }
      if (match == nullptr) throw std::logic_error("unit " + unit.name + " has no parameter " + s.name);
      full = values.narrow(0, match->offset, match->numel);
    }
    flat.narrow(0, s.offset, s.numel).view(s.shape).copy_(slot_piece(s, full));
  }
}

}  // namespace trainplan::executor
