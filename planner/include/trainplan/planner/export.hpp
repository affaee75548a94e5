#pragma once
// Exporting a fixed plan to another training stack: the files Megatron-LM, torchtitan, DeepSpeed,
// Hugging Face Accelerate and LitGPT read to run it (`planner export PLAN --to TARGET`), or the reasons a
// stack cannot express the plan. The texts are returned, not written.

#include <string>
#include <vector>

#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/result.hpp"

namespace trainplan::planner {

enum class ExportTarget { kMegatron, kTorchtitan, kDeepspeed, kAccelerate, kLitgpt };

// Every target, in the order the CLI and the GUI list them.
[[nodiscard]] const std::vector<ExportTarget>& export_targets();
// "megatron", "torchtitan", "deepspeed", "accelerate", "litgpt": the names `--to` takes.
[[nodiscard]] const char* export_target_name(ExportTarget target);
// The target a name stands for; the error lists the names.
[[nodiscard]] costmodel::Result<ExportTarget> parse_export_target(const std::string& name);

struct PlanExport {
  std::string text;       // the file's contents
  std::string file_name;  // a suggested name: "<plan>-megatron.sh", "-torchtitan.toml", "-deepspeed.json", "-accelerate.yaml"
  // What the file leaves to the training script or to the user, one line each (the DeepSpeed
  // JSON cannot carry comments); the other targets write these as comments in the file as well.
  std::vector<std::string> notes;
};

// The software stack that runs the target's file (megatron: megatron-te, torchtitan: fsdp2,
// deepspeed: deepspeed, accelerate: where the plan shards, fsdp1 for a plan on the fsdp1 or composer stack
// (fsdp_version 1) and fsdp2 for any other (fsdp_version 2), else pytorch-eager; litgpt: fsdp1 for pretrain and finetune_full, fsdp2 for finetune_lora, on one
// GPU pytorch-eager), whose prediction the export states.
[[nodiscard]] costmodel::Stack export_stack(const costmodel::Plan& plan, ExportTarget target);

// The target's file for `plan`, its first note (and first comment line, where the format has
// comments) the prediction for export_stack's stack. REQUIRES: validate_plan(plan) holds. An error when the target
// cannot express the plan: every reason, "; "-separated, each naming the plan field and the stack,
// e.g. "deepspeed: pp=4: DeepSpeed's pipeline engine needs a PipelineModule in the training
// script; a JSON config cannot express it"; or when the GPUs are not a whole number of nodes.
[[nodiscard]] costmodel::Result<PlanExport> export_plan(const costmodel::Plan& plan, ExportTarget target);

}  // namespace trainplan::planner
