// planner: searches every valid parallel plan for a model on a cluster and recommends one;
// `evaluate` estimates one fixed plan; `compare` sets an estimate beside a measurement; `launch`
// prints the SLURM script or torchrun command that runs a plan; `export` writes what Megatron-LM,
// torchtitan, DeepSpeed, Accelerate or LitGPT needs to run it; `run` runs it here on CPU ranks;
// `validate` predicts every published table and given measurement, row by row; `tune` measures the
// top distinct layouts with the executor, calibrates the profile to them and re-ranks; `calibrate` fits a
// profile's efficiencies to measurements; `profile` measures this machine's device with the
// executor (or imports measured CSVs) into a hardware profile; `models` and `hardware` list the
// presets. The subcommands themselves are in app/commands.cpp.
// Exit codes: 0 success, 1 no plan fits (for a published configuration too), 2 bad input, 3 the
// run failed (`run`).

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <unistd.h>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "trainplan/costmodel/hf_config.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/planner/calibrate.hpp"
#include "trainplan/planner/compare.hpp"
#include "trainplan/planner/stack_logs.hpp"
#include "trainplan/planner/export.hpp"
#include "trainplan/planner/inputs.hpp"
#include "trainplan/planner/launch.hpp"
#include "trainplan/planner/local_run.hpp"
#include "trainplan/planner/profile.hpp"
#include "trainplan/planner/profile_run.hpp"
#include "trainplan/planner/report.hpp"
#include "trainplan/planner/search.hpp"
#include "trainplan/planner/tune.hpp"
#include "trainplan/planner/validate.hpp"


#include "commands.hpp"

using namespace trainplan::planner_app;

namespace {

int run(int argc, char** argv) {
  CLI::App app{"trainplan planner: what fits, how fast it goes, and why"};
  app.require_subcommand(0, 1);

  std::string model = "70b", cluster, seq_len_text, batch_tokens_text, train_tokens_text, format = "text", save_plan, objective = "throughput";
  std::string precision = "bf16", optimizer = "adamw", mode = "pretrain", attention = "flash", stack, lora_targets = "q,k,v,o", base_format = "nf4";
  std::string attention_mask = "causal", loss = "stack", fp8_recipe = "stack", attention_kernel = "stack", allocator = "caching";
  bool pure_16bit = false;
  bool fp8_all_gather = false;
  double memory_headroom_percent = 100 * cm::kDefaultMemoryHeadroom;
  int gpus = 0, lora_rank = 16, top = 10;
  long long global_batch = 0;
  bool dropout = false, quiet = false;
  std::vector<std::string> fixes;
  app.add_option("--model", model, "Model preset, alias (70b, 405b, 8b, 175b), model JSON file, or Hugging Face config.json")->capture_default_str();
  app.add_option("--gpus", gpus, "Number of GPUs");
  app.add_option("--cluster", cluster, std::string("Cluster preset or hwprofile JSON file (default ") + cm::kDefaultCluster + ")");
  app.add_option("--seq-len", seq_len_text, "Tokens per sequence (default: the model's context length)");
  app.add_option("--global-batch", global_batch, "Sequences per optimizer step");
  app.add_option("--global-batch-tokens", batch_tokens_text, "Tokens per optimizer step; K/M/G suffixes are binary here (16M = 16*2^20)");
  app.add_option("--train-tokens", train_tokens_text, "Tokens to train; suffixes K, M, G or B, T, P are decimal (15T = 15e12), Ki, Mi, Gi, Ti, Pi binary. Default: 20 per parameter");
  app.add_option("--precision", precision, "fp32 | bf16 | fp16 | fp8")->check(CLI::IsMember({"fp32", "bf16", "fp16", "fp8"}))->capture_default_str();
  app.add_option("--optimizer", optimizer, "adamw | sgd | adafactor | adam8bit")->check(CLI::IsMember({"adamw", "sgd", "adafactor", "adam8bit"}))->capture_default_str();
  app.add_option("--mode", mode, "pretrain | full | lora | qlora")->check(CLI::IsMember({"pretrain", "full", "lora", "qlora"}))->capture_default_str();
  app.add_option("--lora-rank", lora_rank, "LoRA rank")->check(CLI::Range(1, 65536))->capture_default_str();
  app.add_option("--lora-targets", lora_targets, "LoRA: the projections with adapters, comma-separated (q k v o gate up down; all-linear for every one)")
      ->capture_default_str();
  app.add_option("--base-format", base_format, "QLoRA: storage of the frozen base weights, nf4 | int8")->check(CLI::IsMember({"nf4", "int8"}))->capture_default_str();
  app.add_option("--attention", attention, "flash | standard (materialised scores)")->check(CLI::IsMember({"flash", "standard"}))->capture_default_str();
  app.add_option("--attention-mask", attention_mask, "causal (the kernel's causal flag) | explicit (a mask tensor: the whole seq x seq rectangle computed, the mask kept)")
      ->check(CLI::IsMember({"causal", "explicit"}))->capture_default_str();
  app.add_option("--loss", loss, std::string("Loss kernel: stack (the stack's own) | ") + cm::loss_kernel_choices())->capture_default_str();
  app.add_option("--attention-kernel", attention_kernel,
                 "Fused attention kernel: stack (the stack's own) | profile (the profile's measured table: SDPA's cuDNN backend on the H100 and "
                 "H200 presets) | flash2 (FlashAttention-2) | flash3 (FlashAttention-3, Hopper only)")
      ->check(CLI::IsMember({"stack", "profile", "flash2", "flash3"}))->capture_default_str();
  app.add_option("--fp8-recipe", fp8_recipe,
                 "fp8 scaling: stack (the stack's own: delayed for megatron-te, current for the others) | delayed (an amax history) | current "
                 "(each tensor's own amax: Megatron's --fp8-recipe tensorwise)")
      ->check(CLI::IsMember({"stack", "delayed", "current"}))->capture_default_str();
  app.add_flag("--fp8-all-gather", fp8_all_gather,
               "fp8 under FSDP2 (fsdp2, fsdp2-compile): all-gather the linear layers' weights in fp8 with scales precomputed once a step "
               "(torchao's enable_fsdp_float8_all_gather and precompute_float8_dynamic_scale_for_fsdp; needs --precision fp8)");
  app.add_flag("--pure-16bit", pure_16bit, "No fp32 master weights: parameters, gradients, optimizer states and the gradient reduction in the 16-bit dtype (a model cast to bf16 under FSDP without mixed precision)");
  app.add_flag("--dropout", dropout, "Model has dropout layers");
  app.add_option("--allocator", allocator,
                 "PyTorch's CUDA allocator: caching (its default: freed blocks kept for reuse) | expandable-segments "
                 "(PYTORCH_ALLOC_CONF=expandable_segments:True, as torchtitan's run_train.sh sets: empty pages given back when memory runs short)")
      ->check(CLI::IsMember({"caching", "expandable-segments"}))->capture_default_str();
  const std::string stack_help = std::string("Software stack to predict for: ") + cm::stack_choices() + " (default trainplan, this project's executor)";
  const std::string headroom_help = "Percent of HBM kept free: plans needing more are \"tight\", ranked after the others (default " +
                                    std::to_string(static_cast<int>(100 * cm::kDefaultMemoryHeadroom)) + ", twice the largest memory error on the measured H100 runs)";
  app.add_option("--stack", stack, stack_help);
  app.add_option("--memory-headroom", memory_headroom_percent, headroom_help);
  app.add_option("--fix", fixes, "Fix a parallel setting, e.g. --fix tp=8 --fix pp=4 --fix recompute=full");
  app.add_option("--objective", objective, "throughput | time | cost")->check(CLI::IsMember({"throughput", "time", "cost"}))->capture_default_str();
  app.add_option("--top", top, "Layouts to list (each at its best micro-batch, virtual stages and schedule)")->check(CLI::Range(1, 1000))->capture_default_str();
  bool all_variants = false;
  app.add_flag("--all-variants", all_variants, "Rank every variant of a layout (micro-batch, virtual stages, schedule) on its own instead of folding them under its best");
  app.add_option("--format", format, "text | json | csv | md | html")->check(CLI::IsMember({"text", "json", "csv", "md", "html"}))->capture_default_str();
  app.add_option("--save-plan", save_plan, "Write the recommended plan (trainplan/plan/v1) to this file");
  app.add_flag("--quiet", quiet, "No progress on stderr");

  CLI::App* evaluate_cmd = app.add_subcommand("evaluate", "Estimate one fixed plan (trainplan/plan/v1) with the full breakdown");
  std::string plan_file;
  evaluate_cmd->add_option("plan", plan_file, "Plan JSON file")->required();
  evaluate_cmd->add_option("--format", format, "text | json | csv | md | html")->check(CLI::IsMember({"text", "json", "csv", "md", "html"}));
  evaluate_cmd->add_option("--stack", stack, stack_help + "; overrides the plan's training.stack");
  evaluate_cmd->add_option("--memory-headroom", memory_headroom_percent, headroom_help);
  CLI::App* search_cmd = app.add_subcommand("search", "Search the open (\"auto\") fields of a plan file");
  search_cmd->add_option("plan", plan_file, "Plan JSON file")->required();
  search_cmd->add_option("--format", format, "text | json | csv | md | html")->check(CLI::IsMember({"text", "json", "csv", "md", "html"}));
  search_cmd->add_option("--save-plan", save_plan, "Write the recommended plan to this file");
  search_cmd->add_option("--top", top, "Layouts to list")->check(CLI::Range(1, 1000));
  search_cmd->add_flag("--all-variants", all_variants, "Rank every variant of a layout on its own");
  search_cmd->add_option("--stack", stack, stack_help + "; overrides the plan's training.stack");
  search_cmd->add_option("--memory-headroom", memory_headroom_percent, headroom_help);
  CLI::App* compare_cmd = app.add_subcommand("compare", "Compare an estimate with a measurement the executor wrote");
  std::string estimate_file, measurement_file;
  compare_cmd->add_option("estimate", estimate_file, "trainplan/estimate/v1 file (planner evaluate --format json) or a fixed plan file")->required();
  compare_cmd->add_option("measurement", measurement_file,
                          "trainplan/measurement/v1 file, or a torchtitan or Megatron-LM training log (its console output)")->required();
  compare_cmd->add_option("--format", format, "text | md | html | json")->check(CLI::IsMember({"text", "md", "html", "json"}));
  CLI::App* launch_cmd = app.add_subcommand("launch", "Print the SLURM script (--slurm) or torchrun command that runs a fixed plan");
  pl::LaunchOptions launch;
  bool slurm = false;
  std::string executor;
  launch_cmd->add_option("plan", plan_file, "Fixed plan file (planner --save-plan writes one)")->required();
  launch_cmd->add_option("--nodes", launch.nodes, "Nodes; nodes x GPUs per node must equal the plan's GPUs")->required();
  launch_cmd->add_flag("--slurm", slurm, "Print a SLURM batch script for sbatch instead of the torchrun command");
  launch_cmd->add_option("--steps", launch.steps, "Optimizer steps to run")->capture_default_str();
  launch_cmd->add_option("--executor", executor, "The executor on the nodes (default: $TRAINPLAN_EXECUTOR, the one built beside planner, else executor)");
  int launch_gpus_per_node = 0;
  launch_cmd->add_option("--gpus-per-node", launch_gpus_per_node, "Ranks (GPUs) per node, >= 1 (default: the plan cluster's)");
  launch_cmd->add_option("--cpus-per-task", launch.cpus_per_task, "CPU cores per rank (SLURM)")->capture_default_str();
  launch_cmd->add_option("--partition", launch.partition, "SLURM partition");
  launch_cmd->add_option("--account", launch.account, "SLURM account");
  launch_cmd->add_option("--time", launch.time_limit, "SLURM time limit (HH:MM:SS)");
  launch_cmd->add_option("--job-name", launch.job_name, "SLURM job name");
  std::vector<std::string> launch_extra;
  launch_cmd->add_option("--extra", launch_extra,
                         "More executor arguments, e.g. --extra \"--seed 1\"; repeatable. The text is split into words by the shell's "
                         "quoting rules ('...', \"...\", backslash) with no expansion ($, ;, backticks are plain characters; an unclosed "
                         "quote is an error), and each word reaches the executor as one argument")
      ->allow_extra_args(false);

  CLI::App* export_cmd = app.add_subcommand("export", "Write what Megatron-LM, torchtitan, DeepSpeed, Accelerate or LitGPT needs to run a fixed plan");
  std::string export_target, export_out;
  export_cmd->add_option("plan", plan_file, "Fixed plan file (planner --save-plan writes one)")->required();
  export_cmd->add_option("--to", export_target, "megatron (a torchrun script), torchtitan (TOML), deepspeed (JSON), accelerate (YAML) or litgpt (YAML)")->required();
  export_cmd->add_option("--out", export_out, "Write the file here instead of to stdout");

  CLI::App* run_cmd = app.add_subcommand("run", "Run a fixed plan on this machine's CPUs under MPI with the executor, then compare");
  pl::LocalRunOptions local;
  run_cmd->add_option("plan", plan_file, "Fixed plan file (planner --save-plan writes one)")->required();
  run_cmd->add_option("--steps", local.steps, "Optimizer steps to run")->capture_default_str();
  run_cmd->add_option("--executor", executor, "The executor (default: $TRAINPLAN_EXECUTOR, the one built beside planner, executor on PATH)");
  run_cmd->add_option("--ranks", local.ranks, "MPI ranks; must equal the plan's GPUs, which is the default")->check(CLI::Range(1, 1 << 24));
  run_cmd->add_option("--measurement", measurement_file, "Measurement file the executor writes (default: <plan stem>.measurement.json here)");
  run_cmd->add_option("--mpirun", local.mpirun, "The mpirun to use")->capture_default_str();
  run_cmd->add_option("--format", format, "text | md | html | json")->check(CLI::IsMember({"text", "md", "html", "json"}));
  run_cmd->add_option("executor_args", local.extra_args, "After --: more arguments for the executor");
  CLI::App* trace_cmd = app.add_subcommand("trace", "Write a measurement's trace as Chrome trace-event JSON (ui.perfetto.dev)");
  trace_cmd->add_option("measurement", measurement_file, "trainplan/measurement/v1 file")->required();
  CLI::App* profile_cmd = app.add_subcommand("profile", "Measure this machine's device with the executor's microbenchmarks and write a hardware "
                                                          "profile with the measured tables (--from-csv imports microbenchmark CSVs instead)");
  std::vector<std::string> profile_csv;
  std::string profile_base = cm::kDefaultCluster, profile_name, profile_out, profile_source;
  pl::ProfileRunOptions profile_run;
  profile_cmd->add_option("--device", profile_run.device, "auto | cpu | cuda: the device measured (auto: cuda when present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))->capture_default_str();
  profile_cmd->add_option("--ranks", profile_run.ranks, "Ranks on this node; > 1 runs them under mpirun and measures all-reduce, all-gather "
                                                        "and reduce-scatter bus bandwidth too")->capture_default_str();
  profile_cmd->add_flag("--quick", profile_run.quick, "The executor's shorter sweep (fewer shapes and repeats)");
  profile_cmd->add_option("--threads", profile_run.threads, "CPU threads for the kernels (default: every core; 1 gives steadier figures on "
                                                            "cores shared with other work)");
  profile_cmd->add_option("--executor", executor, "The executor (default: $TRAINPLAN_EXECUTOR, the one built beside planner, executor on PATH)");
  profile_cmd->add_option("--mpirun", profile_run.mpirun, "The mpirun to use with --ranks > 1")->capture_default_str();
  profile_cmd->add_option("--from-csv", profile_csv, "Microbenchmark CSV to import (h100_kernels.csv and h100_elementwise.csv formats); repeatable");
  profile_cmd->add_option("--base", profile_base, "Cluster preset or hwprofile file whose tables are replaced")->capture_default_str();
  profile_cmd->add_option("--name", profile_name, "Name of the new profile (default: the base's)");
  profile_cmd->add_option("--source", profile_source, "Where the measurements come from (machine, software, date), for the tables' source");
  profile_cmd->add_option("--out", profile_out, "Write the profile here (default: standard output)");
  CLI::App* calibrate_cmd = app.add_subcommand("calibrate", "Fit a profile's efficiencies (time scales, kernel latency, allocator bytes) to executor measurements by least squares");
  std::vector<std::string> calibrate_files;
  std::string calibrate_out;
  calibrate_cmd->add_option("measurements", calibrate_files, "trainplan/measurement/v1 files the executor wrote")->required();
  calibrate_cmd->add_option("--cluster", cluster, "Profile to fit (default: the measurements' cluster)");
  calibrate_cmd->add_option("--out", calibrate_out, "Write the calibrated profile here");
  calibrate_cmd->add_option("--format", format, "text | md")->check(CLI::IsMember({"text", "md"}));
  CLI::App* validate_cmd = app.add_subcommand("validate", "Predict every published table (tests/data) and each measurement given, row by row, with MAPE per table");
  std::vector<std::string> validate_files;
  validate_cmd->add_option("measurements", validate_files, "trainplan/measurement/v1 files (0 or more)");
  validate_cmd->add_option("--format", format, "text | json | md")->check(CLI::IsMember({"text", "json", "md"}));
  CLI::App* tune_cmd = app.add_subcommand("tune", "Measure the top distinct plans for real with the executor (mpirun on CPU ranks, torchrun on this "
                                                   "node's GPUs, or SLURM jobs), calibrate the profile to them, re-rank, and choose");
  tune_cmd->fallthrough();  // --model, --gpus, --cluster, --seq-len, --global-batch, --fix, --stack... as for a search
  pl::TuneOptions tune_options;
  std::string tune_launcher = "mpirun";
  std::vector<std::string> tune_extra;
  tune_cmd->add_option("--launcher", tune_launcher, "mpirun (this machine's CPU ranks) | torchrun (this node's GPUs) | slurm (a job per candidate)")
      ->check(CLI::IsMember({"mpirun", "torchrun", "slurm"}))->capture_default_str();
  tune_cmd->add_option("--top", tune_options.top, "Distinct layouts to measure before calibrating")->check(CLI::Range(1, 100))->capture_default_str();
  tune_cmd->add_option("--steps", tune_options.steps, "Steps each candidate runs after one warm-up step")->check(CLI::Range(1, 100000))->capture_default_str();
  tune_cmd->add_option("--repeats", tune_options.repeats, "Runs of each candidate, the ones after the first taken in turns across the candidates; its step is the fastest run's (a slower one was slowed by something else)")
      ->check(CLI::Range(1, 10))->capture_default_str();
  tune_cmd->add_option("--rounds", tune_options.rounds, "Re-rank rounds: a layout not measured that ranks first after calibration is measured too")
      ->check(CLI::Range(0, 20))->capture_default_str();
  tune_cmd->add_option("--deadline", tune_options.deadline_seconds, "Seconds one candidate may run (queue time included for SLURM) before it is ended as hung")
      ->check(CLI::PositiveNumber)->capture_default_str();
  tune_cmd->add_option("--out", tune_options.out_dir, "Folder for the tune: tune.json, candidates/NN/, profile.json, plan.json")->required();
  tune_cmd->add_flag("--resume", tune_options.resume, "Go on with the tune in --out; nothing that ended there runs again");
  tune_cmd->add_flag("--dry-run", tune_options.dry_run, "Print the job scripts and commands of the top layouts; run nothing");
  tune_cmd->add_option("--executor", executor, "The executor (default: $TRAINPLAN_EXECUTOR, the one built beside planner, executor on PATH; for SLURM as the nodes see it)");
  tune_cmd->add_option("--mpirun", tune_options.mpirun, "The mpirun to use")->capture_default_str();
  tune_cmd->add_option("--torchrun", tune_options.torchrun, "The torchrun to use")->capture_default_str();
  tune_cmd->add_option("--sbatch", tune_options.sbatch, "SLURM's sbatch")->capture_default_str();
  tune_cmd->add_option("--squeue", tune_options.squeue, "SLURM's squeue")->capture_default_str();
  tune_cmd->add_option("--sacct", tune_options.sacct, "SLURM's sacct")->capture_default_str();
  tune_cmd->add_option("--scancel", tune_options.scancel, "SLURM's scancel")->capture_default_str();
  tune_cmd->add_option("--poll", tune_options.poll_seconds, "SLURM: seconds between squeue calls")->check(CLI::Range(0.05, 600.0))->capture_default_str();
  tune_cmd->add_option("--partition", tune_options.slurm.partition, "SLURM partition");
  tune_cmd->add_option("--account", tune_options.slurm.account, "SLURM account");
  tune_cmd->add_option("--time", tune_options.slurm.time_limit, "SLURM time limit per job (HH:MM:SS)");
  tune_cmd->add_option("--extra", tune_extra, "More executor arguments for every candidate, split as the shell would (see launch --extra); repeatable");
  tune_cmd->add_option("--inject-failure", tune_options.inject_failure, "Fault injection: candidate N's rank 0 is killed at step 2")->group("");
  tune_cmd->add_option("--inject-failure-run", tune_options.inject_failure_run, "Fault injection: in that candidate's run R (default 1)")->group("");

  app.add_subcommand("models", "List model presets");
  app.add_subcommand("hardware", "List cluster presets");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitBadInput;
  }

  if (app.got_subcommand("models")) return list_models();
  if (app.got_subcommand("hardware")) return list_hardware();

  const pl::Format fmt = parse_format(format);
  pl::ReportContext ctx;
  ctx.command = join_args(argc, argv);
  if (!(memory_headroom_percent >= 0 && memory_headroom_percent <= 50)) {
    return fail("--memory-headroom: must be a percentage of HBM from 0 to 50 (got " + std::to_string(memory_headroom_percent) + ")");
  }
  ctx.memory_headroom = memory_headroom_percent / 100.0;
  std::optional<cm::Stack> stack_choice;
  if (!stack.empty()) {
    stack_choice = cm::stack_from_name(stack);
    if (!stack_choice) return fail("--stack: must be one of " + std::string(cm::stack_choices()) + " (got \"" + stack + "\")");
  }

  // No output replaces an input: checked before anything runs.
  {
    std::vector<std::pair<std::string, std::string>> inputs;
    if (!plan_file.empty()) inputs.emplace_back("plan file", plan_file);
    for (const std::string& f : calibrate_files) inputs.emplace_back("measurement", f);
    // And what those name as their model and cluster.
    std::vector<std::string> documents = calibrate_files;
    if (!plan_file.empty()) documents.push_back(plan_file);
    for (const std::string& document : documents) {
      for (const std::string& f : cm::referenced_files(document)) inputs.emplace_back("file " + document + " names", f);
    }
    for (const std::string& f : profile_csv) inputs.emplace_back("--from-csv file", f);
    // A preset's name is no file even where a file of that name exists (presets come first).
    const auto is_preset = [](const std::vector<std::string>& names, const std::string& name) {
      return std::find(names.begin(), names.end(), name) != names.end();
    };
    if (!cluster.empty() && !is_preset(cm::hwprofile_preset_names(), cluster)) inputs.emplace_back("--cluster file", cluster);
    if (!is_preset(cm::hwprofile_preset_names(), profile_base)) inputs.emplace_back("--base profile", profile_base);
    if (!model.empty() && !is_preset(cm::model_preset_names(), cm::resolve_model_alias(model))) inputs.emplace_back("--model file", model);
    const std::pair<const char*, std::string> outputs[] = {
        {"--save-plan", save_plan}, {"--out", export_out}, {"--out", profile_out}, {"--out", calibrate_out}, {"--measurement", app.got_subcommand("run") ? measurement_file : ""}};
    for (const auto& [flag, path] : outputs) {
      if (const std::string conflict = cm::overwrite_conflict(flag, path, inputs); !conflict.empty()) return fail(conflict);
    }
  }
  if (app.got_subcommand("compare")) return compare_files(estimate_file, measurement_file, fmt);
  if (app.got_subcommand("calibrate")) {
    // One run given twice would weigh twice in the fit.
    for (std::size_t i = 0; i < calibrate_files.size(); ++i) {
      for (std::size_t j = 0; j < i; ++j) {
        std::error_code ec;
        if (std::filesystem::equivalent(calibrate_files[i], calibrate_files[j], ec)) {
          return fail(calibrate_files[i] + ": given twice (as " + calibrate_files[j] + "); each measurement counts once in the fit");
        }
      }
    }
    return calibrate_profile(calibrate_files, cluster, calibrate_out, fmt);
  }
  if (app.got_subcommand("trace")) return write_chrome_trace(measurement_file);
  if (app.got_subcommand("validate")) return validate(validate_files, fmt);
  const pl::ExecutorSearch executor_search{executor, environment("TRAINPLAN_EXECUTOR"), pl::own_binary_dir(argv[0]), environment("PATH")};
  if (app.got_subcommand("profile")) {
    if (!profile_csv.empty()) {
      for (const char* flag : {"--device", "--ranks", "--quick", "--threads", "--executor", "--mpirun"}) {
        if (profile_cmd->count(flag) > 0) return fail(std::string("profile: ") + flag + " measures this machine; it does not go with --from-csv");
      }
      return import_profile(profile_csv, profile_base, profile_name, profile_source, profile_out);
    }
    if (!profile_source.empty()) return fail("profile: --source describes imported CSVs; it goes with --from-csv (a measured profile says its own source)");
    profile_run.out = profile_out;
    profile_run.base = profile_base;
    profile_run.name = profile_name;
    profile_run.command = ctx.command;
    return measure_profile(profile_run, executor_search);
  }
  if (app.got_subcommand("launch")) {
    launch.executor = pl::executor_for_launch(executor_search);
    if (launch_cmd->count("--gpus-per-node") > 0) launch.gpus_per_node = launch_gpus_per_node;
    for (const std::string& text : launch_extra) {
      auto words = pl::split_shell_words(text);
      if (!words) return fail("--extra " + words.error().message);
      launch.extra_args.insert(launch.extra_args.end(), words->begin(), words->end());
    }
    return launch_plan(plan_file, launch, slurm);
  }
  if (app.got_subcommand("export")) return export_plan(plan_file, export_target, export_out);
  if (app.got_subcommand("run")) return run_plan(plan_file, local, executor_search, measurement_file, fmt);

  if (app.got_subcommand("evaluate")) {
    auto loaded = cm::load_plan_file(plan_file);
    if (!loaded) return fail(loaded.error().message);
    cm::PlanRequest fixed_request = std::move(loaded).value();
    auto* req = &fixed_request;
    // Unset fields take their documented defaults (tp=pp=cp=ep=1, dp = the rest, zero 0, ...).
    if (stack_choice) req->training.stack = *stack_choice;
    if (app.count("--allocator") > 0) req->training.allocator = *cm::allocator_from_name(allocator);
    auto plan = cm::plan_with_defaults(*req);
    if (!plan) return fail(plan_file + ": " + plan.error().message);
    cm::EstimateOptions estimate_options;
    estimate_options.memory_headroom = ctx.memory_headroom;
    auto cand = pl::evaluate(*plan, estimate_options);
    if (!cand) return fail(plan_file + ": " + cand.error().message);
    std::cout << pl::render_evaluation(*cand, ctx, fmt);
    return cand->estimate.fits ? 0 : kExitNoFit;
  }

  cm::PlanRequest req;
  if (app.got_subcommand("search")) {
    auto loaded = cm::load_plan_file(plan_file);
    if (!loaded) return fail(loaded.error().message);
    req = std::move(loaded).value();
    if (stack_choice) req.training.stack = *stack_choice;
    if (app.count("--allocator") > 0) req.training.allocator = *cm::allocator_from_name(allocator);
  } else {
    if (app.count("--gpus") == 0) return fail("--gpus: required, the number of GPUs to plan for (e.g. --gpus 64), or a plan file with search or evaluate");
    if (gpus <= 0 || gpus > (1 << 24)) {  // 2^24, as in plan files (wider counts overflow the search's products)
      return fail("--gpus: must be a number of GPUs from 1 to 16777216 (e.g. --gpus 64; got " + std::to_string(gpus) + ")");
    }
    auto m = cm::find_model(model);
    if (!m) return fail("--model: " + m.error().message);
    ctx.default_cluster = cluster.empty();
    auto hw = cm::find_hwprofile(cluster.empty() ? cm::kDefaultCluster : cluster);
    if (!hw) return fail("--cluster: " + hw.error().message);
    req.model = std::move(m).value();
    req.model_ref = cm::resolve_model_alias(model);
    req.cluster = std::move(hw).value();
    req.cluster_ref = cluster.empty() ? cm::kDefaultCluster : cluster;
    req.gpus = gpus;
    req.name = req.model.name + "-" + std::to_string(gpus) + "gpu";
    auto& t = req.training;
    if (app.count("--seq-len") > 0) {  // given, even as "" (an error, not the default)
      auto s = pl::parse_count(seq_len_text, true, "--seq-len");
      if (!s) return fail(s.error().message);
      if (*s > (1 << 24) || std::floor(*s) != *s) return fail("--seq-len: must be a whole number of tokens <= 16Mi");
      t.seq_len = static_cast<std::int64_t>(*s);
    }
    t.precision = precision == "fp32" ? cm::Precision::kFp32 : precision == "fp16" ? cm::Precision::kFp16
                : precision == "fp8" ? cm::Precision::kFp8 : cm::Precision::kBf16;
    t.optimizer = optimizer == "sgd" ? cm::OptimizerKind::kSgdMomentum : optimizer == "adafactor" ? cm::OptimizerKind::kAdafactor
                : optimizer == "adam8bit" ? cm::OptimizerKind::kAdam8bit : cm::OptimizerKind::kAdamW;
    t.mode = mode == "full" ? cm::TrainingMode::kFull : mode == "lora" ? cm::TrainingMode::kLora
           : mode == "qlora" ? cm::TrainingMode::kQlora : cm::TrainingMode::kPretrain;
    t.lora.rank = lora_rank;
    t.lora.base_format = base_format == "int8" ? cm::QuantFormat::kInt8 : cm::QuantFormat::kNf4;
    t.lora.targets.clear();
    if (lora_targets == "all-linear") lora_targets = "q,k,v,o,gate,up,down";
    for (std::size_t start = 0; start <= lora_targets.size();) {
      const std::size_t comma = std::min(lora_targets.find(',', start), lora_targets.size());
      const std::string target = lora_targets.substr(start, comma - start);
      static const std::vector<std::string> kTargets = {"q", "k", "v", "o", "gate", "up", "down"};
      if (std::find(kTargets.begin(), kTargets.end(), target) == kTargets.end()) {
        return fail("--lora-targets: \"" + target + "\" is not one of q, k, v, o, gate, up, down (or give all-linear)");
      }
      t.lora.targets.push_back(target);
      start = comma + 1;
    }
    t.dropout = dropout;
    t.attention = attention == "standard" ? cm::AttentionKernel::kStandard : cm::AttentionKernel::kFlash;
    t.attention_mask = attention_mask == "explicit" ? cm::AttentionMask::kExplicit : cm::AttentionMask::kCausal;
    if (loss != "stack") {
      const auto kernel = cm::loss_kernel_from_name(loss);
      if (!kernel) return fail("--loss: \"" + loss + "\" is not one of stack | " + cm::loss_kernel_choices());
      t.loss = *kernel;
    }
    if (fp8_recipe != "stack") t.fp8_recipe = cm::fp8_recipe_from_name(fp8_recipe);
    if (attention_kernel != "stack") t.attention_kernel = cm::attention_impl_from_name(attention_kernel);
    if (stack_choice) t.stack = *stack_choice;
    t.master_weights = !pure_16bit;
    t.fp8_all_gather = fp8_all_gather;
    t.allocator = *cm::allocator_from_name(allocator);
    req.parallel.reduce_dtype = cm::default_reduce_dtype(t);
    if (t.seq_len == 0) t.seq_len = req.model.max_seq_len;
    constexpr long long kMaxGlobalBatch = 1LL << 32;  // as in plan files
    if (app.count("--global-batch") > 0 && (global_batch <= 0 || global_batch > kMaxGlobalBatch)) {
      return fail("--global-batch: must be a whole number of sequences from 1 to 2^32 (got " + std::to_string(global_batch) + ")");
    }
    if (global_batch > 0 && app.count("--global-batch-tokens") > 0) return fail("--global-batch and --global-batch-tokens: give one, not both");
    if (global_batch > 0) t.global_batch = global_batch;
    if (app.count("--global-batch-tokens") > 0) {
      auto tokens = pl::parse_count(batch_tokens_text, true, "--global-batch-tokens");
      if (!tokens) return fail(tokens.error().message);
      const double sequences = std::round(*tokens / static_cast<double>(t.seq_len));
      if (sequences < 1) return fail("--global-batch-tokens: less than one sequence of " + std::to_string(t.seq_len) + " tokens");
      if (sequences > static_cast<double>(kMaxGlobalBatch)) return fail("--global-batch-tokens: more than 2^32 sequences of " + std::to_string(t.seq_len) + " tokens");
      t.global_batch = static_cast<std::int64_t>(sequences);
      if (std::fabs(sequences * static_cast<double>(t.seq_len) - *tokens) > 1e-3 * *tokens) {  // said, not silently changed
        ctx.batch_note = "--global-batch-tokens " + batch_tokens_text + " rounded to whole sequences";
      }
    }
    if (app.count("--train-tokens") > 0) {
      auto tokens = pl::parse_count(train_tokens_text, false, "--train-tokens");
      if (!tokens) return fail(tokens.error().message);
      if (*tokens > cm::kMaxTrainTokens) return fail("--train-tokens: at most 1e24 tokens, as in plan files (got " + train_tokens_text + ")");
      t.train_tokens = *tokens;
    } else {
      ctx.train_tokens_note = t.mode == cm::TrainingMode::kPretrain ? "20 per parameter or one step, the default; set --train-tokens" : "default; set --train-tokens";
    }
    cm::resolve_training_defaults(req.model, t);
    std::map<std::string, std::string> fixed_by;  // canonical key -> the --fix that set it
    for (const auto& f : fixes) {
      const std::string error = apply_fix(f, req.parallel);
      if (!error.empty()) return fail(error);
      const std::string key = canonical_fix_key(f.substr(0, f.find('=')));
      const auto [it, first] = fixed_by.emplace(key, f);
      if (!first && !same_fix(it->second, f)) return fail("--fix " + it->second + " and --fix " + f + " contradict each other: " + key + " can be fixed once");
    }
    if (const std::vector<std::string> conflicts = pl::constraint_conflicts(req, "--fix "); !conflicts.empty()) {
      std::string text;
      for (const auto& why : conflicts) text += (text.empty() ? "" : "; ") + why;
      return fail("no plan can satisfy the fixed values: " + text);
    }
    auto valid = cm::validate_request(req);
    if (!valid) return fail(valid.error().message);
  }

  if (app.got_subcommand("tune")) {
    auto chosen = pl::launcher_from_name(tune_launcher);
    tune_options.launcher = *chosen;
    for (const std::string& text : tune_extra) {
      auto words = pl::split_shell_words(text);
      if (!words) return fail("--extra " + words.error().message);
      tune_options.extra_args.insert(tune_options.extra_args.end(), words->begin(), words->end());
    }
    // mpirun runs on this machine's CPUs: without a profile of them, the tune measures one first.
    tune_options.measure_profile = tune_options.launcher == pl::Launcher::kMpirun && cluster.empty();
    return tune_plans(req, tune_options, executor_search);
  }

  pl::SearchOptions options;
  options.top = top;
  options.distinct_layouts = !all_variants;
  options.memory_headroom = ctx.memory_headroom;
  options.objective = objective == "cost" ? pl::Objective::kCost : objective == "time" ? pl::Objective::kTime : pl::Objective::kThroughput;
  const bool show_progress = !quiet && fmt == pl::Format::kText && isatty(fileno(stderr));
  if (show_progress) {
    options.progress = [](double f) { std::fprintf(stderr, "\rsearching... %3.0f%%", 100 * f); };
  }
  auto result = pl::search(req, options);
  if (show_progress) std::fprintf(stderr, "\r                \r");
  if (!result) return fail(result.error().message);

  if (!save_plan.empty() && !result->ranked.empty()) {
    std::string error;
    if (!write_file(save_plan, cm::plan_to_json(result->ranked.front().plan).dump(2) + "\n", error)) return fail(error);
    ctx.plan_path = save_plan;
  }
  std::cout << pl::render_search(req, *result, ctx, fmt);
  return result->ranked.empty() ? kExitNoFit : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int status = run(argc, argv);
  // What went to standard output (a report, an export, a trace redirected to a file) must have
  // reached it: a full disk or a closed pipe is an error, not a silent empty file.
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    std::cerr << "planner: error: writing to standard output failed (a full disk, or a closed output?)\n";
    return status == 0 ? kExitBadInput : status;
  }
  return status;
}
