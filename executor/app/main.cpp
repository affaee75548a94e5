// executor: runs one rank of a training plan (see trainplan/executor/executor.hpp).
//   mpirun -n 4 executor --plan plan.json --steps 50                 # CPU ranks over MPI
//   torchrun --nproc-per-node 8 --no-python executor --plan plan.json # GPU ranks over NCCL
// Exit codes: 0 success, 2 bad input (plan, data, checkpoint), 3 the run failed.

#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "trainplan/executor/executor.hpp"

int main(int argc, char** argv) {
  trainplan::executor::RunOptions o;
  CLI::App app{"executor: trains a trainplan plan for real and measures memory and speed"};
  app.add_option("--plan", o.plan_path, "plan document (trainplan/plan/v1), e.g. from planner --save-plan")->required();
  app.add_option("--steps", o.steps, "optimizer steps to reach, resumed ones included")->capture_default_str();
  app.add_option("--device", o.device, "auto, cpu or cuda")->capture_default_str();
  app.add_option("--data", o.data, "\"synthetic\" or a flat token file")->capture_default_str();
  app.add_option("--data-dtype", o.data_dtype, "token file element type: uint16 or uint32")->capture_default_str();
  app.add_option("--seed", o.seed, "initialisation and synthetic-data seed")->capture_default_str();
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
  app.add_option("--measurement", o.measurement_path, "write the trainplan/measurement/v1 document here");
  app.add_option("--stop-after", o.stop_after, "stop (and checkpoint) after this many steps of this run")->capture_default_str();
  app.add_option("--timeout", o.timeout_seconds, "seconds a collective may wait before the run fails")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads per rank (0: cores / local ranks)")->capture_default_str();
  app.add_option("--fail-at-step", o.fail_at_step, "fault injection: kill --fail-rank at this step");
  app.add_option("--fail-rank", o.fail_rank, "rank killed by --fail-at-step")->capture_default_str();
  app.add_flag("--quiet", o.quiet, "no per-step lines");
  app.add_option("--trace-step", o.trace_step, "step recorded in the measurement's trace (0: the last)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  std::string command = "executor";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  return trainplan::executor::run_executor(o, command);
}
