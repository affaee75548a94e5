// EstimateMemo (estimate.hpp): each distinct layer setting and collective of a search priced once.

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "trainplan/costmodel/estimate.hpp"

namespace trainplan::costmodel {

namespace {

bool same_group(const CollectiveGroup& a, const CollectiveGroup& b) {
  return a.size == b.size && a.per_node == b.per_node && a.pods == b.pods && a.groups_per_pod == b.groups_per_pod;
}

bool same_lora(const LoraConfig& a, const LoraConfig& b) {
  return a.rank == b.rank && a.targets == b.targets && a.base_format == b.base_format && a.alpha == b.alpha && a.dropout == b.dropout;
}

// A new field of LayerSetting, LoraConfig or CollectiveGroup must be compared in same_setting
// (and may be hashed below). A structured binding names every field of its struct, so a field
// added to one of them stops the build here until it is.
[[maybe_unused]] void every_field_is_compared(const LayerSetting& s, const LoraConfig& l, const CollectiveGroup& g) {
  [[maybe_unused]] const auto& [micro_batch, seq_len, tp, cp, ep, sequence_parallel, precision, dropout, sharded_gradients, attention,
                                attention_mask, loss, attention_kernel, fp8_recipe, fp8_gathered_weights, autocast, cp_comm, stack, recompute, mode, lora, tp_group,
                                cp_group, ep_group] = s;
  [[maybe_unused]] const auto& [rank, targets, base_format, alpha, lora_dropout] = l;
  [[maybe_unused]] const auto& [size, per_node, pods, groups_per_pod] = g;
}

struct CollectiveKey {
  Collective kind;
  double bytes;
  CollectiveGroup group;
  bool operator==(const CollectiveKey& o) const { return kind == o.kind && bytes == o.bytes && same_group(group, o.group); }
};

// A cheap hash (std::hash<double> hashes a number's bytes one by one): bits mixed in as
// boost::hash_combine does, a number by its bits (+0 for -0, so that equal keys hash alike).
std::size_t mix_bits(std::size_t h, std::uint64_t bits) {
  bits *= 0x9e3779b97f4a7c15ULL;
  return h ^ (bits + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}
std::size_t mix(std::size_t h, double v) {
  if (v == 0) v = 0;
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return mix_bits(h, bits);
}

// The fields a search varies; the others are compared by same_setting on a hit.
std::size_t setting_hash(const LayerSetting& s) {
  std::size_t h = mix(0, s.micro_batch);
  for (double v : {s.seq_len, static_cast<double>(s.tp), static_cast<double>(s.cp), static_cast<double>(s.ep),
                   static_cast<double>(s.sequence_parallel), static_cast<double>(s.sharded_gradients), static_cast<double>(s.recompute),
                   static_cast<double>(s.tp_group.per_node), static_cast<double>(s.cp_group.per_node),
                   static_cast<double>(s.ep_group.per_node), static_cast<double>(s.cp_comm ? static_cast<int>(*s.cp_comm) + 1 : 0)}) {
    h = mix(h, v);
  }
  return h;
}

struct SettingHash {
  std::size_t operator()(const LayerSetting& s) const { return setting_hash(s); }
};
struct SameSetting {
  bool operator()(const LayerSetting& a, const LayerSetting& b) const { return same_setting(a, b); }
};

struct PartitionKey {
  int layers, chunks;
  double layer_seconds, first_seconds, last_seconds;
  bool operator==(const PartitionKey& o) const {
    return layers == o.layers && chunks == o.chunks && layer_seconds == o.layer_seconds && first_seconds == o.first_seconds &&
           last_seconds == o.last_seconds;
  }
};

struct PartitionKeyHash {
  std::size_t operator()(const PartitionKey& k) const {
    return mix(mix(mix(mix(mix(0, k.layers), k.chunks), k.layer_seconds), k.first_seconds), k.last_seconds);
  }
};

struct CollectiveKeyHash {
  std::size_t operator()(const CollectiveKey& k) const {
    // The group's sizes (each below 2^20 ranks in any profile) packed with the kind into one
    // number; a collision only costs a comparison.
    const std::uint64_t packed = (static_cast<std::uint64_t>(k.kind) << 60) ^ (static_cast<std::uint64_t>(k.group.size) << 40) ^
                                 (static_cast<std::uint64_t>(k.group.per_node) << 20) ^ static_cast<std::uint64_t>(k.group.pods) ^
                                 (static_cast<std::uint64_t>(k.group.groups_per_pod) << 30);
    return mix_bits(mix(0, k.bytes), packed);
  }
};

}  // namespace

bool same_setting(const LayerSetting& a, const LayerSetting& b) {
  return a.micro_batch == b.micro_batch && a.seq_len == b.seq_len && a.tp == b.tp && a.cp == b.cp && a.ep == b.ep &&
         a.sequence_parallel == b.sequence_parallel && a.precision == b.precision && a.dropout == b.dropout &&
         a.sharded_gradients == b.sharded_gradients && a.attention == b.attention && a.attention_mask == b.attention_mask && a.loss == b.loss &&
         a.attention_kernel == b.attention_kernel && a.fp8_recipe == b.fp8_recipe && a.fp8_gathered_weights == b.fp8_gathered_weights && a.autocast == b.autocast && a.cp_comm == b.cp_comm && a.stack == b.stack &&
         a.recompute == b.recompute && a.mode == b.mode && same_lora(a.lora, b.lora) && same_group(a.tp_group, b.tp_group) &&
         same_group(a.cp_group, b.cp_group) && same_group(a.ep_group, b.ep_group);
}

struct EstimateMemo::Impl {
  struct Entry {
    std::optional<LayerCost> layer;
    std::optional<EndsCost> ends;
  };
  // The model and profile of the first call, by name: a call naming others bypasses the memo.
  std::optional<std::string> model_name, hw_name;
  std::unordered_map<LayerSetting, Entry, SettingHash, SameSetting> entries;
  std::unordered_map<CollectiveKey, Seconds, CollectiveKeyHash> collectives;
  std::unordered_map<PartitionKey, std::vector<int>, PartitionKeyHash> partitions;
  std::unique_ptr<EstimateMemo> sustained;

  // The names of the model and profile of the first call, compared on every call (a caller that
  // reuses one object for another model would otherwise be served the first one's costs).
  bool serves(const ModelSpec& model, const HardwareProfile& hw) {
    if (!model_name) model_name = model.name;
    return *model_name == model.name && serves(hw);
  }
  bool serves(const HardwareProfile& hw) {
    if (!hw_name) hw_name = hw.name;
    return *hw_name == hw.name;
  }

  Entry& entry(const LayerSetting& s) { return entries[s]; }
};

EstimateMemo::EstimateMemo() : impl_(std::make_unique<Impl>()) {}
EstimateMemo::~EstimateMemo() = default;

LayerCost EstimateMemo::layer(const ModelSpec& model, const HardwareProfile& hw, const LayerSetting& s) {
  if (!impl_->serves(model, hw)) return transformer_layer_cost(model, hw, s);
  Impl::Entry& e = impl_->entry(s);
  if (!e.layer) e.layer = transformer_layer_cost(model, hw, s);
  return *e.layer;
}

EndsCost EstimateMemo::ends(const ModelSpec& model, const HardwareProfile& hw, const LayerSetting& s) {
  if (!impl_->serves(model, hw)) return ends_cost(model, hw, s);
  Impl::Entry& e = impl_->entry(s);
  if (!e.ends) e.ends = ends_cost(model, hw, s);
  return *e.ends;
}

Seconds EstimateMemo::collective(const HardwareProfile& hw, Collective kind, Bytes bytes, CollectiveGroup g) {
  if (!impl_->serves(hw)) return collective_time(hw, kind, bytes, g);
  const CollectiveKey key{kind, bytes.value(), g};
  const auto it = impl_->collectives.find(key);
  if (it != impl_->collectives.end()) return it->second;
  const Seconds t = collective_time(hw, kind, bytes, g);
  impl_->collectives.emplace(key, t);
  return t;
}

const std::vector<int>& EstimateMemo::partition(int layers, int chunks, double layer_seconds, double first_seconds, double last_seconds) {
  const PartitionKey key{layers, chunks, layer_seconds, first_seconds, last_seconds};
  auto it = impl_->partitions.find(key);
  if (it == impl_->partitions.end()) {
    it = impl_->partitions.emplace(key, partition_layers(layers, chunks, layer_seconds, first_seconds, last_seconds)).first;
  }
  return it->second;
}

bool EstimateMemo::serves(const ModelSpec& model, const HardwareProfile& hw) { return impl_->serves(model, hw); }

EstimateMemo& EstimateMemo::sustained() {
  if (!impl_->sustained) impl_->sustained = std::make_unique<EstimateMemo>();
  return *impl_->sustained;
}

std::size_t EstimateMemo::settings() const { return impl_->entries.size(); }
std::size_t EstimateMemo::collectives() const { return impl_->collectives.size(); }

}  // namespace trainplan::costmodel
