// The training loop: plan -> ranks -> engine -> steps -> checkpoints -> measurement document.

#include <unistd.h>

#include <array>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "checkpoint.hpp"
#include "cpu_memory.hpp"
#include "comm.hpp"
#include "data.hpp"
#include "engine.hpp"
#include "environment.hpp"
#include "gpu.hpp"
#include "hf_checkpoint.hpp"
#include "kernel_profile.hpp"
#include "out_of_memory.hpp"
#include "parallel_dims.hpp"
#include "phase_timer.hpp"
#include "pipeline.hpp"
#include "rank_output.hpp"
#include "world.hpp"
#include "trainplan/costmodel/schedule.hpp"
#include "trainplan/costmodel/compute.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/executor/executor.hpp"
#include "trainplan/executor/capabilities.hpp"
#include "trainer_parts.hpp"

namespace trainplan::executor {

namespace cm = trainplan::costmodel;
namespace fs = std::filesystem;

namespace {

using namespace trainer_parts;

constexpr int kExitBadInput = 2;
constexpr int kExitRunFailed = 3;
// train()'s code for a run that diverged on every rank at once: exit 3, no abort needed.
constexpr int kDivergedEverywhere = 103;

int train(const RunOptions& o, const std::string& command_line, World& w, const cm::Plan& plan) {
  Communicator& comm = *w.comm;
  const int rank = comm.rank();
  const bool talk = rank == 0;
  const ParallelDims dims{plan.parallel.tp, plan.parallel.cp, plan.parallel.pp, plan.parallel.dp, plan.parallel.ep};
  if (const std::string why = dims.mismatch(comm.size()); !why.empty()) {
    throw InputError(o.plan_path + ": the plan is for " + std::to_string(plan.gpus) + " GPUs but " + std::to_string(comm.size()) +
                     " ranks were started: " + why);
  }
  if (!o.kernel_profile.empty() && !w.device.is_cuda()) {
    throw InputError("--kernel-profile " + o.kernel_profile + ": records GPU kernels, and this run is on the CPU (--device cuda)");
  }
  if (o.fail_at_step > 0 && o.fail_rank >= comm.size()) {
    throw InputError("--fail-rank: must be one of the " + std::to_string(comm.size()) + " ranks, 0 to " + std::to_string(comm.size() - 1) +
                     " (got " + std::to_string(o.fail_rank) + ")");
  }
  if (!w.device.is_cuda()) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    at::set_num_threads(o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, cores / static_cast<unsigned>(std::max(1, w.local_size)))));
  }

  const auto& p = plan.parallel;
  const auto& t = plan.training;
  const int64_t accumulation = t.global_batch / (static_cast<int64_t>(p.dp) * p.micro_batch);

  // A measurement at this path describes this run: an older one goes now, before the first
  // collective, so that a rank that fails later (out of memory) never finds a stale one in place.
  if (talk && !o.measurement_path.empty()) {
    std::remove(o.measurement_path.c_str());
    std::remove(next_plan_path(o.measurement_path).c_str());
  }

  // Parallelisms in torchtitan's order: process groups, TP pieces of every unit, this stage's
  // chunks (cost-balanced by the cost model), then data parallelism (ZeRO) over what is left.
  ProcessGroups groups = make_process_groups(dims, comm);
  const RankCoords& at = groups.coords;
  std::unique_ptr<Communicator> kv_group;
  if (p.tp > plan.model.kv_heads) kv_group = groups.tp->split(at.tp / (p.tp / plan.model.kv_heads), at.tp, "kv");
  const cm::Estimate estimate = cm::estimate(plan);
  const std::vector<int> chunk_layers = estimate.pipeline.chunk_layers;
  ModelSharding sharding;
  sharding.tp = p.tp;
  sharding.tp_rank = at.tp;
  sharding.sequence_parallel = p.sequence_parallel && p.tp > 1;
  sharding.split_tied_embedding = plan.model.tied_embeddings && p.pp > 1;
  sharding.ep = p.ep;
  sharding.ep_rank = at.dp % p.ep;
  const bool lora = t.mode == cm::TrainingMode::kLora || t.mode == cm::TrainingMode::kQlora;
  if (lora) sharding.lora = LoraSpec{t.lora.rank, t.lora.scale(), t.lora.targets};
  if (o.export_format == "hf" && !o.export_dir.empty() && plan.model.architecture != cm::Architecture::kLlama) {
    throw InputError("--export-format hf: writes the Llama layout, and " + plan.model.name + " is a GPT-style model");
  }
  // A Hugging Face checkpoint to start from: its architecture must be the plan's.
  std::unique_ptr<HfCheckpoint> base;
  if (!o.init_from.empty()) {
    base = std::make_unique<HfCheckpoint>(o.init_from);
    if (const std::string why = base->mismatch(plan.model); !why.empty()) {
      throw InputError("--init-from " + o.init_from + ": the checkpoint is not the plan's model " + plan.model.name + ": " + why);
    }
    if (const std::string extra = base->unused_tensor(plan.model); !extra.empty()) {
      throw ImportError("--init-from " + o.init_from + ": tensor " + extra + " has no place in the executor's model " + plan.model.name +
                        " (a layer its Llama block lacks)");
    }
  }
  StageUnits mine = stage_units(model_layout(plan.model, sharding), chunk_layers, p.pp, at.pp);
  // Context parallelism: this rank's load-balanced chunks of every sequence (context_parallel.hpp).
  const ContextParallel context = make_context_parallel(groups.cp.get(), t.seq_len, w.device, torch_dtype(t.precision));
  EngineGroups engine_groups{groups.dp.get(), &comm, groups.tied.get(), kv_group.get(), TensorParallel{groups.tp.get(), sharding.sequence_parallel},
                             context, groups.ep.get(), groups.edp.get()};

  EngineConfig config;
  config.zero_stage = p.zero_stage;
  config.shard_group = p.shard_group * p.cp;  // the engine's data-parallel group spans dp x cp (parallel_dims.hpp)
  config.prefetch = p.prefetch;
  config.overlap_grad_reduce = p.overlap_grad_reduce;
  config.recompute = p.recompute;
  config.recompute_layers = p.recompute_layers;
  config.compute_dtype = torch_dtype(t.precision);
  config.fp8 = t.precision == cm::Precision::kFp8;
  config.kernels = parse_kernels(o.kernels);
  config.device = w.device;
  config.seed = o.seed;
  config.draw_base_weights = o.init_from.empty();
  config.lora = sharding.lora;
  config.hidden_dropout = t.dropout ? t.dropout_rate : 0.0;
  config.offload_optimizer = p.offload_optimizer == cm::Offload::kCpu;
  if (t.mode == cm::TrainingMode::kQlora) config.quantized_base = t.lora.base_format;
  config.lora_dropout = config.lora.active() ? t.lora.dropout : 0.0;
  if (p.tp > 1 || p.pp > 1) {
    char prefix[32];
    std::snprintf(prefix, sizeof(prefix), "pp%02d_tp%02d_", at.pp, at.tp);
    config.shard_prefix = prefix;
  }
  // Building the model draws every unit's initial weights on the host (model.hpp init_unit): a
  // line before and after, since for billions of parameters it takes a while.
  const auto t_build = std::chrono::steady_clock::now();
  if (talk && !o.quiet) {
    std::cout << "executor: building the model (" << parameter_count_text(cm::count_parameters(plan.model).total(plan.model.layers))
              << " parameters): "
              << (config.draw_base_weights ? "drawing the initial weights on " + std::to_string(at::get_num_threads()) + " host thread(s)"
                                           : "the weights come from " + o.init_from)
              << std::endl;
  }
  DataParallelEngine engine(plan.model, config, engine_groups, std::move(mine.units), mine.chunk_of_unit, t.seq_len);
  if (talk && !o.quiet) {
    std::cout << "executor: model built in " << std::fixed << std::setprecision(1)
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t_build).count() << " s" << std::defaultfloat << std::endl;
  }
  PhaseTimer phases(w.device);
  if (const auto injection = parse_injection(o.inject_oom); injection && (o.inject_oom_rank < 0 || o.inject_oom_rank == rank)) {
    phases.set_injection(*injection);
  }
  engine.set_phase_timer(&phases);

  PipelineConfig pipeline;
  pipeline.stages = p.pp;
  pipeline.stage = at.pp;
  pipeline.virtual_stages = p.virtual_stages;
  pipeline.micro_batches = static_cast<int>(accumulation);
  pipeline.schedule = p.schedule;
  const int64_t local_seq = t.seq_len / p.cp;  // this rank's tokens of each sequence
  pipeline.activation_shape = {p.micro_batch, sharding.sequence_parallel ? local_seq / p.tp : local_seq, plan.model.hidden};
  pipeline.activation_dtype = config.compute_dtype;
  pipeline.device = w.device;
  // The stages' one-directional links (collective over the pipeline group; none without one).
  std::unique_ptr<PipelineLinks> links;
  if (p.pp > 1) links = std::make_unique<PipelineLinks>(*groups.pp, /*wrap=*/p.virtual_stages > 1);
  PipelineRunner runner(pipeline, engine, links.get());

  DataSpec data_spec;
  data_spec.source = o.data;
  data_spec.seed = o.seed;
  data_spec.vocab = o.vocab;
  data_spec.token_bytes = o.data_dtype == "uint32" ? 4 : o.data_dtype == "uint16" ? 2 : 0;
  if (data_spec.token_bytes == 0) throw InputError("--data-dtype: expected uint16 or uint32, got \"" + o.data_dtype + "\"");
  DataLoader loader(data_spec, plan.model.vocab, t.seq_len);

  const std::string precision = cm::precision_name(t.precision);
  nlohmann::json parallel_layout = {{"tp", p.tp}, {"pp", p.pp}, {"dp", p.dp}, {"sequence_parallel", sharding.sequence_parallel},
                                    {"virtual_stages", p.virtual_stages}, {"chunk_layers", chunk_layers}};
  if (p.cp > 1) parallel_layout["cp"] = p.cp;  // only then: checkpoints written before CP existed still resume
  if (p.ep > 1) parallel_layout["ep"] = p.ep;
  if (config.lora.active()) {  // a LoRA checkpoint holds the adapters: the base must be the same
    parallel_layout["lora"] = {{"rank", t.lora.rank}, {"alpha", t.lora.alpha}, {"targets", t.lora.targets},
                               {"base", o.init_from.empty() ? "initialised, seed " + std::to_string(o.seed) : fs::absolute(o.init_from).string()}};
  }
  if (base) {
    import_hf_weights(*base, engine);
    if (talk) std::cout << "imported: " << o.init_from << " (Hugging Face " << base->model().name << ")" << std::endl;
  }
  const nlohmann::json layout = checkpoint_layout(engine, comm.size(), precision, parallel_layout);
  TrainerState state;
  state.loss_scale = t.precision == cm::Precision::kFp16 ? 65536.0 : 1.0;
  std::string last_checkpoint;  // the newest checkpoint this run wrote or resumed from
  if (!o.resume.empty()) {
    const Resumed resumed = resume_newest_intact(o.resume, engine, comm, layout);
    state = resumed.state;
    last_checkpoint = resumed.step_dir;
    if (talk) {
      for (const std::string& why : resumed.skipped) {
        print_for_rank(rank, "executor: warning: --resume: skipping a damaged checkpoint, " + why);
      }
      std::cout << "resumed from " << resumed.step_dir << " at step " << state.step;
      if (!resumed.skipped.empty()) {
        std::cout << " (fell back to the newest intact checkpoint: " << resumed.skipped.size() << " newer one" << (resumed.skipped.size() == 1 ? " is" : "s are")
                  << " damaged, see above)";
      }
      std::cout << std::endl;
    }
    if (state.step >= o.steps) {
      throw InputError("--resume " + o.resume + ": the checkpoint is at step " + std::to_string(state.step) + ", --steps " +
                       std::to_string(o.steps) + " leaves nothing to run (--steps counts resumed steps too; give more)");
    }
  }

  if (talk) {
    const StateBytes sb = engine.state_bytes();
    std::string stages;
    for (int n : chunk_layers) stages += (stages.empty() ? "" : "/") + std::to_string(n);
    std::cout << "executor: " << plan.name << " | " << plan.model.name << " | " << comm.size() << " rank(s) on " << w.device_name
              << " | tp " << p.tp << (sharding.sequence_parallel ? " (sequence parallel)" : "");
    if (p.cp > 1) std::cout << ", cp " << p.cp << " (all-gathered K/V, " << 2 * p.cp << " load-balanced chunks)";
    std::cout << ", pp " << p.pp;
    if (p.pp > 1) {
      std::cout << " (" << cm::schedule_name(p.schedule) << (p.virtual_stages > 1 ? ", " + std::to_string(p.virtual_stages) + " chunks/stage" : "")
                << ", layers per chunk " << stages << ")";
    }
    std::cout << ", dp " << p.dp << ", ZeRO-" << p.zero_stage
              << (p.zero_stage == 3 && p.shard_group > 0 && p.shard_group < p.dp ? " hybrid (shard " + std::to_string(p.shard_group) + ")" : "")
              << ", micro-batch " << p.micro_batch << " x " << accumulation << " accumulation, recompute "
              << cm::recompute_name(p.recompute) << ", " << precision << "\n"
              << "data: " << loader.describe() << " | global batch " << t.global_batch << " x " << t.seq_len << " tokens\n"
              << "model states on rank 0: weights " << gib(sb.weights) << ", gradients " << gib(sb.gradients) << ", optimizer "
              << gib(sb.optimizer) << (sb.host > 0 ? ", offloaded to host memory " + gib(sb.host) : std::string()) << "\n";
  }

  const AdamWSettings adamw{0.9, 0.95, 1e-8, o.weight_decay};
  const double flops_per_token = estimate.throughput.model_flops_per_token;  // as the measurement's
  const double peak_flops = plan.cluster.gpu.peak_for(cm::compute_dtype(t.precision)).value();
  std::vector<StepRecord> records;
  int64_t run_steps = 0;
  // The step whose loss or gradient norm was not finite, if any, which, and its value.
  int64_t diverged_at = 0;
  std::string diverged_what, diverged_value;
  const int64_t trace_step = o.trace_step > 0 ? o.trace_step : o.steps;
  nlohmann::json trace_events = nlohmann::json::array();
  std::vector<double> stage_in_flight(static_cast<std::size_t>(p.pp), 0.0);
  std::vector<double> step_bubbles;  // measured pipeline bubble of each step of this run
  std::vector<MoeStep> moe_steps;     // what the experts did in each step of this run
  try {
    while (state.step < o.steps) {
      const int64_t step = state.step + 1;
      if (o.fail_at_step == step && o.fail_rank == rank) {
        print_for_rank(rank, "executor: --fail-at-step " + std::to_string(step) + ": killing this rank (fault injection)");
        std::raise(SIGKILL);
      }
      if (w.device.is_cuda()) cuda_reset_peak();
      else cpu_reset_peak();
      const bool tracing = step == trace_step;
      std::unique_ptr<KernelProfiler> kernel_profiler;
      if (tracing && talk && !o.kernel_profile.empty()) {
        kernel_profiler = std::make_unique<KernelProfiler>();
        kernel_profiler->start();
      }
      const bool timing_pipeline = p.pp > 1 || tracing;  // the bubble is measured every step of a pipeline
      std::vector<TraceRecord> events;
      if (timing_pipeline) comm.barrier();  // every rank's step starts together: one clock for the timeline
      const auto t0 = std::chrono::steady_clock::now();
      phases.begin_step(step);
      const SentBytes sent_before = bytes_sent_so_far(groups);
      const auto batch = [&](int k) {
        MicroBatch mb = loader.micro_batch(step, at.dp, p.dp, t.global_batch, p.micro_batch, k, w.device);
        return std::make_pair(context_slice(context, mb.tokens), context_slice(context, mb.targets));
      };
      engine.set_step_samples((step - 1) * t.global_batch + at.dp * (t.global_batch / p.dp), p.micro_batch);  // dropout.hpp
      if (loader.masked()) {  // the loss over the global batch's response tokens (data.hpp)
        engine.set_loss_denominator(static_cast<double>(loader.step_targets(step, t.global_batch)) / static_cast<double>(p.dp * p.cp * accumulation));
      }
      const double loss_sum = runner.run_step(batch, state.loss_scale / static_cast<double>(accumulation), timing_pipeline ? &events : nullptr);
      if (p.pp > 1) step_bubbles.push_back(step_bubble(comm, events));
      if (plan.model.moe) moe_steps.push_back(take_moe_step(comm, engine.moe_tally(), plan.model.moe->experts));
      const auto t_finish = std::chrono::steady_clock::now();
      engine.finish_step();
      if (tracing) events.push_back({"dp_comm", -1, 0, std::chrono::duration<double>(t_finish - t0).count(),
                                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
      StepRecord r;
      r.step = step;
      // The loss lives on the last stage, the same on every TP rank there.
      // Under CP each rank's loss is the mean over its own tokens (equal counts): their mean is the sequence's.
      r.loss = all_reduce_scalar(comm, at.tp == 0 ? loss_sum : 0.0) / static_cast<double>(accumulation * p.dp * p.cp);
      r.lr = lr_at(o, step);
      const auto t_opt = std::chrono::steady_clock::now();
      bool finite = true;
      {
        // From the completed gradient reduction to the end of the update: norm, clipping, AdamW.
        PhaseScope optimizer(&phases, Phase::kOptimizer);
        finite = t.precision != cm::Precision::kFp16 || engine.gradients_finite();
        if (finite) {
          r.grad_norm = engine.gradient_norm() / state.loss_scale;
          // Not fp16 (its gradients were checked): a norm that is not finite would make every
          // weight NaN, so the update is not applied and the run ends below.
          if (std::isfinite(r.grad_norm)) {
            const double clip = o.clip_grad > 0 && r.grad_norm > o.clip_grad ? o.clip_grad / (r.grad_norm + 1e-6) : 1.0;
            engine.optimizer_step(adamw, r.lr, clip / state.loss_scale, step);
          } else {
            r.skipped = true;
          }
        } else {
          r.skipped = true;
          state.loss_scale /= 2;
          state.good_steps = 0;
        }
        engine.zero_gradients();
      }
      phases.end_step();
      const SentBytes sent_after = bytes_sent_so_far(groups);
      if (w.device.is_cuda()) cuda_synchronize();
      const auto t1 = std::chrono::steady_clock::now();
      if (kernel_profiler) {
        const std::vector<KernelTime> kernels = kernel_profiler->stop();
        std::ofstream out(o.kernel_profile);
        out << kernel_table_csv(kernels, std::chrono::duration<double>(t1 - t0).count());
        if (!out) throw std::runtime_error(o.kernel_profile + ": cannot write the kernel profile");
        double busy = 0, idle = 0;
        for (const KernelTime& k : kernels) {
          busy += k.seconds;
          idle += k.idle_before_seconds;
        }
        std::cout << "kernel profile of step " << step << ": " << kernels.size() << " kernels, busy " << std::fixed << std::setprecision(1)
                  << busy * 1e3 << " ms, idle between them " << idle * 1e3 << " ms, written to " << o.kernel_profile << std::defaultfloat
                  << std::endl;
      }
      const PhaseSeconds phase_seconds = phases.collect();
      if (finite && t.precision == cm::Precision::kFp16 && ++state.good_steps % 2000 == 0) state.loss_scale *= 2;
      r.seconds = std::chrono::duration<double>(t1 - t0).count();
      for (std::size_t g = 0; g < r.bytes_sent.size(); ++g) r.bytes_sent[g] = sent_after[g] - sent_before[g];
      r.forward_seconds = phase_seconds[Phase::kForward];
      r.backward_seconds = phase_seconds[Phase::kBackward];
      r.optimizer_seconds = phase_seconds[Phase::kOptimizer];
      // Exposed data-parallel communication as the cost model counts it: gradient reductions (their
      // starts and the wait for them) plus, under ZeRO-3, parameter gathers (engine.hpp).
      r.dp_wait_seconds = phase_seconds[Phase::kDataParallelWait];
      if (tracing) {
        events.push_back({"optimizer", -1, 0, std::chrono::duration<double>(t_opt - t0).count(), r.seconds});
        nlohmann::json mine_json = {{"rank", rank}, {"stage", at.pp}, {"in_flight", runner.peak_in_flight()}, {"events", nlohmann::json::array()}};
        for (const TraceRecord& e : events) {
          mine_json["events"].push_back({{"kind", e.kind}, {"micro_batch", e.micro_batch}, {"chunk", e.chunk}, {"start", e.start}, {"end", e.end}});
        }
        const std::vector<std::string> all = comm.all_gather_strings(mine_json.dump());
        if (talk) {
          trace_events = nlohmann::json::array();
          std::fill(stage_in_flight.begin(), stage_in_flight.end(), 0.0);
          for (const std::string& text : all) {
            const nlohmann::json one = nlohmann::json::parse(text);
            const int stage = one["stage"].get<int>();
            stage_in_flight[static_cast<std::size_t>(stage)] = std::max(stage_in_flight[static_cast<std::size_t>(stage)], one["in_flight"].get<double>());
            for (const auto& e : one["events"]) {
              nlohmann::json event = e;
              event["rank"] = one["rank"];
              event["stage"] = stage;
              if (event["micro_batch"].get<int>() < 0) event.erase("micro_batch");
              trace_events.push_back(event);
            }
          }
        }
      }
      r.tokens_per_second = static_cast<double>(t.global_batch * t.seq_len) / r.seconds;
      r.peak_memory_bytes = w.device.is_cuda() ? cuda_peak_allocated_bytes() : cpu_peak_allocated_bytes();
      if (w.device.is_cuda()) {
        r.mfu = peak_flops > 0 ? r.tokens_per_second * flops_per_token / comm.size() / peak_flops : 0;
      }
      state.step = step;
      state.losses.push_back(r.loss);
      records.push_back(r);
      ++run_steps;
      if (talk && !o.quiet) {
        char line[256];
        std::snprintf(line, sizeof(line), "step %5lld/%lld | loss %9.5f | grad norm %8.4f | lr %.3e | %12.0f tok/s | %8.3f s",
                      static_cast<long long>(step), static_cast<long long>(o.steps), r.loss, r.grad_norm, r.lr, r.tokens_per_second, r.seconds);
        std::cout << line;
        if (w.device.is_cuda()) std::cout << " | MFU " << std::fixed << std::setprecision(1) << 100 * r.mfu << "% | peak " << gib(r.peak_memory_bytes);
        if (r.skipped) std::cout << " | skipped (inf/nan gradients, loss scale now " << state.loss_scale << ")";
        std::cout << std::endl;
      }
      // Training diverged, and the run ends here: nothing after it would train, and neither a
      // checkpoint nor the export of such weights replaces a good one. A loss that is not finite
      // (the forward overflowed, which no loss scale mends); a gradient norm that is not finite
      // (bf16, fp32: its update was not applied); in fp16, gradients that overflow at a loss scale
      // already below 1. The loss, the norm and the fp16 check are all-reduced: every rank stops
      // at the same step.
      const bool fp16_gave_up = t.precision == cm::Precision::kFp16 && r.skipped && state.loss_scale < 1.0;
      if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm) || fp16_gave_up) {
        const bool loss = !std::isfinite(r.loss);
        const double value = loss ? r.loss : r.grad_norm;
        diverged_at = step;
        diverged_what = loss ? "loss" : "gradient norm";
        diverged_value = !loss && fp16_gave_up ? "not_finite" : std::isnan(value) ? "nan" : "inf";
        break;
      }
      const bool stopping = o.stop_after > 0 && run_steps >= o.stop_after;
      const bool due = !o.checkpoint_dir.empty() &&
                       ((o.checkpoint_every > 0 && step % o.checkpoint_every == 0) || step == o.steps || stopping);
      if (due) {
        const std::string where = save_checkpoint(o.checkpoint_dir, engine, comm, state, layout);
        last_checkpoint = where;
        if (talk) std::cout << "checkpoint: " << where << "\n";
      }
      if (stopping) break;
    }
  } catch (const std::exception& e) {
    const std::optional<std::string> message = out_of_memory_message(e);
    if (!message) throw;
    // No collective from here: the other ranks may be anywhere. This rank reports and leaves;
    // run_executor's abort ends the others (MPI_Abort, or the NCCL timeout).
    mark_communication_failed();
    report_out_of_memory(*message, phases, rank, w, plan, o, engine, records, state.losses, command_line, loader.describe());
    return kExitRunFailed;
  }

  if (!o.export_dir.empty() && diverged_at == 0) {
    export_trained(o, plan, sharding, at, dims, chunk_layers, config.lora.active(), engine, comm, state.step, talk);
  }
  // The fullest rank's memory (the estimate reports the worst pipeline stage).
  RankMemory memory{engine.state_bytes(), 0, 0};
  for (const auto& rec : records) memory.peak_bytes = std::max(memory.peak_bytes, rec.peak_memory_bytes);
  if (w.device.is_cuda() && !records.empty()) memory.reserved_bytes = cuda_peak_reserved_bytes();
  const nlohmann::json memory_json = {{"w", memory.states.weights}, {"g", memory.states.gradients}, {"o", memory.states.optimizer},
                                      {"peak", memory.peak_bytes}, {"reserved", memory.reserved_bytes},
                                      {"sent", records.empty() ? SentBytes{} : records.back().bytes_sent}};
  RankMemory fullest = memory;
  SentBytes most_sent{};  // per group, the most any rank sent in the last step
  double ep_sent_total = 0;  // and the expert-parallel bytes over the ranks that sent any
  int ep_senders = 0;
  for (const std::string& text : comm.all_gather_strings(memory_json.dump())) {
    const nlohmann::json j = nlohmann::json::parse(text);
    const auto sent = j["sent"].get<SentBytes>();
    for (std::size_t g = 0; g < most_sent.size(); ++g) most_sent[g] = std::max(most_sent[g], sent[g]);
    if (sent[kSentEp] > 0) {
      ep_sent_total += sent[kSentEp];
      ++ep_senders;
    }
    const RankMemory other{{j["w"].get<double>(), j["g"].get<double>(), j["o"].get<double>()}, j["peak"].get<double>(), j["reserved"].get<double>()};
    if (other.total() > fullest.total()) fullest = other;
  }
  if (talk && !records.empty()) {
    nlohmann::json predicted_in_flight = nlohmann::json::array();
    for (int stage = 0; stage < p.pp; ++stage) predicted_in_flight.push_back(cm::micro_batches_in_flight(p, stage, static_cast<int>(accumulation)));
    const auto simulated = cm::simulate_pipeline(estimate.pipeline);
    // The first step pays one-time costs; the median of the others is the measurement.
    const double traced_bubble = step_bubbles.empty() ? 0.0
                                 : median(std::vector<double>(step_bubbles.begin() + (step_bubbles.size() > 2 ? 1 : 0), step_bubbles.end()));
    const nlohmann::json trace = {
        {"step", trace_step <= state.step ? trace_step : state.step},
        {"stages", p.pp},
        {"virtual_stages", p.virtual_stages},
        {"micro_batches", accumulation},
        {"schedule", cm::schedule_name(p.schedule)},
        {"chunk_layers", chunk_layers},
        {"bubble_fraction", traced_bubble},
        {"bubble_fraction_per_step", step_bubbles},
        {"predicted_bubble_fraction", simulated ? simulated->bubble_fraction : 0.0},
        {"peak_in_flight", stage_in_flight},
        {"predicted_in_flight", predicted_in_flight},
        {"events", trace_events},
    };
    // Bytes sent in the last step, by process group, on the rank that sent the most (the cost
    // model's communication volume: comm.hpp make_counting_communicator for the convention).
    nlohmann::json communication = {{"step", records.back().step}, {"rank", "the most of any rank"}};
    for (std::size_t g = 0; g < most_sent.size(); ++g) communication[std::string(kSentGroups[g]) + "_bytes_sent_per_step"] = most_sent[g];
    // Routing is never quite balanced, so the busiest rank's all-to-all bytes exceed the mean
    // (moe.load_imbalance); the mean over ranks is what balanced routing predicts, since every
    // rank's tokens are drawn alike.
    if (ep_senders > 0) communication["ep_bytes_sent_per_step_mean"] = ep_sent_total / ep_senders;
    nlohmann::json m = measurement_json(plan, w, fullest, records, state.losses, command_line, loader.describe(), trace, o.kernels, communication);
    if (plan.model.moe) m["moe"] = moe_json(*plan.model.moe, moe_steps);
    std::cout << "done: " << records.size() << " step(s), median " << m["time"]["step_seconds"].get<double>() << " s/step, "
              << m["throughput"]["tokens_per_second"].get<double>() << " tokens/s\n";
    if (p.pp > 1) {
      std::printf("pipeline (step %lld): bubble %.3f measured, %.3f predicted by the cost model's schedule; micro-batches in flight per stage:",
                  static_cast<long long>(trace["step"].get<int64_t>()), traced_bubble, trace["predicted_bubble_fraction"].get<double>());
      for (double x : stage_in_flight) std::printf(" %g", x);
      std::printf("\n");
      std::fflush(stdout);
    }
    if (diverged_at > 0) {
      m["status"] = "diverged";
      m["diverged"] = {{"step", diverged_at}, {"quantity", diverged_what == "loss" ? "loss" : "grad_norm"}, {"value", diverged_value}};
    }
    if (!o.measurement_path.empty()) {
      write_json_atomically(o.measurement_path, m);
      std::cout << "measurement: " << o.measurement_path << "\n";
    }
  }
  if (diverged_at > 0 && talk) {
    std::ostringstream line;
    line << "executor: error: training diverged: the " << diverged_what << " at step " << diverged_at << " is "
         << (diverged_value == "not_finite" ? "not finite at a loss scale below 1" : diverged_value) << " (" << cm::precision_name(t.precision)
         << ", peak --lr " << o.lr << "); the run stopped there" << (diverged_what == "loss" ? "" : ", without applying that step's update,")
         << " and wrote no checkpoint or export of it" << (last_checkpoint.empty() ? "" : " (the last checkpoint, " + last_checkpoint + ", stands)")
         << ". A lower --lr, --clip-grad or a longer --warmup-steps may help";
    print_for_rank(rank, line.str());
  }
  comm.barrier();
  // Every rank stopped at the same step: nothing to abort (kDivergedEverywhere).
  return diverged_at > 0 ? kDivergedEverywhere : 0;
}

}  // namespace

void print_rank_message(const std::string& text) {
  print_for_rank(launcher_rank(), text);
}

int run_executor(const RunOptions& o, const std::string& command_line) {
  const int env_rank = launcher_rank();
  cm::Plan plan;
  try {
    plan = load_plan(o.plan_path);
    check_supported(plan);
    check_options(o);
  } catch (const std::exception& e) {
    if (env_rank == 0) print_for_rank(env_rank, std::string("executor: error: ") + e.what());
    return kExitBadInput;
  }
  // Before CUDA starts: PyTorch's allocator reads its settings when it first allocates.
  if (const std::string note = apply_allocator_setting(plan.training.allocator); !note.empty() && env_rank == 0) {
    print_for_rank(env_rank, "executor: warning: " + note);
  }

  World w;
  try {
    w = make_world(o.device, o.timeout_seconds);
  } catch (const std::exception& e) {
    print_for_rank(env_rank, std::string("executor: error: ") + e.what());
    return kExitBadInput;
  }
  int code = 0;
  try {
    code = train(o, command_line, w, plan);
  } catch (const InputError& e) {
    print_for_rank(w.comm->rank(), std::string("executor: error: ") + e.what());
    code = kExitBadInput;
  } catch (const DataError& e) {
    print_for_rank(w.comm->rank(), std::string("executor: data error: ") + e.what());
    code = kExitBadInput;
  } catch (const CheckpointError& e) {
    print_for_rank(w.comm->rank(), std::string("executor: checkpoint error: ") + e.what());
    code = kExitBadInput;
  } catch (const ImportError& e) {
    print_for_rank(w.comm->rank(), std::string("executor: import error: ") + e.what());
    code = kExitBadInput;
  } catch (const std::exception& e) {
    print_for_rank(w.comm->rank(), std::string("executor: run failed: ") + e.what());
    code = kExitRunFailed;
  }
  if (code == kDivergedEverywhere) {
    code = kExitRunFailed;
  } else if (code != 0 && w.comm->size() > 1) {  // no rank is left waiting for this one
    (w.bootstrap ? w.bootstrap : w.comm)->abort(code);  // under mpirun, MPI_Abort ends every rank at once
  }
  w.comm.reset();
  w.bootstrap.reset();
  finalize_mpi();
  return code;
}

}  // namespace trainplan::executor
