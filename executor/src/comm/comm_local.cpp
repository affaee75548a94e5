// The single-rank communicator and helpers shared by every engine.

#include <cstdlib>

#include "comm.hpp"

namespace trainplan::executor {
namespace {

class DoneWork final : public Work {
 public:
  void wait() override {}
};

class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  std::unique_ptr<Work> all_reduce_sum(const at::Tensor&) override { return std::make_unique<DoneWork>(); }
  std::unique_ptr<Work> reduce_scatter_sum(const at::Tensor& input, const at::Tensor& output) override {
    copy_untracked(input, output);
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> all_gather(const at::Tensor& input, const at::Tensor& output) override {
    copy_untracked(input, output);
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> all_to_all(const at::Tensor& input, const std::vector<int64_t>& send_counts, const at::Tensor& output,
                                   const std::vector<int64_t>& recv_counts) override {
    if (send_counts.size() != 1 || recv_counts.size() != 1 || send_counts[0] != recv_counts[0] || input.numel() != output.numel()) {
      throw CommError("all-to-all on the one-rank group '" + name_ + "': one count each, equal, and the tensors' sizes expected");
    }
    copy_untracked(input, output);
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> send(const at::Tensor&, int peer, int) override {
    throw CommError("send to rank " + std::to_string(peer) + " on the one-rank group '" + name_ + "'");
  }
  std::unique_ptr<Work> recv(const at::Tensor&, int peer, int) override {
    throw CommError("receive from rank " + std::to_string(peer) + " on the one-rank group '" + name_ + "'");
  }
  void broadcast(const at::Tensor&, int) override {}
  void barrier() override {}
  std::vector<std::string> all_gather_strings(const std::string& value) override { return {value}; }
  std::unique_ptr<Communicator> split(int color, int, const std::string& name) override {
    if (color < 0) return nullptr;
    return std::make_unique<SelfCommunicator>(name);
  }
  [[noreturn]] void abort(int exit_code) override { std::_Exit(exit_code); }

 private:
  // Collectives write through raw memory in every engine; a copy here must not bump autograd's
  // version counter either (ZeRO-3 re-gathers into storage that saved tensors view).
  static void copy_untracked(const at::Tensor& input, const at::Tensor& output) {
    if (input.data_ptr() == output.data_ptr()) return;
    output.variable_data().copy_(input.reshape(output.sizes()));
  }
  std::string name_;
};

}  // namespace

std::unique_ptr<Communicator> make_self_communicator(const std::string& name) {
  return std::make_unique<SelfCommunicator>(name);
}

at::Tensor reducible(const at::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble ? t.to(at::kFloat) : t.contiguous();
}

double all_reduce_scalar(Communicator& comm, double value) {
  if (comm.size() == 1) return value;
  at::Tensor t = at::full({1}, value, at::TensorOptions().dtype(at::kDouble).device(comm.device()));
  comm.all_reduce_sum(t)->wait();
  return t.item<double>();
}

}  // namespace trainplan::executor
