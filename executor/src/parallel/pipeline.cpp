// Pipeline stages and the step runner (see pipeline.hpp).

#include "pipeline.hpp"

#include <chrono>
#include <map>

#include <torch/csrc/autograd/autograd.h>

namespace trainplan::executor {

namespace cm = trainplan::costmodel;

namespace {

// The first layer of each model position, and one past the last.
std::vector<int> position_starts(const std::vector<int>& chunk_layers) {
  std::vector<int> starts{0};
  for (int n : chunk_layers) starts.push_back(starts.back() + n);
  return starts;
}

}  // namespace

StageUnits stage_units(const std::vector<UnitLayout>& all, const std::vector<int>& chunk_layers, int stages, int stage) {
  const int positions = static_cast<int>(chunk_layers.size());
  const int chunks = positions / stages;
  const std::vector<int> starts = position_starts(chunk_layers);
  StageUnits out;
  for (int c = 0; c < chunks; ++c) {
    const int pos = c * stages + stage;
    for (const UnitLayout& u : all) {
      const bool take = (u.kind == UnitKind::kEmbedding && pos == 0) || (u.kind == UnitKind::kHead && pos == positions - 1) ||
                        ((u.kind == UnitKind::kBlock || u.kind == UnitKind::kExperts || u.kind == UnitKind::kAdapters) && u.layer >= starts[pos] && u.layer < starts[pos + 1]);
      if (!take) continue;
      out.units.push_back(u);
      out.chunk_of_unit.push_back(c);
    }
  }
  return out;
}

int stage_of_unit(const std::string& name, const std::vector<int>& chunk_layers, int stages) {
  const int positions = static_cast<int>(chunk_layers.size());
  if (name == "embedding") return 0;
  if (name == "head") return (positions - 1) % stages;
  const int layer = std::stoi(name.substr(name.find('.') + 1));
  const std::vector<int> starts = position_starts(chunk_layers);
  for (int pos = 0; pos < positions; ++pos) {
    if (layer >= starts[pos] && layer < starts[pos + 1]) return pos % stages;
  }
  throw std::logic_error("no pipeline position holds " + name);
}

PipelineRunner::PipelineRunner(const PipelineConfig& config, DataParallelEngine& engine, PipelineLinks* links)
    : config_(config), engine_(engine), links_(links) {
  auto order = cm::pipeline_order(config.schedule, config.stages, config.virtual_stages, config.micro_batches);
  if (!order) throw std::invalid_argument(order.error().message);
  order_ = std::move(*order);
  if (const std::string why = link_order_mismatch(order_, config.stages, config.virtual_stages); !why.empty()) {
    throw std::logic_error("pipeline schedule: " + why + " (untagged links match messages in order)");
  }
}

double PipelineRunner::run_step(const BatchFn& batch, double loss_multiplier, std::vector<TraceRecord>* trace) {
  using Clock = std::chrono::steady_clock;
  const int p = config_.stages, s = config_.stage, m = config_.micro_batches;
  const int positions = p * config_.virtual_stages;
  const auto options = at::TensorOptions().dtype(config_.activation_dtype).device(config_.device);

  PhaseTimer* timer = engine_.phase_timer();
  const Clock::time_point t0 = Clock::now();
  const auto since = [&](Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); };
  const auto record = [&](const char* kind, int micro_batch, int chunk, Clock::time_point start) {
    if (trace != nullptr) trace->push_back({kind, micro_batch, chunk, since(start), since(Clock::now())});
  };

  struct Held {
    at::Tensor input, output;
  };
  std::map<std::pair<int, int>, Held> held;  // (chunk, micro-batch) between its forward and backward
  int in_flight = 0, peak = 0;
  at::Tensor loss_sum;  // on the device, read once at the end

  for (const cm::PipelinePass& pass : order_[static_cast<std::size_t>(s)]) {
    const int pos = pass.chunk * p + s, i = pass.micro_batch;
    const bool first = pos == 0, last = pos == positions - 1;
    if (pass.kind == cm::PassKind::kForward) {
      at::Tensor input, targets;
      if (first || last) {
        auto [tokens, target] = batch(i);
        if (first) input = tokens;
        targets = target;
      }
      if (!first) {
        PhaseScope receiving(timer, Phase::kPipelineReceive, i);
        const auto wait_start = Clock::now();
        input = at::empty(config_.activation_shape, options);
        links_->recv_activation(input);
        record("recv", i, pass.chunk, wait_start);
        input.requires_grad_(true);
      }
      const auto start = Clock::now();
      at::Tensor loss;
      at::Tensor output;
      {
        PhaseScope forward(timer, Phase::kForward, i);
        engine_.begin_micro_batch(i);
        output = engine_.forward_chunk(pass.chunk, input, targets, loss_multiplier, &loss);
      }
      record("forward", i, pass.chunk, start);
      if (last) {
        loss_sum = loss_sum.defined() ? loss_sum + loss : loss;
      } else {
        links_->send_activation(output.detach().contiguous());
      }
      held[{pass.chunk, i}] = Held{input, output};
      peak = std::max(peak, ++in_flight);
    } else {
      auto found = held.find({pass.chunk, i});
      if (found == held.end()) throw std::logic_error("pipeline: backward before forward");
      Held h = std::move(found->second);
      held.erase(found);
      at::Tensor grad;
      if (!last) {
        PhaseScope receiving(timer, Phase::kPipelineReceive, i);
        const auto wait_start = Clock::now();
        grad = at::empty(config_.activation_shape, options);
        links_->recv_gradient(grad);
        record("recv", i, pass.chunk, wait_start);
      }
      const auto start = Clock::now();
      {
        PhaseScope backward(timer, Phase::kBackward, i);
        engine_.backward_begin(i == m - 1);
        if (last) {
          torch::autograd::backward({h.output});
        } else {
          torch::autograd::backward({h.output}, {grad});
        }
      }
      record("backward", i, pass.chunk, start);
      const auto comm_start = Clock::now();
      engine_.backward_end();
      if (i == m - 1) record("dp_comm", -1, pass.chunk, comm_start);
      if (!first) {
        links_->send_gradient(h.input.grad().contiguous());
      }
      --in_flight;
    }
  }
  if (links_ != nullptr) links_->drain();
  peak_in_flight_ = static_cast<double>(peak) / config_.virtual_stages;
  return loss_sum.defined() ? loss_sum.item<double>() : 0.0;
}

}  // namespace trainplan::executor
