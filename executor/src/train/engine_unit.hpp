#pragma once
// The data-parallel engine's internals shared by its source files (engine.cpp: units, gathers
// and the forward; engine_gradients.cpp: the step's end and the reductions; engine_optimizer.cpp:
// the gradient norm and AdamW; engine_state.cpp: state sizes, checkpoint parts and loading).

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "comm.hpp"
#include "engine.hpp"
#include "model.hpp"
#include "quantize.hpp"

namespace trainplan::executor {

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

struct DataParallelEngine::Pending {
  std::size_t unit = 0;
  std::unique_ptr<Work> work;
  at::Tensor source;  // kept alive until the collective completed
  at::Tensor result;  // the reduce-scattered shard, or undefined for an in-place all-reduce
};

// A QLoRA unit's weights from its whole packed bytes into `dst` (the unit's flat compute tensor):
// quantised slots dequantised (`fused`: quantize.hpp dequantize_into), the others copied.
inline void dequantize_unit(const Unit& u, const at::Tensor& packed, at::Tensor dst, bool fused) {
  for (std::size_t k = 0; k < u.layout.slots.size(); ++k) {
    const ParamSlot& s = u.layout.slots[k];
    at::Tensor part = dst.narrow(0, s.offset, s.numel);
    if (u.packing.slots[k].quantized) dequantize_into(packed_matrix(u.packing, k, packed), part, fused);
    else part.copy_(packed_tensor(u.packing, k, packed).reshape({-1}));
  }
}

}  // namespace trainplan::executor
