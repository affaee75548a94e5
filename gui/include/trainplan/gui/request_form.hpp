#pragma once
// RequestForm: the planning inputs as typed into the GUI (text, so that any value can be typed
// and judged), and build_request, which turns them into a costmodel::PlanRequest or into errors
// attached to the fields that caused them. No Qt here: the rules are the costmodel's (documents
// are re-read with parse_model / parse_hwprofile, constraints checked with validate_request) and
// the planner's (planner::parse_count, planner::apply_constraint), as on the command line.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/planner/inputs.hpp"

namespace trainplan::gui {

// A model or cluster: a preset (name or alias) or a document loaded from a file, plus values
// typed into its fields, keyed by JSON pointer ("/layers", "/gpu/hbm_capacity_gib").
struct DocumentInput {
  std::string ref;                         // preset name or alias; the file path when `document` is set
  std::optional<nlohmann::json> document;  // a loaded document (already parsed once)
  std::map<std::string, std::string> edits;  // pointer -> text; the text is read as JSON, else as a string
};

enum class BatchUnit { kSequences, kTokens };

struct RequestForm {
  DocumentInput model{"llama3-70b", std::nullopt, {}};
  DocumentInput cluster{"dgx-h100", std::nullopt, {}};
  std::string gpus = "64";
  std::string seq_len;       // empty: the model's context length
  std::string global_batch;  // empty: the default (4 Mi tokens when pretraining)
  BatchUnit batch_unit = BatchUnit::kSequences;  // tokens: K/M/G are binary ("4M" = 4 * 2^20)
  std::string train_tokens;  // empty: the default (20 per parameter when pretraining); K/M/B/T decimal
  std::string precision = "bf16";   // fp32 | bf16 | fp16 | fp8
  std::string optimizer = "adamw";  // adamw | sgd | adafactor | adam8bit
  std::string mode = "pretrain";    // pretrain | full | lora | qlora
  std::string lora_rank = "16";     // LoRA/QLoRA adapter rank, 1 .. 65536 (read in every mode)
  std::string attention = "flash";  // flash | standard (materialised scores)
  std::string dropout = "off";      // on | off: the model has dropout layers
  std::string attention_mask = "causal";  // causal | explicit (plan.hpp AttentionMask)
  std::string loss = "stack";              // stack | fp32-logits | fused | chunked-linear | vocab-parallel-fp32
  std::string attention_kernel = "stack";  // stack | profile | flash2 | flash3 (kernels.hpp AttentionImpl)
  std::string fp8_recipe = "stack";        // stack | delayed | current (stack.hpp Fp8Recipe)
  std::string fp8_all_gather = "off";      // on | off: FSDP2 gathers fp8 weights (plan.hpp TrainingConfig::fp8_all_gather)
  std::string master_weights = "fp32";    // fp32 | none (pure 16-bit training)
  std::string allocator = "caching";      // caching | expandable-segments (plan.hpp Allocator)
  std::string stack = "trainplan";  // trainplan | trainplan-reference | pytorch-eager | torch-compile | megatron-te
  std::string memory_headroom;      // percent of HBM kept free; empty: costmodel::kDefaultMemoryHeadroom
  // Fixed parallel settings, by planner::apply_constraint key (tp, pp, dp, cp, ep, zero, mb, v,
  // sp, schedule, recompute, offload); "" or "auto" leaves one to the search.
  std::map<std::string, std::string> fixed;
};

// An input that is wrong, and why. `field` names it: "model", "cluster", "model/layers" (a
// document field: the document and its pointer), "gpus", "seq_len", "global_batch",
// "train_tokens", "precision", "lora_rank", "attention", "dropout", "attention_mask", "loss", "attention_kernel", "fp8_recipe",
// "fp8_all_gather", "master_weights", "allocator", "stack", "memory_headroom",
// "fix/tp" (a constraint), "fix"
// (the constraints together).
struct FieldError {
  std::string field;
  std::string message;
};

struct BuiltRequest {
  std::optional<costmodel::PlanRequest> request;  // set when `errors` is empty
  std::vector<FieldError> errors;                 // every wrong field, in form order
  double memory_headroom = costmodel::kDefaultMemoryHeadroom;  // fraction of HBM (planner::SearchOptions)
};

// Reads the form. Never throws; every problem is a FieldError.
[[nodiscard]] BuiltRequest build_request(const RequestForm& form);

// The base document of a model or cluster input (the preset's or the loaded one) before edits,
// or the error naming the unknown preset.
[[nodiscard]] costmodel::Result<nlohmann::json> model_document(const DocumentInput& input);
[[nodiscard]] costmodel::Result<nlohmann::json> cluster_document(const DocumentInput& input);

// The planner command line that searches the same request (planner/inputs.hpp).
using planner::planner_command;

// The field an error message of a document or request belongs to: the JSON pointer in
// "file: /gpu/hbm_capacity_gib: must be > 0" or "/parallel/tp: ..." mapped to a field name
// ("cluster/gpu/hbm_capacity_gib", "fix/tp"); `fallback` when the message names no pointer.
[[nodiscard]] std::string field_of_message(const std::string& message, const std::string& document_field,
                                           const std::string& fallback);

}  // namespace trainplan::gui
