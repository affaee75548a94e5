// Context parallelism: load-balanced sequence chunks and the all-gather of keys and values
// (see context_parallel.hpp).

#include "context_parallel.hpp"

#include <limits>
#include <stdexcept>
#include <string>

#include <torch/csrc/autograd/custom_function.h>

namespace trainplan::executor {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor context_positions(int64_t seq, int cp, int rank) {
  if (cp < 1 || rank < 0 || rank >= cp || seq % (2 * cp) != 0) {
    throw std::invalid_argument("context_positions: seq_len " + std::to_string(seq) + " does not split into 2 x cp(" + std::to_string(cp) +
                                ") equal chunks (or rank " + std::to_string(rank) + " is outside the group)");
  }
  const int64_t chunk = seq / (2 * cp);
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  return at::cat({at::arange(rank * chunk, (rank + 1) * chunk, i64), at::arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk, i64)});
}

ContextParallel make_context_parallel(Communicator* comm, int64_t seq, const at::Device& device, at::ScalarType dtype) {
  ContextParallel cp;
  if (comm == nullptr || comm->size() == 1) return cp;
  cp.comm = comm;
  const int n = comm->size();
  cp.positions = context_positions(seq, n, comm->rank()).to(device);
  const int64_t chunk = seq / (2 * n);
  std::vector<at::Tensor> held;
  for (int r = 0; r < n; ++r) held.push_back(context_positions(seq, n, r));
  cp.key_order = at::argsort(at::cat(held)).to(device);  // gathered index of each global position
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  for (int half = 0; half < 2; ++half) {
    const int64_t j = half == 0 ? comm->rank() : 2 * n - 1 - comm->rank();  // the chunk's global index
    cp.chunk_keys[half] = (j + 1) * chunk;
    const int64_t keys = cp.chunk_keys[half], aligned = (keys + 15) / 16 * 16;
    const at::Tensor queries = at::arange(j * chunk, (j + 1) * chunk, i64);
    const at::Tensor allowed = at::arange(keys, i64).unsqueeze(0).le(queries.unsqueeze(1));
    at::Tensor mask = at::full({chunk, aligned}, -std::numeric_limits<double>::infinity(), at::TensorOptions().dtype(dtype).device(device));
    mask.narrow(1, 0, keys).masked_fill_(allowed.to(device), 0.0);
    cp.chunk_mask[half] = mask.narrow(1, 0, keys);
  }
  return cp;
}

at::Tensor context_slice(const ContextParallel& cp, const at::Tensor& x) {
  if (!cp.active()) return x;
  return x.index_select(1, cp.positions.to(x.device()));
}

namespace {

Communicator* comm_of(AutogradContext* ctx) { return reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt()); }

struct GatherContextFn : torch::autograd::Function<GatherContextFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    Communicator& c = *reinterpret_cast<Communicator*>(comm);
    const int n = c.size();
    const at::Tensor in = x.contiguous();
    at::Tensor out = at::empty({n, x.size(0), x.size(1), x.size(2), x.size(3)}, x.options());
    c.all_gather(in, out)->wait();
    // [n, b, heads, s, d] -> [b, heads, n * s, d]: rank r's tokens at [r s, (r + 1) s).
    return out.permute({1, 2, 0, 3, 4}).reshape({x.size(0), x.size(1), n * x.size(2), x.size(3)});  // rank order
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Communicator& c = *comm_of(ctx);
    const int n = c.size();
    const at::Tensor& g = grads[0];
    const int64_t b = g.size(0), heads = g.size(1), s = g.size(2) / n, d = g.size(3);
    // Every rank's queries attended every rank's keys: sum the gradients of each rank's piece.
    const at::Tensor in = reducible(g.reshape({b, heads, n, s, d}).permute({2, 0, 1, 3, 4}).contiguous());
    at::Tensor out = at::empty({b, heads, s, d}, in.options());
    c.reduce_scatter_sum(in, out)->wait();
    return {out.to(g.scalar_type()), at::Tensor()};
  }
};

}  // namespace

at::Tensor gather_context(const ContextParallel& cp, const at::Tensor& x) {
  if (!cp.active()) return x;
  if (x.dim() != 4) throw std::logic_error("gather_context: expected [batch, heads, seq, head_dim]");
  return GatherContextFn::apply(x, reinterpret_cast<int64_t>(cp.comm)).index_select(2, cp.key_order.to(x.device()));
}

}  // namespace trainplan::executor
