#pragma once
// Frozen base weights stored in 4 or 8 bits for QLoRA (Dettmers et al. 2023), dequantised into
// the compute dtype when a block runs (engine.cpp gathers a quantised unit as ZeRO-3 gathers a
// sharded one).
//
// NF4: blocks of 64 consecutive values (the matrix flattened row by row), each scaled by its
// absolute maximum and rounded to the nearest of the 16 NormalFloat levels (bitsandbytes' table:
// the quantiles of N(0, 1) normalised to [-1, 1], exact 0 included), two codes per byte. The
// block maxima are quantised again ("double quantisation"): their mean subtracted, then 8-bit
// linear codes with one float32 scale per 256 blocks (bitsandbytes uses a dynamic 8-bit map
// there; a linear one changes the maxima by at most 1/254 of a group's range). Storage per value:
// 4 + 8/64 + 32/(64 x 256) = 4.127 bits, the cost model's figure.
// INT8: per output row, absmax-scaled int8 codes and one float32 scale (1 + 4/in bytes a value).

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "trainplan/costmodel/plan.hpp"

namespace trainplan::executor {

struct QuantizedMatrix {
  costmodel::QuantFormat format = costmodel::QuantFormat::kNf4;
  std::vector<int64_t> shape;  // [rows, cols]
  at::Tensor codes;            // uint8: NF4 two per byte (numel / 2, blocks padded); INT8 one per byte
  at::Tensor block_codes;      // NF4: uint8 per 64-value block, the block maximum's code
  at::Tensor group_scales;     // NF4: float32 per 256 blocks; INT8: float32 per row
  double offset = 0;           // NF4: the mean block maximum
  [[nodiscard]] double bytes() const;
};

// Quantises `w` (a 2-D floating tensor, any device); the result lives on w's device.
[[nodiscard]] QuantizedMatrix quantize(const at::Tensor& w, costmodel::QuantFormat format);
// Writes the dequantised matrix into `out` (rows x cols elements, contiguous, any float dtype).
// `fused`: a bf16 `out` on a GPU is written by cuda_kernels.hpp's kernel in one pass (the
// fused paths, --kernels fused), else by LibTorch operators.
void dequantize_into(const QuantizedMatrix& q, at::Tensor out, bool fused = false);
[[nodiscard]] at::Tensor dequantize(const QuantizedMatrix& q, at::ScalarType dtype = at::kFloat);

// A QLoRA unit's slots in one uint8 buffer: each slot a quantised matrix (its codes, block codes
// and scales) or a plain tensor (the norms' weights, in the compute dtype), every piece at a
// 16-byte boundary. ZeRO-3 shards the buffer over the data-parallel ranks and all-gathers it as
// bytes before the unit runs (FSDP-QLoRA: the base travels in 4.127 bits a value); the views
// read the buffer in place.
struct PackedUnit {
  struct Piece {
    int64_t offset = 0;  // bytes from the buffer's start
    at::ScalarType dtype = at::kByte;
    std::vector<int64_t> shape;
  };
  struct Slot {
    bool quantized = false;
    QuantizedMatrix matrix;     // quantised: format, shape and offset; its tensors undefined here
    std::vector<Piece> pieces;  // quantised: codes, then NF4's block codes, then the scales; plain: one
  };
  std::vector<Slot> slots;
  int64_t bytes = 0;  // the buffer's length, rounded up to the multiple asked for
};

// Packs `matrices[k]` (where its codes are defined) or else `plain[k]` for every slot k into a
// new uint8 buffer of `layout.bytes` (a multiple of `multiple`) on `device`.
[[nodiscard]] at::Tensor pack_unit(const std::vector<QuantizedMatrix>& matrices, const std::vector<at::Tensor>& plain, int64_t multiple,
                                   const at::Device& device, PackedUnit& layout);
// Slot k of a packed buffer, read in place: the matrix (quantised slots), or the tensor.
[[nodiscard]] QuantizedMatrix packed_matrix(const PackedUnit& layout, std::size_t k, const at::Tensor& buffer);
[[nodiscard]] at::Tensor packed_tensor(const PackedUnit& layout, std::size_t k, const at::Tensor& buffer);

// The 16 NF4 levels (bitsandbytes' create_normal_map), ascending.
[[nodiscard]] const std::vector<float>& nf4_levels();

}  // namespace trainplan::executor
