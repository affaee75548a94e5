// executor: runs one rank of a training plan, or profiles this machine's device (see
// trainplan/executor/executor.hpp).
//   mpirun -n 4 executor --plan plan.json --steps 50                 # CPU ranks over MPI
//   torchrun --nproc-per-node 8 --no-python executor --plan plan.json # GPU ranks over NCCL
//   executor --profile cpu.json --device cpu                          # microbenchmarks -> hwprofile
//   mpirun -n 2 executor --profile cpu2.json --device cpu             # ... and collectives
// Exit codes: 0 success, 2 bad input (plan, data, checkpoint), 3 the run failed.

#include <iostream>
#include <stdexcept>
#include <set>
#include <string>

#include <CLI/CLI.hpp>

#include "trainplan/executor/executor.hpp"

int main(int argc, char** argv) {
  trainplan::executor::RunOptions o;
  CLI::App app{"executor: trains a trainplan plan for real and measures memory and speed"};
  trainplan::executor::ProfileOptions profile;
  CLI::Option* plan_option = app.add_option("--plan", o.plan_path, "plan document (trainplan/plan/v1), e.g. from planner --save-plan");
  CLI::Option* profile_option =
      app.add_option("--profile", profile.out_path, "instead of training: measure this device's kernels (and collectives on several ranks) "
                                                    "and write a trainplan/hwprofile/v1 document here");
  plan_option->excludes(profile_option);
  app.add_option("--base", profile.base, "--profile: cluster preset or hwprofile file for what is not measured")->capture_default_str();
  app.add_option("--name", profile.name, "--profile: name of the new profile (default measured-<device>)");
  app.add_option("--command", profile.command, "--profile: the command recorded in the profile's source (default this one)");
  app.add_flag("--quick", profile.quick, "--profile: fewer shapes and repeats");
  app.add_option("--steps", o.steps, "optimizer steps to reach, resumed ones included")->capture_default_str();
  app.add_option("--device", o.device, "auto, cpu or cuda")->capture_default_str();
  app.add_option("--data", o.data, "\"synthetic\", a flat token file, or instruction examples (*.jsonl or *.json: prompt/response, the loss on the response)")
      ->capture_default_str();
  app.add_option("--vocab", o.vocab, "instruction data: a vocabulary (JSON piece -> id, or a tokenizer.json); default: byte-level tokens");
  app.add_option("--data-dtype", o.data_dtype, "token file element type: uint16 or uint32")->capture_default_str();
  app.add_option("--seed", o.seed, "initialisation and synthetic-data seed")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {  // CLI11 wraps "-1" round to 2^64 - 1 and clamps past it
            const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
            try {
              if (digits) (void)std::stoull(text);
            } catch (const std::out_of_range&) {
              return "must be a whole number from 0 to 18446744073709551615 (got " + text + ")";
            }
            return digits ? std::string() : "must be a whole number from 0 to 18446744073709551615 (got " + text + ")";
          },
          "UINT64"))
      ->capture_default_str();
  app.add_option("--lr", o.lr, "peak learning rate")->capture_default_str();
  app.add_option("--min-lr-ratio", o.min_lr_ratio, "cosine floor as a fraction of --lr")->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps, "linear warmup steps (-1: steps/10)")->capture_default_str();
  app.add_option("--decay-steps", o.decay_steps, "end of the cosine decay (0: --steps)")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay")->capture_default_str();
  app.add_option("--clip-grad", o.clip_grad, "global gradient-norm clip (0: off)")->capture_default_str();
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "write sharded checkpoints here");
  app.add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints (0: at the end only)")->capture_default_str();
  app.add_option("--resume", o.resume, "continue from the newest complete checkpoint in this directory");
  app.add_option("--export", o.export_dir, "write model.safetensors + config.json here at the end");
  app.add_option("--export-format", o.export_format, "trainplan (the executor's names and model document) or hf (transformers' Llama layout)")
      ->capture_default_str();
  app.add_option("--export-lora", o.export_lora, "LoRA runs: merged (base + adapters), adapters (PEFT's adapter_model.safetensors) or both")
      ->capture_default_str();
  app.add_option("--init-from", o.init_from, "start from this Hugging Face Llama checkpoint (config.json and *.safetensors, sharded or not)");
  app.add_option("--measurement", o.measurement_path, "write the trainplan/measurement/v1 document here");
  app.add_option("--stop-after", o.stop_after, "stop (and checkpoint) after this many steps of this run")->capture_default_str();
  app.add_option("--timeout", o.timeout_seconds, "seconds a collective may wait before the run fails")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads per rank (0: cores / local ranks)")->capture_default_str();
  app.add_option("--fail-at-step", o.fail_at_step, "fault injection: kill --fail-rank at this step");
  app.add_option("--fail-rank", o.fail_rank, "rank killed by --fail-at-step")->capture_default_str();
  // Hidden (no group): out-of-memory fault injection for tests.
  app.add_option("--inject-oom", o.inject_oom, "fault injection: PHASE[:MICRO_BATCH[:STEP]] fails an allocation")->group("");
  app.add_option("--inject-oom-rank", o.inject_oom_rank, "rank of --inject-oom (-1: all)")->group("");
  app.add_flag("--quiet", o.quiet, "no per-step lines");
  app.add_option("--kernels", o.kernels, "fused (fused paths and fused AdamW) or reference (plain ATen, to check them against)")
      ->check(CLI::IsMember({"fused", "reference"}))
      ->capture_default_str();
  app.add_option("--kernel-profile", o.kernel_profile, "GPU only: write the kernels of --trace-step's step, ranked by device time, as CSV");
  app.add_option("--trace-step", o.trace_step, "step recorded in the measurement's trace (0: the last)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  std::string command = "executor";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  const std::set<std::string> profile_flags = {"--profile", "--device", "--base", "--name", "--command", "--quick", "--threads", "--timeout"};
  if (profile_option->count() > 0) {
    for (const CLI::Option* option : app.get_options()) {
      const std::string flag = option->get_name();
      if (option->count() > 0 && profile_flags.count(flag) == 0) {
        trainplan::executor::print_rank_message("executor: error: " + flag + " is an option of training (--plan), not of --profile");
        return 2;
      }
    }
    profile.device = o.device;
    profile.threads = o.threads;
    profile.timeout_seconds = o.timeout_seconds;
    return trainplan::executor::run_profile(profile, command);
  }
  if (plan_option->count() == 0) {
    trainplan::executor::print_rank_message("executor: error: give --plan PLAN to train, or --profile OUT.json to profile this device (--help lists the options)");
    return 2;
  }
  for (const char* flag : {"--base", "--name", "--command", "--quick"}) {
    if (app.get_option(flag)->count() > 0) {
      trainplan::executor::print_rank_message(std::string("executor: error: ") + flag + " goes with --profile, not with --plan");
      return 2;
    }
  }
  return trainplan::executor::run_executor(o, command);
}
