// The training loop's records, its measurement document, the export of the trained weights and
// the out-of-memory report (trainer_parts.hpp).

#include "trainer_parts.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "checkpoint.hpp"
#include "cpu_memory.hpp"
#include "environment.hpp"
#include "gpu.hpp"
#include "hf_checkpoint.hpp"
#include "kernel_profile.hpp"
#include "out_of_memory.hpp"
#include "rank_output.hpp"
#include "trainplan/costmodel/compute.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/costmodel/schedule.hpp"
#include "trainplan/executor/capabilities.hpp"

namespace trainplan::executor::trainer_parts {

std::string gib(double bytes) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.2f GiB", bytes / 1073741824.0);
  return s;
}




SentBytes bytes_sent_so_far(const ProcessGroups& g) {
  return {g.bytes_sent.tp->load(), g.bytes_sent.cp->load(), g.bytes_sent.pp->load(), g.bytes_sent.dp->load(), g.bytes_sent.ep->load()};
}

MoeStep take_moe_step(Communicator& comm, MoeTally& tally, int experts) {
  const auto read = [](const at::Tensor& t) { return t.defined() ? t.item<double>() : 0.0; };
  std::vector<double> values = {tally.assignments, read(tally.dropped), static_cast<double>(tally.layer_passes), read(tally.aux_sum)};
  tally.kept_per_expert.resize(static_cast<std::size_t>(experts), 0.0);  // stages without MoE layers counted none
  values.insert(values.end(), tally.kept_per_expert.begin(), tally.kept_per_expert.end());
  at::Tensor sums = at::tensor(values, at::TensorOptions().dtype(at::kDouble)).to(comm.device());
  tally.reset();
  if (comm.size() > 1) comm.all_reduce_sum(sums)->wait();  // one collective for every sum
  sums = sums.cpu();
  const double* v = sums.data_ptr<double>();
  return {v[0], v[1], v[2] > 0 ? v[3] / v[2] : 0.0, std::vector<double>(v + 4, v + 4 + experts)};
}

// The measurement's `moe` object: tokens routed and dropped per step (every layer, micro-batch
// and rank; the last step and the run's total) and the mean load-balancing loss.
nlohmann::json moe_json(const cm::MoeSpec& moe, const std::vector<MoeStep>& steps) {
  nlohmann::json j = {{"experts", moe.experts}, {"top_k", moe.top_k}, {"capacity_factor", moe.capacity_factor},
                      {"aux_loss_coeff", moe.aux_loss_coeff}};
  if (steps.empty()) return j;
  double routed = 0, dropped = 0;
  nlohmann::json per_step = nlohmann::json::array();
  for (const MoeStep& s : steps) {
    routed += s.assignments;
    dropped += s.dropped;
    per_step.push_back(s.dropped);
  }
  j["assignments_per_step"] = steps.back().assignments;  // tokens x top_k x MoE layers, before capacity
  j["tokens_dropped_per_step"] = steps.back().dropped;
  j["tokens_dropped_per_step_each"] = per_step;
  j["dropped_fraction"] = routed > 0 ? dropped / routed : 0.0;
  j["aux_loss"] = steps.back().aux_loss;  // 1 when perfectly balanced
  // The last step's load: assignments each expert took, and the busiest over the mean (1 when
  // balanced). Under expert parallelism the rank holding the busiest experts receives, and sends
  // back, more rows than a balanced all-to-all (the cost model's).
  const std::vector<double>& load = steps.back().kept_per_expert;
  j["tokens_per_expert_per_step"] = load;
  double total = 0, most = 0;
  for (double n : load) {
    total += n;
    most = std::max(most, n);
  }
  j["load_imbalance"] = total > 0 ? most * static_cast<double>(load.size()) / total : 1.0;
  return j;
}

// The pipeline bubble of one step (collective): per rank, the time within the step's compute
// span (first pass start to last pass end over all ranks) it does not compute, over the time it
// computes (costmodel/schedule.hpp); the mean over ranks.
double step_bubble(Communicator& comm, const std::vector<TraceRecord>& events) {
  double busy = 0, first = 1e300, last = 0;
  for (const TraceRecord& e : events) {
    if (e.kind != "forward" && e.kind != "backward") continue;
    busy += e.end - e.start;
    first = std::min(first, e.start);
    last = std::max(last, e.end);
  }
  std::ostringstream mine;
  mine.precision(17);
  mine << busy << " " << first << " " << last;
  double span_first = 1e300, span_last = 0;
  std::vector<double> ranks_busy;
  for (const std::string& text : comm.all_gather_strings(mine.str())) {
    std::istringstream in(text);
    double b = 0, f = 0, l = 0;
    in >> b >> f >> l;
    span_first = std::min(span_first, f);
    span_last = std::max(span_last, l);
    ranks_busy.push_back(b);
  }
  double bubble = 0;
  for (double b : ranks_busy) bubble += b > 0 ? (span_last - span_first - b) / b : 0.0;
  return bubble / static_cast<double>(ranks_busy.size());
}


nlohmann::json measurement_json(const cm::Plan& plan, const World& w, const RankMemory& fullest,
                                const std::vector<StepRecord>& steps, const std::vector<double>& losses,
                                const std::string& command_line, const std::string& data, const nlohmann::json& trace,
                                const std::string& kernels, const nlohmann::json& communication) {
  const cm::Estimate estimate = cm::estimate(plan);
  const StateBytes states = fullest.states;
  std::vector<double> seconds, forward, backward, optimizer, dp_wait;
  // The first step of a run pays one-time costs (allocator growth, kernel selection).
  for (std::size_t i = steps.size() > 2 ? 1 : 0; i < steps.size(); ++i) {
    if (steps[i].skipped) continue;
    seconds.push_back(steps[i].seconds);
    forward.push_back(steps[i].forward_seconds);
    backward.push_back(steps[i].backward_seconds);
    optimizer.push_back(steps[i].optimizer_seconds);
    dp_wait.push_back(steps[i].dp_wait_seconds);
  }
  const double step_seconds = median(seconds);
  const double tokens = static_cast<double>(plan.training.global_batch) * static_cast<double>(plan.training.seq_len);
  const double world = w.comm->size();
  const double tokens_per_second = step_seconds > 0 ? tokens / step_seconds : 0;
  // The estimate's convention (LoRA's frozen weights take no weight gradient), so MFUs compare.
  const double flops_per_token = estimate.throughput.model_flops_per_token;
  const double model_tflops = tokens_per_second * flops_per_token / world / 1e12;

  nlohmann::json memory = {{"weights_bytes", states.weights}, {"gradients_bytes", states.gradients}, {"optimizer_bytes", states.optimizer}};
  if (plan.parallel.offload_optimizer != cm::Offload::kNone) memory["cpu_offload_per_gpu_bytes"] = states.host;  // this rank's host memory (the estimate's key)
  nlohmann::json throughput = {{"tokens_per_second", tokens_per_second},
                               {"tokens_per_second_per_gpu", tokens_per_second / world},
                               {"model_tflops_per_gpu", model_tflops}};
  if (w.device.is_cuda() || fullest.peak_bytes > 0) {
    // The allocator's peak: CUDA's, or on CPU ranks the counted one (cpu_memory.hpp).
    // On CPU ranks the counted allocator holds the offloaded host state too.
    const double host = w.device.is_cuda() ? 0.0 : states.host;
    memory["activations_bytes"] = std::max(0.0, fullest.peak_bytes - states.weights - states.gradients - states.optimizer - host);
    memory["peak_allocated_bytes"] = fullest.peak_bytes;
  }
  if (w.device.is_cuda()) {  // not on CPU ranks: the estimate's total holds GPU communication buffers
    // total_bytes and reserved_bytes are the estimate's names for the allocator's two peaks, kept
    // so that planner compare sets them side by side.
    memory["total_bytes"] = fullest.peak_bytes;
    memory["reserved_bytes"] = fullest.reserved_bytes;
    memory["peak_reserved_bytes"] = fullest.reserved_bytes;
    const double peak_flops = plan.cluster.gpu.peak_for(cm::compute_dtype(plan.training.precision)).value();
    if (peak_flops > 0) throughput["mfu"] = model_tflops * 1e12 / peak_flops;
  }
  // What ran is this executor's own stack, whatever stack the plan was estimated for: its fused
  // paths (trainplan) or, with --kernels reference, its plain path (trainplan-reference).
  nlohmann::json training = cm::training_to_json(plan.training);
  training["stack"] = cm::stack_name(kernels == "reference" ? cm::Stack::kTrainplanReference : cm::Stack::kTrainplan);
  // A model or cluster that is no preset (inline in the plan, or a file) travels as a document,
  // so that the plan can be rebuilt from the measurement (planner validate, calibrate).
  const auto is_preset = [](const std::string& ref) {
    return !ref.empty() && ref != "inline" && ref.find('/') == std::string::npos && ref.find(".json") == std::string::npos;
  };
  nlohmann::json step_list = nlohmann::json::array();
  for (const auto& s : steps) {
    nlohmann::json j = {{"step", s.step}, {"loss", s.loss}, {"seconds", s.seconds}, {"tokens_per_second", s.tokens_per_second},
                        {"grad_norm", s.grad_norm}, {"lr", s.lr}, {"skipped", s.skipped},
                        {"forward_seconds", s.forward_seconds}, {"backward_seconds", s.backward_seconds},
                        {"optimizer_seconds", s.optimizer_seconds}, {"dp_comm_exposed_seconds", s.dp_wait_seconds}};
    if (w.device.is_cuda()) {
      j["peak_memory_bytes"] = s.peak_memory_bytes;
      j["mfu"] = s.mfu;
    }
    step_list.push_back(j);
  }
  nlohmann::json document = {
      {"schema", "trainplan/measurement/v1"},
      {"status", "ok"},
      {"name", plan.name},
      {"source", "trainplan executor: " + command_line},
      {"model", plan.model.name},
      {"cluster", plan.cluster.name},
      {"gpus", plan.gpus},
      {"world_size", w.comm->size()},
      {"device", w.device_name},
      {"environment", environment_json(w.device.is_cuda())},
      {"data", data},
      {"training", training},
      {"parallel", cm::parallel_to_json(plan.parallel)},
      {"parameters", estimate.parameters},
      {"trainable_parameters", estimate.trainable_parameters},
      {"micro_batches_per_step", plan.training.global_batch / (plan.parallel.dp * plan.parallel.micro_batch)},
      {"memory", memory},
      // Medians over steps of this rank's phase times; forward + backward + optimizer + exposed
      // data-parallel wait <= step (the rest: pipeline receives, loss reduction, host work).
      {"time", {{"step_seconds", step_seconds}, {"forward_seconds", median(forward)}, {"backward_seconds", median(backward)},
                {"optimizer_seconds", median(optimizer)}, {"dp_comm_exposed_seconds", median(dp_wait)}}},
      {"throughput", throughput},
      {"steps", step_list},
      {"losses", losses},
      {"trace", trace},
  };
  if (!communication.is_null()) document["communication"] = communication;
  document["environment"]["kernels"] = kernels;  // --kernels: fused or reference paths
  document["environment"]["cuda_kernels"] = have_cuda_kernels() && w.device.is_cuda();  // fused paths' own kernels ran
  if (!is_preset(plan.model_ref)) document["model_document"] = cm::model_to_json(plan.model);
  if (!is_preset(plan.cluster_ref)) document["cluster_document"] = cm::hwprofile_to_json(plan.cluster);
  return document;
}

// Writes `j` to `path` through a temporary file. `overwrite` false: an existing `path` is kept
// (link(2) refuses to replace it) and false is returned.
bool write_json_atomically(const std::string& path, const nlohmann::json& j, bool overwrite) {
  const std::string tmp = path + ".tmp" + (overwrite ? std::string() : "." + std::to_string(::getpid()));
  {
    std::ofstream out(tmp);
    if (!out) throw std::runtime_error(path + ": cannot write the measurement");
    out << j.dump(2) << "\n";
    if (!out) throw std::runtime_error(path + ": write failed");
  }
  if (!overwrite) {
    const bool linked = ::link(tmp.c_str(), path.c_str()) == 0;
    std::remove(tmp.c_str());
    return linked;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error(path + ": cannot rename " + tmp);
  return true;
}

void export_trained(const RunOptions& o, const cm::Plan& plan, const ModelSharding& sharding, const RankCoords& at,
                    const ParallelDims& dims, const std::vector<int>& chunk_layers, bool lora, DataParallelEngine& engine,
                    Communicator& comm, int64_t step, bool talk) {
  const auto& p = plan.parallel;
  // Piece j of a parameter comes from the first data-parallel replica's TP rank holding it, on
  // the stage that holds its unit; an expert's from the first replica of the ep rank holding it.
  std::vector<std::vector<UnitLayout>> tp_layouts;
  for (int r = 0; r < p.tp; ++r) {
    ModelSharding other = sharding;
    other.tp_rank = r;
    other.ep = 1;  // every expert's slot (ep cuts none of them)
    other.ep_rank = 0;
    tp_layouts.push_back(model_layout(plan.model, other));
  }
  const auto find_slot = [&](int tp_rank, const std::string& unit, const std::string& slot) -> const ParamSlot& {
    for (const UnitLayout& u : tp_layouts[static_cast<std::size_t>(tp_rank)]) {
      if (u.name != unit) continue;
      for (const ParamSlot& s : u.slots) {
        if (s.name == slot) return s;
      }
    }
    throw std::logic_error("export: no parameter " + slot);
  };
  const auto holder = [&](const std::string& unit, const std::string& slot, int piece) {
    for (int r = 0; r < p.tp; ++r) {
      const ParamSlot& s = find_slot(r, unit, slot);
      if (s.primary && s.shard_index == piece) return r;
    }
    throw std::logic_error("export: no TP rank holds piece " + std::to_string(piece) + " of " + slot);
  };
  ExportPlan export_plan;
  export_plan.sends = [&](const UnitLayout& unit) { return at.cp == 0 && (unit.kind == UnitKind::kExperts ? at.dp < p.ep : at.dp == 0); };
  export_plan.piece_slot = [&](const std::string& unit, const std::string& slot, int piece) -> const ParamSlot& {
    return find_slot(holder(unit, slot, piece), unit, slot);
  };
  export_plan.owner_rank = [&](const std::string& unit, const std::string& slot, int piece) {
    const int tp_rank = holder(unit, slot, piece);
    const int expert = find_slot(tp_rank, unit, slot).expert;
    const int dp_index = expert < 0 ? 0 : expert / (plan.model.moe->experts / p.ep);  // ep rank = dp index % ep
    return rank_of(dims, RankCoords{tp_rank, 0, stage_of_unit(unit, chunk_layers, p.pp), dp_index});
  };
  ExportOptions export_options;
  export_options.hugging_face = o.export_format == "hf";
  export_options.merged = o.export_lora != "adapters";
  export_options.adapters = lora && o.export_lora != "merged";
  export_options.base_model = o.init_from.empty() ? plan.model.name : fs::absolute(o.init_from).string();
  export_safetensors(o.export_dir, engine, comm, step, export_plan, export_options);
  if (talk) {
    std::cout << "exported: " << o.export_dir << " (" << (export_options.hugging_face ? "Hugging Face Llama layout" : "executor names");
    if (lora) std::cout << "; " << (export_options.merged && export_options.adapters ? "merged weights and adapters" : export_options.merged ? "merged weights" : "adapters");
    std::cout << ")\n";
  }
}

void report_out_of_memory(const std::string& message, const PhaseTimer& phases, int rank, const World& w, const cm::Plan& plan,
                          const RunOptions& o, DataParallelEngine& engine, const std::vector<StepRecord>& records,
                          const std::vector<double>& losses, const std::string& command_line, const std::string& data) {
OutOfMemory oom;
oom.phase = phase_name(phases.current_phase());
oom.micro_batch = phases.current_micro_batch();
oom.step = phases.step();
oom.rank = rank;
oom.requested_bytes = requested_bytes(message);
oom.message = message;
if (w.device.is_cuda()) {
  // Peaks since the failed step began: the figures at the failure (unwinding freed the rest).
  oom.allocated_bytes = cuda_peak_allocated_bytes();
  oom.reserved_bytes = cuda_peak_reserved_bytes();
} else {
  oom.process_peak_resident_bytes = process_peak_resident_bytes();
}
std::optional<NextPlan> next = next_plan_after_out_of_memory(plan);
if (next && !o.measurement_path.empty()) {
  // The whole next plan beside the measurement, so that nothing of this plan is lost in a
  // command line (inline models, schedules, stacks); rank 0's replaces another rank's.
  const std::string path = next_plan_path(o.measurement_path);
  try {
    write_json_atomically(path, cm::plan_to_json(next->plan, /*inline_documents=*/true), /*overwrite=*/rank == 0);
    next->plan_path = path;
  } catch (const std::exception&) {
    // Not written: the line gives the planner command instead.
  }
}
print_for_rank(rank, out_of_memory_line(oom, next));
if (!o.measurement_path.empty()) {
  RankMemory mine_memory{engine.state_bytes(), oom.allocated_bytes.value_or(0), oom.reserved_bytes.value_or(0)};
  nlohmann::json m = measurement_json(plan, w, mine_memory, records, losses, command_line, data, nullptr, o.kernels, nullptr);
  m["status"] = "out_of_memory";
  m["out_of_memory"] = out_of_memory_json(oom, next);
  if (w.device.is_cuda()) {
    // The failed step's peaks; the completed steps' are in `steps`.
    m["memory"]["peak_allocated_bytes"] = oom.allocated_bytes.value_or(0);
    m["memory"]["peak_reserved_bytes"] = oom.reserved_bytes.value_or(0);
    for (const char* key : {"total_bytes", "reserved_bytes", "activations_bytes"}) m["memory"].erase(key);
  }
  if (records.empty()) {  // nothing was timed
    m.erase("time");
    m.erase("throughput");
  }
  // Rank 0's document replaces another rank's; another rank's is written only where none is.
  write_json_atomically(o.measurement_path, m, /*overwrite=*/rank == 0);
}
}

}  // namespace trainplan::executor::trainer_parts
