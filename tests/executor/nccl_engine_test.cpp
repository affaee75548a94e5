// The NCCL engine (executor/src/comm/comm_nccl.cpp) on one rank of one GPU: the only NCCL run one GPU
// allows (NCCL refuses two ranks on the same device), and the first check of the engine's own
// code: collectives on the communicator's side stream after the work queued on the compute
// stream, their values, the compute stream ordered after them by wait(), a Work dropped unwaited,
// and a split. Skips without a CUDA device or an NCCL build. The multi-rank paths run on CPU ranks
// (MPI) in the executor tests.

#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "comm.hpp"

namespace trainplan::executor {
namespace {

std::unique_ptr<Communicator> one_rank_nccl(std::unique_ptr<Communicator>& bootstrap) {
  bootstrap = make_self_communicator();
  return make_nccl_communicator(0, 1, bootstrap.get(), CommOptions{});
}

class NcclEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
    if (!nccl_available()) GTEST_SKIP() << "built without NCCL";
    comm_ = one_rank_nccl(bootstrap_);
  }
  // A tensor the compute stream is still writing when the call returns: chained GEMMs of 4096^2
  // (some milliseconds), so a collective that did not wait for them would read stale values.
  static at::Tensor being_written(double value) {
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
    at::Tensor a = at::full({4096, 4096}, 1.0 / 4096, f32), x = at::ones({4096, 4096}, f32);
    for (int i = 0; i < 8; ++i) x = at::mm(x, a);  // all ones, exactly: 4096 x 2^-12
    return x.narrow(0, 0, 1024).reshape({-1}) * value;
  }
  std::unique_ptr<Communicator> bootstrap_, comm_;
};

TEST_F(NcclEngine, AllReduceOfOneRankIsItsInputAfterTheWorkQueuedBeforeIt) {
  at::Tensor t = being_written(3.0);
  comm_->all_reduce_sum(t)->wait();
  EXPECT_EQ(t.min().item<float>(), 3.0f);
  EXPECT_EQ(t.max().item<float>(), 3.0f);
}

TEST_F(NcclEngine, GatherScatterAndAllToAllCopyOnOneRankAndTheComputeStreamFollows) {
  const at::Tensor in = being_written(2.0);
  at::Tensor gathered = at::zeros_like(in), scattered = at::zeros_like(in), exchanged = at::zeros_like(in);
  auto g = comm_->all_gather(in, gathered);
  auto s = comm_->reduce_scatter_sum(in, scattered);
  auto x = comm_->all_to_all(in, {in.numel()}, exchanged, {in.numel()});
  g->wait();
  s->wait();
  x->wait();
  // Read on the compute stream after wait(): ordered after the side stream's collectives.
  EXPECT_TRUE(at::equal(gathered, in));
  EXPECT_TRUE(at::equal(scattered, in));
  EXPECT_TRUE(at::equal(exchanged, in));
}

TEST_F(NcclEngine, ManyInFlightThenWaitedInOrderAndOneDroppedUnwaited) {
  std::vector<at::Tensor> tensors;
  std::vector<std::unique_ptr<Work>> works;
  for (int i = 1; i <= 8; ++i) {
    tensors.push_back(being_written(i));
    works.push_back(comm_->all_reduce_sum(tensors.back()));
  }
  { auto dropped = comm_->all_reduce_sum(being_written(9.0)); }  // the error path's destructor
  for (auto& w : works) w->wait();
  for (int i = 1; i <= 8; ++i) EXPECT_EQ(tensors[static_cast<std::size_t>(i - 1)].max().item<float>(), static_cast<float>(i)) << i;
}

TEST_F(NcclEngine, ASplitIsACommunicatorOfItsOwn) {
  std::unique_ptr<Communicator> sub = comm_->split(0, 0, "sub");
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->name(), "sub");
  at::Tensor t = being_written(5.0);
  sub->all_reduce_sum(t)->wait();
  EXPECT_EQ(t.max().item<float>(), 5.0f);
  sub->barrier();
  EXPECT_EQ(sub->all_gather_strings("one"), std::vector<std::string>{"one"});
}

}  // namespace
}  // namespace trainplan::executor
