// An estimate as its trainplan/estimate/v1 JSON document (estimate.hpp estimate_to_json).

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "estimate_parts.hpp"
#include "trainplan/costmodel/compute.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/kernels.hpp"
#include "trainplan/costmodel/network.hpp"
#include "trainplan/costmodel/schedule.hpp"
#include "trainplan/costmodel/stack.hpp"

namespace trainplan::costmodel {

nlohmann::json estimate_to_json(const Plan& plan, const Estimate& e) {
  const auto& m = e.memory;
  const auto& t = e.time;
  const auto& th = e.throughput;
  nlohmann::json pipeline = {
      {"stages", e.pipeline.stages},
      {"virtual_stages", e.pipeline.virtual_stages},
      {"micro_batches", e.pipeline.micro_batches},
      {"schedule", schedule_name(e.pipeline.schedule)},
      {"forward_seconds", e.pipeline.forward_seconds},
      {"backward_seconds", e.pipeline.backward_seconds},
      {"p2p_seconds", e.pipeline.p2p_seconds},
      {"pass_comm_seconds", e.pipeline.pass_comm_seconds},
      {"chunk_layers", e.pipeline.chunk_layers},
  };
  // Each model chunk's pass in pipeline order (the chunks of a stage differ where their layers do).
  nlohmann::json chunk_forward = nlohmann::json::array(), chunk_backward = nlohmann::json::array();
  for (int c = 0; c < e.pipeline.stages * e.pipeline.virtual_stages && !e.pipeline.forward_seconds.empty(); ++c) {
    chunk_forward.push_back(e.pipeline.chunk_forward_seconds(c));
    chunk_backward.push_back(e.pipeline.chunk_backward_seconds(c));
  }
  pipeline["chunk_forward_seconds"] = std::move(chunk_forward);
  pipeline["chunk_backward_seconds"] = std::move(chunk_backward);
  return {
      {"schema", "trainplan/estimate/v1"},
      {"name", plan.name},
      {"model", plan.model.name},
      {"cluster", plan.cluster.name},
      {"gpus", plan.gpus},
      {"training", training_to_json(plan.training)},
      {"parallel", parallel_to_json(plan.parallel)},
      {"fits", e.fits},
      {"tight", e.tight},
      {"reasons", e.reasons},
      {"parameters", e.parameters},
      {"trainable_parameters", e.trainable_parameters},
      {"micro_batches_per_step", e.micro_batches},
      {"memory",
       {{"weights_bytes", m.weights.value()},
        {"gradients_bytes", m.gradients.value()},
        {"gradients_step_end_bytes", m.gradients_step_end.value()},
        {"autocast_copies_bytes", m.autocast_copies.value()},
        {"optimizer_bytes", m.optimizer.value()},
        {"activations_bytes", m.activations.value()},
        {"buffers_bytes", m.buffers.value()},
        {"overhead_bytes", m.overhead.value()},
        {"total_bytes", m.total.value()},
        {"reserved_bytes", m.reserved.value()},
        {"required_bytes", m.required.value()},
        {"capacity_bytes", m.capacity.value()},
        {"worst_stage", m.worst_stage},
        {"micro_batches_in_flight", m.micro_batches_in_flight},
        {"cpu_offload_per_node_bytes", m.cpu_offload_per_node.value()}, {"cpu_offload_per_gpu_bytes", m.cpu_offload_per_gpu.value()}}},
      {"time",
       {{"step_seconds", t.step.value()},
        {"compute_seconds", t.compute.value()},
        {"recompute_seconds", t.recompute.value()},
        {"tp_comm_seconds", t.tp_comm.value()},
        {"tp_copy_seconds", t.tp_copies.value()},
        {"autocast_cast_seconds", t.autocast_casts.value()},
        {"cp_comm_seconds", t.cp_comm.value()},
        {"ep_comm_seconds", t.ep_comm.value()},
        {"pp_comm_seconds", t.pp_comm.value()},
        {"dp_comm_exposed_seconds", t.dp_comm_exposed.value()},
        {"dp_comm_total_seconds", t.dp_comm_total.value()},
        {"dp_copy_seconds", t.dp_copies.value()},
        {"host_wait_seconds", t.host_wait.value()},
        {"sustained_clock_seconds", t.clock.value()},
        {"straggler_seconds", t.straggler.value()},
        {"sustained_step_seconds", t.sustained_step.value()},
        {"bubble_seconds", t.bubble.value()},
        {"optimizer_seconds", t.optimizer.value()},
        {"offload_seconds", t.offload.value()}}},
      {"communication", {{"cp_bytes_sent_per_step", e.communication.cp_sent.value()}, {"ep_bytes_sent_per_step", e.communication.ep_sent.value()}}},
      {"throughput",
       {{"tokens_per_second", th.tokens_per_second},
        {"tokens_per_second_per_gpu", th.tokens_per_second_per_gpu},
        {"model_tflops_per_gpu", th.model_tflops_per_gpu},
        {"hardware_tflops_per_gpu", th.hardware_tflops_per_gpu},
        {"mfu", th.mfu},
        {"hfu", th.hfu}}},
      {"run",
       {{"train_tokens", e.run.train_tokens},
        {"compute_seconds", e.run.compute_time.value()},
        {"checkpoint_bytes", e.run.checkpoint_bytes.value()},
        {"checkpoint_write_seconds", e.run.checkpoint_write_time.value()},
        {"checkpoint_interval_seconds", e.run.checkpoint_interval.value()},
        {"job_mtbf_seconds", e.run.job_mtbf.value()},
        {"goodput", e.run.goodput},
        {"wall_seconds", e.run.wall_time.value()},
        {"gpu_hours", e.run.gpu_hours},
        {"cost_usd", e.run.cost_usd}}},
      {"pipeline", pipeline},
  };
}

}  // namespace trainplan::costmodel
