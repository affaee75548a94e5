#pragma once
// What the executor and the planner both say about a plan, in a small library without LibTorch
// (it builds wherever the planner builds; the executor and the planner link it, the executor does
// not link the planner): which plans the executor cannot run yet, and the planner command line
// that plans a request again (the executor prints it when a plan runs out of memory).

#include <string>
#include <vector>

#include "trainplan/costmodel/estimate.hpp"  // kDefaultMemoryHeadroom
#include "trainplan/costmodel/plan.hpp"

namespace trainplan::executor {

// What keeps the executor from running `plan`, one reason each (empty: it runs it): parallelisms,
// models, modes and options it does not have yet, and shapes its tensor and context parallelism
// need; the same on CPU and GPU ranks. The executor refuses such plans with these reasons; launch
// texts and reports print them.
[[nodiscard]] std::vector<std::string> executor_limitations(const costmodel::Plan& plan);

// The planner command line that searches the same request with the same objective, e.g.
// "planner --model llama3-70b --gpus 64 --cluster dgx-h100 --seq-len 8192 --global-batch 512
// --train-tokens 1.4e+12 --precision bf16 --optimizer adamw --mode pretrain --objective throughput
// --fix tp=8". A model or cluster that is no preset is given as MODEL.json / CLUSTER.json (export
// it from the plan JSON).
[[nodiscard]] std::string planner_command(const costmodel::PlanRequest& request, const std::string& objective,
                                          double memory_headroom = costmodel::kDefaultMemoryHeadroom);

}  // namespace trainplan::executor
