#pragma once
// Internal to planner/src/export*.cpp: the numbers every export derives from a plan, and each
// stack's refusals (plan fields it cannot express, one reason each) and writer.

#include <string>
#include <vector>

#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/result.hpp"
#include "trainplan/planner/export.hpp"

namespace trainplan::planner::export_detail {

struct Derived {
  int nodes = 0;               // gpus / GPUs per node
  int per_node = 0;            // GPUs (ranks) per node: the cluster's, or all GPUs when fewer
  long long micro_batches = 0; // per step and replica: global_batch / (dp * micro_batch)
  long long steps = 0;         // optimizer steps: train_tokens / (global_batch * seq_len), rounded up
  std::string nodes_text;      // "64 GPUs = 8 nodes x 8"
  // The variables a launch sets for the plan's allocator (training.allocator), "NAME=value NAME=value":
  // PYTORCH_ALLOC_CONF, which PyTorch reads from 2.9 on, and PYTORCH_CUDA_ALLOC_CONF, which
  // earlier releases read (c10/core/AllocatorConfig.cpp); empty for PyTorch's default allocator.
  std::string env;
  // `env` and a space before a command on its launch line; empty with `env`.
  [[nodiscard]] std::string launch_prefix() const { return env.empty() ? env : env + " "; }
};

[[nodiscard]] costmodel::Result<Derived> derive(const costmodel::Plan& plan);
[[nodiscard]] std::string tokens_text(double tokens);  // "1e+12"
[[nodiscard]] std::string lora_note(const costmodel::Plan& plan);
[[nodiscard]] std::string refusal_error(ExportTarget target, const std::vector<std::string>& reasons);

// `text` double-quoted with backslash and quote escaped and control characters as \uXXXX: a
// TOML basic string (TOML 1.0), a YAML double-quoted scalar (YAML 1.2 §7.3.1) and a Python
// string literal alike, each reading back as `text` and nothing else.
[[nodiscard]] std::string double_quoted(const std::string& text);

// The model features beyond its architecture's GPT or Llama block that a stack writing the model's
// shape does not express, one reason each ("model: mla: ..."). `head_size`, `qkv_bias`: whether
// the stack has an option for an explicit head size and for biases on Q, K and V alone.
[[nodiscard]] std::vector<std::string> model_shape_refusals(const costmodel::ModelSpec& model, const char* stack, bool head_size,
                                                            bool qkv_bias);

// PyTorch's context parallelism (torchtitan, Accelerate FSDP2) as the plan was priced: true for
// the ring (rotate method "alltoall"), false for its default "allgather" (the fsdp2 stack's).
[[nodiscard]] bool pytorch_cp_ring(const costmodel::ParallelConfig& p);
// The refusal of Megatron's all-gather with reduce-scattered gradients, which PyTorch has not; empty
// when the plan does not ask for it. `stack`: "torchtitan", "Accelerate".
[[nodiscard]] std::vector<std::string> pytorch_cp_refusals(const costmodel::ParallelConfig& p, const char* stack);

// REQUIRES (writers): the refusals are empty.
[[nodiscard]] std::vector<std::string> megatron_refusals(const costmodel::Plan& plan);
[[nodiscard]] PlanExport megatron_export(const costmodel::Plan& plan, const Derived& d);
[[nodiscard]] std::vector<std::string> torchtitan_refusals(const costmodel::Plan& plan);
[[nodiscard]] PlanExport torchtitan_export(const costmodel::Plan& plan, const Derived& d);
[[nodiscard]] std::vector<std::string> deepspeed_refusals(const costmodel::Plan& plan);
[[nodiscard]] PlanExport deepspeed_export(const costmodel::Plan& plan, const Derived& d);
[[nodiscard]] std::vector<std::string> accelerate_refusals(const costmodel::Plan& plan);
[[nodiscard]] PlanExport accelerate_export(const costmodel::Plan& plan, const Derived& d);
[[nodiscard]] std::vector<std::string> litgpt_refusals(const costmodel::Plan& plan);
[[nodiscard]] PlanExport litgpt_export(const costmodel::Plan& plan, const Derived& d);

}  // namespace trainplan::planner::export_detail
