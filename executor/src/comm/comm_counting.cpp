// A communicator that counts the bytes this rank sends (see comm.hpp make_counting_communicator).

#include <atomic>

#include "comm.hpp"

namespace trainplan::executor {
namespace {

double bytes_of(const at::Tensor& t) { return static_cast<double>(t.numel()) * static_cast<double>(t.element_size()); }

class CountingCommunicator final : public Communicator {
 public:
  CountingCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<std::atomic<double>> sent)
      : inner_(std::move(inner)), sent_(std::move(sent)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  at::Device device() const override { return inner_->device(); }

  // The ring algorithms' bytes per rank (NCCL's "bus bandwidth" convention, nccl-tests
  // doc/PERFORMANCE.md): all-reduce 2 (n-1)/n of the buffer, reduce-scatter (n-1)/n of the
  // input, all-gather (n-1)/n of the output, a send all of it; an all-to-all what goes to others.
  std::unique_ptr<Work> all_reduce_sum(const at::Tensor& tensor) override {
    add(2.0 * share() * bytes_of(tensor));
    return inner_->all_reduce_sum(tensor);
  }
  std::unique_ptr<Work> reduce_scatter_sum(const at::Tensor& input, const at::Tensor& output) override {
    add(share() * bytes_of(input));
    return inner_->reduce_scatter_sum(input, output);
  }
  std::unique_ptr<Work> all_gather(const at::Tensor& input, const at::Tensor& output) override {
    add(share() * bytes_of(output));
    return inner_->all_gather(input, output);
  }
  std::unique_ptr<Work> all_to_all(const at::Tensor& input, const std::vector<int64_t>& send_counts, const at::Tensor& output,
                                   const std::vector<int64_t>& recv_counts) override {
    double elements = 0;  // what leaves this rank: its own share stays
    for (std::size_t j = 0; j < send_counts.size(); ++j) {
      if (static_cast<int>(j) != rank()) elements += static_cast<double>(send_counts[j]);
    }
    add(elements * static_cast<double>(input.element_size()));
    return inner_->all_to_all(input, send_counts, output, recv_counts);
  }
  std::unique_ptr<Work> send(const at::Tensor& tensor, int peer, int tag) override {
    add(bytes_of(tensor));
    return inner_->send(tensor, peer, tag);
  }
  std::unique_ptr<Work> recv(const at::Tensor& tensor, int peer, int tag) override { return inner_->recv(tensor, peer, tag); }
  // Control traffic (checkpoints, strings, barriers) is not counted: it is not the step's.
  void broadcast(const at::Tensor& tensor, int root) override { inner_->broadcast(tensor, root); }
  void barrier() override { inner_->barrier(); }
  std::vector<std::string> all_gather_strings(const std::string& value) override { return inner_->all_gather_strings(value); }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    std::unique_ptr<Communicator> sub = inner_->split(color, key, name);
    if (sub == nullptr) return nullptr;
    return std::make_unique<CountingCommunicator>(std::move(sub), sent_);
  }
  [[noreturn]] void abort(int exit_code) override { inner_->abort(exit_code); }

 private:
  [[nodiscard]] double share() const { return static_cast<double>(size() - 1) / static_cast<double>(size()); }
  void add(double bytes) {  // C++17 has no atomic<double>::fetch_add; autograd may call from its device threads
    double seen = sent_->load();
    while (!sent_->compare_exchange_weak(seen, seen + bytes)) {
    }
  }
  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<std::atomic<double>> sent_;
};

}  // namespace

std::unique_ptr<Communicator> make_counting_communicator(std::unique_ptr<Communicator> inner, std::shared_ptr<std::atomic<double>> sent) {
  return std::make_unique<CountingCommunicator>(std::move(inner), std::move(sent));
}

}  // namespace trainplan::executor
