// NF4 and INT8 storage of frozen weights (see quantize.hpp).

#include "quantize.hpp"

#include <algorithm>
#include <stdexcept>

#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "cuda_kernels.hpp"
#endif

namespace trainplan::executor {

namespace cm = trainplan::costmodel;

namespace {

constexpr int64_t kBlock = 64;   // values per NF4 block
constexpr int64_t kGroup = 256;  // blocks per float32 scale of the block maxima
constexpr double kTiny = 1e-12;
constexpr int64_t kChunkBlocks = 16384;  // 1 Mi values per dequantisation pass

at::Tensor padded(const at::Tensor& flat, int64_t multiple) {
  const int64_t n = flat.numel(), rounded = (n + multiple - 1) / multiple * multiple;
  return rounded == n ? flat : at::cat({flat, at::zeros({rounded - n}, flat.options())});
}

at::Tensor levels_on(const at::Device& device) {
  return at::tensor(nf4_levels(), at::TensorOptions().dtype(at::kFloat)).to(device);
}

// The block maxima of an NF4 matrix from their 8-bit codes.
at::Tensor block_maxima(const QuantizedMatrix& q) {
  const int64_t blocks = q.block_codes.numel();
  const at::Tensor scales = q.group_scales.repeat_interleave(kGroup).narrow(0, 0, blocks);
  return (q.block_codes.to(at::kFloat) - 128.0) / 127.0 * scales + q.offset;
}

}  // namespace

const std::vector<float>& nf4_levels() {
  // bitsandbytes functional.py, the NF4 data type (Dettmers et al. 2023, appendix E).
  static const std::vector<float> levels = {-1.0f,
                                            -0.6961928009986877f,
                                            -0.5250730514526367f,
                                            -0.39491748809814453f,
                                            -0.28444138169288635f,
                                            -0.18477343022823334f,
                                            -0.09105003625154495f,
                                            0.0f,
                                            0.07958029955625534f,
                                            0.16093020141124725f,
                                            0.24611230194568634f,
                                            0.33791524171829224f,
                                            0.44070982933044434f,
                                            0.5626170039176941f,
                                            0.7229568362236023f,
                                            1.0f};
  return levels;
}

double QuantizedMatrix::bytes() const {
  const auto size = [](const at::Tensor& t) { return t.defined() ? static_cast<double>(t.numel()) * t.element_size() : 0.0; };
  return size(codes) + size(block_codes) + size(group_scales);
}

QuantizedMatrix quantize(const at::Tensor& w, cm::QuantFormat format) {
  if (w.dim() != 2) throw std::invalid_argument("quantize: a matrix (2-D tensor) expected");
  QuantizedMatrix q;
  q.format = format;
  q.shape = w.sizes().vec();
  const at::Tensor x = w.to(at::kFloat);
  if (format == cm::QuantFormat::kInt8) {
    const at::Tensor scale = x.abs().amax(1).clamp_min(kTiny) / 127.0;  // per row
    q.codes = at::round(x / scale.unsqueeze(1)).clamp_(-127, 127).to(at::kChar).contiguous();
    q.group_scales = scale.contiguous();
    return q;
  }
  const at::Tensor blocks = padded(x.reshape({-1}), kBlock).view({-1, kBlock});
  const at::Tensor maxima = blocks.abs().amax(1);                                   // [blocks]
  const at::Tensor normalised = blocks / maxima.clamp_min(kTiny).unsqueeze(1);     // [-1, 1]
  const at::Tensor levels = levels_on(w.device());
  const at::Tensor midpoints = (levels.narrow(0, 0, 15) + levels.narrow(0, 1, 15)) / 2;
  const at::Tensor index = at::bucketize(normalised, midpoints).reshape({-1, 2});  // nearest level, two per byte
  q.codes = (index.select(1, 0).bitwise_left_shift(4).bitwise_or(index.select(1, 1))).to(at::kByte).contiguous();
  // Double quantisation of the maxima: centred, then 8 bits with a float32 scale per 256 blocks.
  q.offset = maxima.mean().item<double>();
  const at::Tensor centred = maxima - q.offset;
  const at::Tensor groups = padded(centred, kGroup).view({-1, kGroup});
  q.group_scales = groups.abs().amax(1).clamp_min(kTiny).contiguous();
  const at::Tensor scales = q.group_scales.repeat_interleave(kGroup).narrow(0, 0, maxima.numel());
  q.block_codes = (at::round(centred / scales * 127.0).clamp_(-127, 127) + 128.0).to(at::kByte).contiguous();
  return q;
}

void dequantize_into(const QuantizedMatrix& q, at::Tensor out, bool fused) {
  const int64_t n = q.shape[0] * q.shape[1];
  if (out.numel() != n) throw std::invalid_argument("dequantize_into: the output has another size than the matrix");
#ifdef TRAINPLAN_HAVE_CUDA_KERNELS
  if (fused && out.is_cuda() && out.scalar_type() == at::kBFloat16 && out.is_contiguous()) {
    void* stream = c10::cuda::getCurrentCUDAStream(out.device().index()).stream();
    if (q.format == cm::QuantFormat::kInt8) {
      cuda_kernels::int8_dequantize(q.codes.data_ptr<int8_t>(), q.group_scales.data_ptr<float>(), q.shape[0], q.shape[1], out.data_ptr(),
                                    stream);
    } else {
      cuda_kernels::Nf4Levels levels{};
      std::copy(nf4_levels().begin(), nf4_levels().end(), levels.v);
      cuda_kernels::nf4_dequantize(q.codes.data_ptr<uint8_t>(), q.block_codes.data_ptr<uint8_t>(), q.group_scales.data_ptr<float>(),
                                   static_cast<float>(q.offset), levels, n, out.data_ptr(), stream);
    }
    return;
  }
#else
  (void)fused;
#endif
  if (q.format == cm::QuantFormat::kInt8) {
    out.view({q.shape[0], q.shape[1]}).copy_(q.codes.to(at::kFloat) * q.group_scales.unsqueeze(1));
    return;
  }
  // A chunk of blocks at a time: the level indices are int64 (ATen's gather), 16 bytes a value
  // with the stacked copy, so a whole 8B-sized matrix at once would hold gigabytes of them.
  const at::Tensor levels = levels_on(q.codes.device()), maxima = block_maxima(q);
  const at::Tensor flat = out.view({-1});
  const int64_t blocks = maxima.numel();
  for (int64_t first = 0; first < blocks; first += kChunkBlocks) {
    const int64_t count = std::min(kChunkBlocks, blocks - first);
    const at::Tensor codes = q.codes.narrow(0, first * kBlock / 2, count * kBlock / 2);
    const at::Tensor index = at::stack({codes.bitwise_right_shift(4), codes.bitwise_and(15)}, 1).to(at::kLong).view({count, kBlock});
    const at::Tensor values = levels.index({index}).mul_(maxima.narrow(0, first, count).unsqueeze(1)).view({-1});
    const int64_t start = first * kBlock, length = std::min(count * kBlock, n - start);
    flat.narrow(0, start, length).copy_(values.narrow(0, 0, length));
  }
}

namespace {

constexpr int64_t kPieceAlignment = 16;  // bytes: any dtype's view of a piece is aligned

at::Tensor piece_view(const PackedUnit::Piece& piece, const at::Tensor& buffer) {
  int64_t numel = 1;
  for (int64_t d : piece.shape) numel *= d;
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(piece.dtype));
  return buffer.narrow(0, piece.offset, bytes).view(piece.dtype).view(piece.shape);
}

}  // namespace

at::Tensor pack_unit(const std::vector<QuantizedMatrix>& matrices, const std::vector<at::Tensor>& plain, int64_t multiple,
                     const at::Device& device, PackedUnit& layout) {
  if (matrices.size() != plain.size()) throw std::invalid_argument("pack_unit: one matrix or tensor per slot");
  layout = PackedUnit{};
  std::vector<at::Tensor> sources;
  int64_t end = 0;
  const auto add = [&](PackedUnit::Slot& slot, const at::Tensor& t) {
    const at::Tensor c = t.contiguous();
    slot.pieces.push_back({end, c.scalar_type(), c.sizes().vec()});
    sources.push_back(c);
    end += (c.numel() * static_cast<int64_t>(c.element_size()) + kPieceAlignment - 1) / kPieceAlignment * kPieceAlignment;
  };
  for (std::size_t k = 0; k < matrices.size(); ++k) {
    PackedUnit::Slot slot;
    const QuantizedMatrix& q = matrices[k];
    slot.quantized = q.codes.defined();
    if (slot.quantized) {
      slot.matrix.format = q.format;
      slot.matrix.shape = q.shape;
      slot.matrix.offset = q.offset;
      add(slot, q.codes);
      if (q.block_codes.defined()) add(slot, q.block_codes);
      add(slot, q.group_scales);
    } else {
      add(slot, plain.at(k));
    }
    layout.slots.push_back(std::move(slot));
  }
  const int64_t m = std::max<int64_t>(multiple, 1);
  layout.bytes = std::max<int64_t>(m, (end + m - 1) / m * m);
  at::Tensor buffer = at::zeros({layout.bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  std::size_t next = 0;
  for (const PackedUnit::Slot& slot : layout.slots) {
    for (const PackedUnit::Piece& piece : slot.pieces) piece_view(piece, buffer).copy_(sources[next++]);
  }
  return buffer;
}

QuantizedMatrix packed_matrix(const PackedUnit& layout, std::size_t k, const at::Tensor& buffer) {
  const PackedUnit::Slot& slot = layout.slots.at(k);
  if (!slot.quantized) throw std::logic_error("packed_matrix: slot " + std::to_string(k) + " is not quantised");
  QuantizedMatrix q = slot.matrix;
  q.codes = piece_view(slot.pieces[0], buffer);
  if (slot.pieces.size() == 3) q.block_codes = piece_view(slot.pieces[1], buffer);
  q.group_scales = piece_view(slot.pieces.back(), buffer);
  return q;
}

at::Tensor packed_tensor(const PackedUnit& layout, std::size_t k, const at::Tensor& buffer) {
  const PackedUnit::Slot& slot = layout.slots.at(k);
  if (slot.quantized) throw std::logic_error("packed_tensor: slot " + std::to_string(k) + " is quantised");
  return piece_view(slot.pieces[0], buffer);
}

at::Tensor dequantize(const QuantizedMatrix& q, at::ScalarType dtype) {
  at::Tensor out = at::empty(q.shape, q.codes.options().dtype(dtype));
  dequantize_into(q, out);
  return out;
}

}  // namespace trainplan::executor
