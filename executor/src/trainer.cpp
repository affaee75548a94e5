// The training loop: plan -> ranks -> engine -> steps -> checkpoints -> measurement document.

#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "checkpoint.hpp"
#include "comm.hpp"
#include "data.hpp"
#include "engine.hpp"
#include "gpu.hpp"
#include "trainplan/costmodel/compute.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/executor/executor.hpp"

namespace trainplan::executor {

namespace cm = trainplan::costmodel;

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitRunFailed = 3;

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}
int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names) {
    const std::string v = env(n);
    if (!v.empty()) return std::stoi(v);
  }
  return fallback;
}

// What this build of the executor runs; everything else in a plan is refused with the reason.
void check_supported(const cm::Plan& plan) {
  std::vector<std::string> problems;
  const auto& p = plan.parallel;
  const auto& t = plan.training;
  if (p.tp != 1 || p.pp != 1 || p.cp != 1 || p.ep != 1) {
    problems.push_back("tensor, pipeline, context and expert parallelism are not in the executor yet (tp=" + std::to_string(p.tp) +
                       ", pp=" + std::to_string(p.pp) + ", cp=" + std::to_string(p.cp) + ", ep=" + std::to_string(p.ep) +
                       "; only data parallelism with ZeRO/FSDP runs)");
  }
  if (plan.model.moe) problems.push_back("mixture-of-experts models are not supported by the executor");
  if (t.mode == cm::TrainingMode::kLora || t.mode == cm::TrainingMode::kQlora) problems.push_back("LoRA/QLoRA fine-tuning is not supported by the executor");
  if (t.precision == cm::Precision::kFp8) problems.push_back("fp8 training is not supported by the executor (use bf16)");
  if (t.optimizer != cm::OptimizerKind::kAdamW) problems.push_back(std::string("optimizer ") + cm::optimizer_name(t.optimizer) + " is not supported (adamw only)");
  if (t.dropout) problems.push_back("dropout is not supported by the executor");
  if (p.offload_optimizer != cm::Offload::kNone || p.offload_params != cm::Offload::kNone) problems.push_back("CPU/NVMe offload is not supported by the executor");
  if (p.fsdp_wrap_min_params != 0) problems.push_back("fsdp_wrap_min_params: the executor wraps one unit per block");
  if (p.reduce_dtype != cm::Dtype::kFp32) problems.push_back("reduce_dtype: the executor reduces gradients in fp32");
  if (t.seq_len > plan.model.max_seq_len) problems.push_back("seq_len " + std::to_string(t.seq_len) + " exceeds the model's max_seq_len " + std::to_string(plan.model.max_seq_len));
  if (problems.empty()) return;
  std::string text = plan.name + ": the executor cannot run this plan:";
  for (const auto& s : problems) text += "\n  - " + s;
  throw InputError(text);
}

cm::Plan load_plan(const std::string& path) {
  auto request = cm::load_plan_file(path);
  if (!request) throw InputError(request.error().message);
  std::string open;
  for (const auto& n : cm::unset_layout_fields(request->parallel)) open += (open.empty() ? "" : ", ") + n;
  if (!open.empty()) {
    throw InputError(path + ": /parallel: " + open + " not fixed: this is a plan request; fix it first with `planner search " + path +
                     " --save-plan FIXED.json`");
  }
  auto plan = cm::plan_with_defaults(*request);
  if (!plan) throw InputError(path + ": " + plan.error().message);
  return *plan;
}

at::ScalarType torch_dtype(cm::Precision p) {
  switch (p) {
    case cm::Precision::kFp32: return at::kFloat;
    case cm::Precision::kBf16: return at::kBFloat16;
    case cm::Precision::kFp16: return at::kHalf;
    case cm::Precision::kFp8: break;
  }
  throw InputError("fp8 is not supported by the executor");
}

double lr_at(const RunOptions& o, int64_t step) {
  const int64_t warmup = o.warmup_steps >= 0 ? o.warmup_steps : o.steps / 10;
  const int64_t decay = o.decay_steps > 0 ? o.decay_steps : o.steps;
  if (warmup > 0 && step <= warmup) return o.lr * static_cast<double>(step) / static_cast<double>(warmup);
  const double span = std::max<double>(1.0, static_cast<double>(decay - warmup));
  const double progress = std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
  return o.lr * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string gib(double bytes) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.2f GiB", bytes / 1073741824.0);
  return s;
}

struct StepRecord {
  int64_t step = 0;
  double loss = 0, seconds = 0, tokens_per_second = 0, grad_norm = 0, lr = 0, optimizer_seconds = 0, dp_wait_seconds = 0;
  double peak_memory_bytes = 0, mfu = 0;
  bool skipped = false;
};

// The ranks of this job, from the launcher's environment.
struct World {
  std::unique_ptr<Communicator> bootstrap;  // MPI, when launched by MPI
  std::unique_ptr<Communicator> comm;       // what the engine uses (MPI, NCCL or self)
  int local_rank = 0, local_size = 1;
  at::Device device = at::kCPU;
  std::string device_name = "cpu";
};

World make_world(const RunOptions& o) {
  World w;
  const CommOptions comm_options{std::chrono::seconds(o.timeout_seconds)};
  bool want_cuda = o.device == "cuda" || (o.device == "auto" && cuda_present());
  if (o.device == "cuda" && !cuda_present()) throw InputError("--device cuda: no CUDA device is visible to this process");
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda") throw InputError("--device: expected auto, cpu or cuda, got \"" + o.device + "\"");

  if (launched_by_mpi()) {
    w.bootstrap = make_mpi_communicator(comm_options);
    w.local_rank = env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}, 0);
    w.local_size = env_int({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}, 1);
    if (want_cuda) {
      cuda_set_device(w.local_rank);
      w.comm = w.bootstrap->size() > 1 ? make_nccl_communicator(w.bootstrap->rank(), w.bootstrap->size(), w.bootstrap.get(), comm_options)
                                       : make_self_communicator();
    } else {
      w.comm = std::move(w.bootstrap);
    }
  } else {
    const int size = env_int({"WORLD_SIZE", "SLURM_NTASKS"}, 1);
    const int rank = env_int({"RANK", "SLURM_PROCID"}, 0);
    w.local_rank = env_int({"LOCAL_RANK", "SLURM_LOCALID"}, 0);
    w.local_size = env_int({"LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"}, 1);
    if (size > 1 && !want_cuda) {
      throw InputError("WORLD_SIZE=" + std::to_string(size) + " on CPU: CPU ranks communicate through MPI; start them with mpirun (or srun --mpi=pmix)");
    }
    if (want_cuda) cuda_set_device(w.local_rank);
    w.comm = size > 1 ? make_nccl_communicator(rank, size, nullptr, comm_options) : make_self_communicator();
  }
  if (want_cuda) {
    w.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(w.local_rank));
    w.device_name = cuda_device_name();
  }
  return w;
}

nlohmann::json measurement_json(const cm::Plan& plan, const World& w, const DataParallelEngine& engine,
                                const std::vector<StepRecord>& steps, const std::vector<double>& losses,
                                const std::string& command_line, const std::string& data) {
  const cm::Estimate estimate = cm::estimate(plan);
  const StateBytes states = engine.state_bytes();
  std::vector<double> seconds, optimizer, dp_wait, peak;
  // The first step of a run pays one-time costs (allocator growth, kernel selection).
  for (std::size_t i = steps.size() > 2 ? 1 : 0; i < steps.size(); ++i) {
    if (steps[i].skipped) continue;
    seconds.push_back(steps[i].seconds);
    optimizer.push_back(steps[i].optimizer_seconds);
    dp_wait.push_back(steps[i].dp_wait_seconds);
  }
  for (const auto& s : steps) peak.push_back(s.peak_memory_bytes);
  const double step_seconds = median(seconds);
  const double tokens = static_cast<double>(plan.training.global_batch) * static_cast<double>(plan.training.seq_len);
  const double world = w.comm->size();
  const double tokens_per_second = step_seconds > 0 ? tokens / step_seconds : 0;
  const double flops_per_token = cm::model_flops_per_token(plan.model, plan.training.seq_len);
  const double model_tflops = tokens_per_second * flops_per_token / world / 1e12;

  nlohmann::json memory = {{"weights_bytes", states.weights}, {"gradients_bytes", states.gradients}, {"optimizer_bytes", states.optimizer}};
  nlohmann::json throughput = {{"tokens_per_second", tokens_per_second},
                               {"tokens_per_second_per_gpu", tokens_per_second / world},
                               {"model_tflops_per_gpu", model_tflops}};
  if (w.device.is_cuda()) {
    const double peak_bytes = *std::max_element(peak.begin(), peak.end());
    memory["total_bytes"] = peak_bytes;
    memory["activations_bytes"] = std::max(0.0, peak_bytes - states.weights - states.gradients - states.optimizer);
    memory["reserved_bytes"] = cuda_peak_reserved_bytes();
    const double peak_flops = plan.cluster.gpu.peak_for(cm::compute_dtype(plan.training.precision)).value();
    if (peak_flops > 0) throughput["mfu"] = model_tflops * 1e12 / peak_flops;
  }
  nlohmann::json step_list = nlohmann::json::array();
  for (const auto& s : steps) {
    nlohmann::json j = {{"step", s.step}, {"loss", s.loss}, {"seconds", s.seconds}, {"tokens_per_second", s.tokens_per_second},
                        {"grad_norm", s.grad_norm}, {"lr", s.lr}, {"skipped", s.skipped}};
    if (w.device.is_cuda()) {
      j["peak_memory_bytes"] = s.peak_memory_bytes;
      j["mfu"] = s.mfu;
    }
    step_list.push_back(j);
  }
  return {
      {"schema", "trainplan/measurement/v1"},
      {"name", plan.name},
      {"source", "trainplan executor: " + command_line},
      {"model", plan.model.name},
      {"cluster", plan.cluster.name},
      {"gpus", plan.gpus},
      {"world_size", w.comm->size()},
      {"device", w.device_name},
      {"data", data},
      {"training", cm::training_to_json(plan.training)},
      {"parallel", cm::parallel_to_json(plan.parallel)},
      {"parameters", estimate.parameters},
      {"trainable_parameters", estimate.trainable_parameters},
      {"micro_batches_per_step", plan.training.global_batch / (plan.parallel.dp * plan.parallel.micro_batch)},
      {"memory", memory},
      {"time", {{"step_seconds", step_seconds}, {"optimizer_seconds", median(optimizer)}, {"dp_comm_exposed_seconds", median(dp_wait)}}},
      {"throughput", throughput},
      {"steps", step_list},
      {"losses", losses},
  };
}

void write_json_atomically(const std::string& path, const nlohmann::json& j) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) throw std::runtime_error(path + ": cannot write the measurement");
    out << j.dump(2) << "\n";
    if (!out) throw std::runtime_error(path + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error(path + ": cannot rename " + tmp);
}

int train(const RunOptions& o, const std::string& command_line, World& w, const cm::Plan& plan) {
  Communicator& comm = *w.comm;
  const int rank = comm.rank();
  const bool talk = rank == 0;
  if (comm.size() != plan.gpus) {
    throw InputError(o.plan_path + ": the plan is for " + std::to_string(plan.gpus) + " GPUs (tp(" + std::to_string(plan.parallel.tp) +
                     ") * pp(" + std::to_string(plan.parallel.pp) + ") * dp(" + std::to_string(plan.parallel.dp) + ") * cp(" +
                     std::to_string(plan.parallel.cp) + ")) but " + std::to_string(comm.size()) + " ranks were started");
  }
  if (!w.device.is_cuda()) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    at::set_num_threads(o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, cores / static_cast<unsigned>(std::max(1, w.local_size)))));
  }

  const auto& p = plan.parallel;
  const auto& t = plan.training;
  const int64_t accumulation = t.global_batch / (static_cast<int64_t>(p.dp) * p.micro_batch);
  EngineConfig config;
  config.zero_stage = p.zero_stage;
  config.shard_group = p.shard_group;
  config.prefetch = p.prefetch;
  config.overlap_grad_reduce = p.overlap_grad_reduce;
  config.recompute = p.recompute;
  config.recompute_layers = p.recompute_layers;
  config.compute_dtype = torch_dtype(t.precision);
  config.device = w.device;
  config.seed = o.seed;
  DataParallelEngine engine(plan.model, config, comm, t.seq_len);

  DataSpec data_spec;
  data_spec.source = o.data;
  data_spec.seed = o.seed;
  data_spec.token_bytes = o.data_dtype == "uint32" ? 4 : o.data_dtype == "uint16" ? 2 : 0;
  if (data_spec.token_bytes == 0) throw InputError("--data-dtype: expected uint16 or uint32, got \"" + o.data_dtype + "\"");
  DataLoader loader(data_spec, plan.model.vocab, t.seq_len);

  const std::string precision = cm::precision_name(t.precision);
  const nlohmann::json layout = checkpoint_layout(engine, comm.size(), precision);
  TrainerState state;
  state.loss_scale = t.precision == cm::Precision::kFp16 ? 65536.0 : 1.0;
  if (!o.resume.empty()) {
    const auto latest = latest_checkpoint(o.resume);
    if (!latest) throw CheckpointError(o.resume + ": no complete checkpoint (step_NNNNNN with manifest.json) found");
    state = load_checkpoint(*latest, engine, comm, layout);
    if (talk) std::cout << "resumed from " << *latest << " at step " << state.step << "\n";
  }

  if (talk) {
    const StateBytes sb = engine.state_bytes();
    std::cout << "executor: " << plan.name << " | " << plan.model.name << " | " << comm.size() << " rank(s) on " << w.device_name
              << " | dp " << p.dp << ", ZeRO-" << p.zero_stage
              << (p.zero_stage == 3 && p.shard_group > 0 && p.shard_group < p.dp ? " hybrid (shard " + std::to_string(p.shard_group) + ")" : "")
              << ", micro-batch " << p.micro_batch << " x " << accumulation << " accumulation, recompute "
              << cm::recompute_name(p.recompute) << ", " << precision << "\n"
              << "data: " << loader.describe() << " | global batch " << t.global_batch << " x " << t.seq_len << " tokens\n"
              << "model states per rank: weights " << gib(sb.weights) << ", gradients " << gib(sb.gradients) << ", optimizer "
              << gib(sb.optimizer) << "\n";
  }

  const AdamWSettings adamw{0.9, 0.95, 1e-8, o.weight_decay};
  const double flops_per_token = cm::model_flops_per_token(plan.model, t.seq_len);
  const double peak_flops = plan.cluster.gpu.peak_for(cm::compute_dtype(t.precision)).value();
  std::vector<StepRecord> records;
  int64_t run_steps = 0;
  while (state.step < o.steps) {
    const int64_t step = state.step + 1;
    if (o.fail_at_step == step && o.fail_rank == rank) {
      std::cerr << "executor[rank " << rank << "]: --fail-at-step " << step << ": killing this rank (fault injection)\n";
      std::raise(SIGKILL);
    }
    if (w.device.is_cuda()) cuda_reset_peak();
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    for (int64_t k = 0; k < accumulation; ++k) {
      const MicroBatch mb = loader.micro_batch(step, comm.rank(), comm.size(), t.global_batch, p.micro_batch, k, w.device);
      loss_sum += engine.micro_batch(mb.tokens, mb.targets, state.loss_scale / static_cast<double>(accumulation), k == accumulation - 1);
    }
    StepRecord r;
    r.step = step;
    r.loss = all_reduce_scalar(comm, loss_sum) / static_cast<double>(accumulation * comm.size());
    r.lr = lr_at(o, step);
    const auto t_opt = std::chrono::steady_clock::now();
    const bool finite = t.precision != cm::Precision::kFp16 || engine.gradients_finite();
    if (finite) {
      r.grad_norm = engine.gradient_norm() / state.loss_scale;
      const double clip = o.clip_grad > 0 && r.grad_norm > o.clip_grad ? o.clip_grad / (r.grad_norm + 1e-6) : 1.0;
      engine.optimizer_step(adamw, r.lr, clip / state.loss_scale, step);
    } else {
      r.skipped = true;
      state.loss_scale /= 2;
      state.good_steps = 0;
    }
    engine.zero_gradients();
    if (w.device.is_cuda()) cuda_synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    if (finite && t.precision == cm::Precision::kFp16 && ++state.good_steps % 2000 == 0) state.loss_scale *= 2;
    r.seconds = std::chrono::duration<double>(t1 - t0).count();
    r.optimizer_seconds = std::chrono::duration<double>(t1 - t_opt).count();
    r.dp_wait_seconds = engine.take_timers().dp_wait_seconds;
    r.tokens_per_second = static_cast<double>(t.global_batch * t.seq_len) / r.seconds;
    if (w.device.is_cuda()) {
      r.peak_memory_bytes = cuda_peak_allocated_bytes();
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
    const bool stopping = o.stop_after > 0 && run_steps >= o.stop_after;
    const bool due = !o.checkpoint_dir.empty() &&
                     ((o.checkpoint_every > 0 && step % o.checkpoint_every == 0) || step == o.steps || stopping);
    if (due) {
      const std::string where = save_checkpoint(o.checkpoint_dir, engine, comm, state, layout);
      if (talk) std::cout << "checkpoint: " << where << "\n";
    }
    if (stopping) break;
  }

  if (!o.export_dir.empty()) {
    export_safetensors(o.export_dir, engine, comm, state.step);
    if (talk) std::cout << "exported: " << (std::filesystem::path(o.export_dir) / "model.safetensors").string() << "\n";
  }
  if (talk && !records.empty()) {
    const nlohmann::json m = measurement_json(plan, w, engine, records, state.losses, command_line, loader.describe());
    std::cout << "done: " << records.size() << " step(s), median " << m["time"]["step_seconds"].get<double>() << " s/step, "
              << m["throughput"]["tokens_per_second"].get<double>() << " tokens/s\n";
    if (!o.measurement_path.empty()) {
      write_json_atomically(o.measurement_path, m);
      std::cout << "measurement: " << o.measurement_path << "\n";
    }
  }
  comm.barrier();
  return 0;
}

}  // namespace

int run_executor(const RunOptions& o, const std::string& command_line) {
  const int env_rank = env_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK", "SLURM_PROCID"}, 0);
  cm::Plan plan;
  try {
    plan = load_plan(o.plan_path);
    check_supported(plan);
    if (o.steps < 1) throw InputError("--steps: must be at least 1");
    if (o.lr <= 0 || !std::isfinite(o.lr)) throw InputError("--lr: must be a positive number");
  } catch (const std::exception& e) {
    if (env_rank == 0) std::cerr << "executor: error: " << e.what() << "\n";
    return kExitBadInput;
  }

  World w;
  try {
    w = make_world(o);
  } catch (const std::exception& e) {
    std::cerr << "executor[rank " << env_rank << "]: error: " << e.what() << "\n";
    return kExitBadInput;
  }
  int code = 0;
  try {
    code = train(o, command_line, w, plan);
  } catch (const InputError& e) {
    std::cerr << "executor[rank " << w.comm->rank() << "]: error: " << e.what() << "\n";
    code = kExitBadInput;
  } catch (const DataError& e) {
    std::cerr << "executor[rank " << w.comm->rank() << "]: data error: " << e.what() << "\n";
    code = kExitBadInput;
  } catch (const CheckpointError& e) {
    std::cerr << "executor[rank " << w.comm->rank() << "]: checkpoint error: " << e.what() << "\n";
    code = kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "executor[rank " << w.comm->rank() << "]: run failed: " << e.what() << "\n";
    code = kExitRunFailed;
  }
  if (code != 0 && w.comm->size() > 1) w.comm->abort(code);  // no rank is left waiting for this one
  w.comm.reset();
  w.bootstrap.reset();
  finalize_mpi();
  return code;
}

}  // namespace trainplan::executor
