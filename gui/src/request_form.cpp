#include "trainplan/gui/request_form.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/model.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/costmodel/stack.hpp"
#include "trainplan/planner/inputs.hpp"

namespace trainplan::gui {

namespace cm = trainplan::costmodel;

namespace {

const char* const kDocumentName = "edited";  // the file name document errors carry

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

// The text of a field as a JSON value: a number, true/false, or else the text as a string.
nlohmann::json typed_value(const std::string& text) {
  const std::string t = trim(text);
  auto v = cm::parse_json_text(t, kDocumentName);  // the one JSON reader (duplicate keys refused)
  if (v && (v->is_number() || v->is_boolean())) return *v;
  return t;
}

// Applies the edits to `doc`, then reads it with `parse`; errors are attached to `field`'s edits.
template <typename T, typename Parse>
std::optional<T> edited_document(const DocumentInput& input, cm::Result<nlohmann::json> base, const std::string& field,
                                 Parse parse, std::vector<FieldError>& errors) {
  if (!base) {
    errors.push_back({field, base.error().message});
    return std::nullopt;
  }
  nlohmann::json doc = std::move(base).value();
  for (const auto& [pointer, text] : input.edits) {
    if (trim(text).empty()) {
      errors.push_back({field + pointer, "is required"});
      continue;
    }
    try {
      doc[nlohmann::json::json_pointer(pointer)] = typed_value(text);
    } catch (const std::exception& e) {
      errors.push_back({field + pointer, std::string("cannot be set: ") + e.what()});
    }
  }
  if (!errors.empty()) return std::nullopt;
  cm::Result<T> parsed = parse(doc, kDocumentName);
  if (!parsed) {
    // "edited: /layers: must be ..." -> field "model/layers", message "must be ..."
    std::string message = parsed.error().message;
    const std::string prefix = std::string(kDocumentName) + ": ";
    if (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
    const std::string where = field_of_message(message, field, field);
    if (where != field) message.erase(0, message.find(": ") + 2);
    errors.push_back({where, message});
    return std::nullopt;
  }
  return std::move(parsed).value();
}

// A whole positive number typed into `field`, or an error.
std::optional<std::int64_t> whole_count(const std::string& text, bool binary, const std::string& field, std::int64_t max,
                                        std::vector<FieldError>& errors) {
  auto value = planner::parse_count(trim(text), binary, field);
  if (!value) {
    std::string message = value.error().message;
    message.erase(0, field.size() + 2);  // "gpus: " is said by the field itself
    errors.push_back({field, message});
    return std::nullopt;
  }
  if (*value != std::floor(*value) || *value > static_cast<double>(max)) {
    errors.push_back({field, "must be a whole number <= " + std::to_string(max) + " (got \"" + trim(text) + "\")"});
    return std::nullopt;
  }
  return static_cast<std::int64_t>(*value);
}

}  // namespace

cm::Result<nlohmann::json> model_document(const DocumentInput& input) {
  if (input.document) return *input.document;
  auto model = cm::find_model(input.ref);
  if (!model) return model.error();
  return cm::model_to_json(*model);
}

cm::Result<nlohmann::json> cluster_document(const DocumentInput& input) {
  if (input.document) return *input.document;
  auto cluster = cm::find_hwprofile(input.ref);
  if (!cluster) return cluster.error();
  return cm::hwprofile_to_json(*cluster);
}

std::string field_of_message(const std::string& message, const std::string& document_field, const std::string& fallback) {
  // A pointer starts the message or follows "file: ".
  std::size_t start = message.rfind('/', 0) == 0 ? 0 : message.find(": /");
  if (start == std::string::npos) return fallback;
  if (start != 0) start += 2;
  const std::size_t end = message.find(": ", start);
  if (end == std::string::npos) return fallback;
  const std::string pointer = message.substr(start, end - start);
  if (!document_field.empty()) return document_field + pointer;
  static const std::map<std::string, std::string> kRequestFields = {
      {"/parallel", "fix"},
      {"/parallel/tp", "fix/tp"},
      {"/parallel/pp", "fix/pp"},
      {"/parallel/dp", "fix/dp"},
      {"/parallel/cp", "fix/cp"},
      {"/parallel/ep", "fix/ep"},
      {"/parallel/zero_stage", "fix/zero"},
      {"/parallel/shard_group", "fix/shard_group"},
      {"/parallel/micro_batch", "fix/mb"},
      {"/parallel/virtual_stages", "fix/v"},
      {"/parallel/schedule", "fix/schedule"},
      {"/parallel/recompute", "fix/recompute"},
      {"/parallel/recompute_layers", "fix/recompute"},
      {"/parallel/offload_optimizer", "fix/offload"},
      {"/training/seq_len", "seq_len"},
      {"/training/global_batch", "global_batch"},
      {"/training/precision", "precision"},
      {"/training/train_tokens", "train_tokens"},
      {"/training/master_weights", "master_weights"},
      {"/training/allocator", "allocator"},
      {"/training/attention_mask", "attention_mask"},
      {"/training/fp8_recipe", "fp8_recipe"},
      {"/training/fp8_all_gather", "fp8_all_gather"},
      {"/training/attention_kernel", "attention_kernel"},
      {"/parallel/first_stage_layers", "fix/first_stage_layers"},
      {"/parallel/last_stage_layers", "fix/last_stage_layers"},
      {"/gpus", "gpus"},
  };
  const auto it = kRequestFields.find(pointer);
  return it == kRequestFields.end() ? fallback : it->second;
}

BuiltRequest build_request(const RequestForm& form) {
  BuiltRequest built;
  auto& errors = built.errors;
  cm::PlanRequest req;

  auto model = edited_document<cm::ModelSpec>(form.model, model_document(form.model), "model",
                                              [](const nlohmann::json& j, const std::string& f) { return cm::parse_model(j, f); },
                                              errors);
  std::vector<FieldError> cluster_errors;
  auto cluster = edited_document<cm::HardwareProfile>(
      form.cluster, cluster_document(form.cluster), "cluster",
      [](const nlohmann::json& j, const std::string& f) { return cm::parse_hwprofile(j, f); }, cluster_errors);
  errors.insert(errors.end(), cluster_errors.begin(), cluster_errors.end());

  const auto gpus = whole_count(form.gpus, false, "gpus", 1 << 24, errors);

  auto& t = req.training;
  if (!trim(form.seq_len).empty()) {
    if (auto s = whole_count(form.seq_len, true, "seq_len", 1 << 24, errors)) t.seq_len = *s;
  } else if (model) {
    t.seq_len = model->max_seq_len;
  }
  const auto enum_field = [&](const std::string& field, const std::string& value, const std::vector<std::string>& allowed) {
    for (const auto& a : allowed) {
      if (a == value) return true;
    }
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    errors.push_back({field, "must be one of " + list + " (got \"" + value + "\")"});
    return false;
  };
  if (enum_field("precision", form.precision, {"fp32", "bf16", "fp16", "fp8"})) {
    t.precision = form.precision == "fp32" ? cm::Precision::kFp32 : form.precision == "fp16" ? cm::Precision::kFp16
                : form.precision == "fp8" ? cm::Precision::kFp8 : cm::Precision::kBf16;
  }
  if (enum_field("optimizer", form.optimizer, {"adamw", "sgd", "adafactor", "adam8bit"})) {
    t.optimizer = form.optimizer == "sgd" ? cm::OptimizerKind::kSgdMomentum : form.optimizer == "adafactor" ? cm::OptimizerKind::kAdafactor
                : form.optimizer == "adam8bit" ? cm::OptimizerKind::kAdam8bit : cm::OptimizerKind::kAdamW;
  }
  if (enum_field("mode", form.mode, {"pretrain", "full", "lora", "qlora"})) {
    t.mode = form.mode == "full" ? cm::TrainingMode::kFull : form.mode == "lora" ? cm::TrainingMode::kLora
           : form.mode == "qlora" ? cm::TrainingMode::kQlora : cm::TrainingMode::kPretrain;
  }
  if (auto rank = whole_count(form.lora_rank, false, "lora_rank", 65536, errors)) t.lora.rank = static_cast<int>(*rank);
  if (enum_field("attention", form.attention, {"flash", "standard"})) {
    t.attention = form.attention == "standard" ? cm::AttentionKernel::kStandard : cm::AttentionKernel::kFlash;
  }
  if (enum_field("dropout", form.dropout, {"off", "on"})) t.dropout = form.dropout == "on";
  if (enum_field("attention_mask", form.attention_mask, {"causal", "explicit"})) {
    t.attention_mask = form.attention_mask == "explicit" ? cm::AttentionMask::kExplicit : cm::AttentionMask::kCausal;
  }
  if (form.loss != "stack") {
    if (const auto loss = cm::loss_kernel_from_name(form.loss)) t.loss = *loss;
    else errors.push_back({"loss", std::string("must be stack | ") + cm::loss_kernel_choices() + " (got \"" + form.loss + "\")"});
  }
  if (enum_field("attention_kernel", form.attention_kernel, {"stack", "profile", "flash2", "flash3"}) && form.attention_kernel != "stack") {
    t.attention_kernel = cm::attention_impl_from_name(form.attention_kernel);
  }
  if (enum_field("fp8_recipe", form.fp8_recipe, {"stack", "delayed", "current"}) && form.fp8_recipe != "stack") {
    t.fp8_recipe = cm::fp8_recipe_from_name(form.fp8_recipe);
  }
  if (enum_field("fp8_all_gather", form.fp8_all_gather, {"off", "on"})) t.fp8_all_gather = form.fp8_all_gather == "on";
  if (enum_field("master_weights", form.master_weights, {"fp32", "none"})) t.master_weights = form.master_weights == "fp32";
  if (enum_field("allocator", form.allocator, {"caching", "expandable-segments"})) t.allocator = *cm::allocator_from_name(form.allocator);
  if (enum_field("stack", form.stack,
                 {"trainplan", "trainplan-reference", "pytorch-eager", "torch-compile", "megatron-te", "fsdp1", "composer", "fsdp2", "fsdp2-compile", "deepspeed",
                  "deepspeed-v0.3", "hf-ddp", "hf-fsdp2"})) {
    t.stack = *cm::stack_from_name(form.stack);
  }
  req.parallel.reduce_dtype = cm::default_reduce_dtype(t);  // as `planner --stack` and `--pure-16bit`
  if (!trim(form.memory_headroom).empty()) {
    char* end = nullptr;
    const std::string text = trim(form.memory_headroom);
    const double percent = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0' || !(percent >= 0 && percent <= 50)) {
      errors.push_back({"memory_headroom", "must be a percentage from 0 to 50"});
    } else {
      built.memory_headroom = percent / 100.0;
    }
  }
  if (!trim(form.global_batch).empty()) {
    if (form.batch_unit == BatchUnit::kSequences) {
      if (auto b = whole_count(form.global_batch, false, "global_batch", std::int64_t{1} << 40, errors)) t.global_batch = *b;
    } else if (auto tokens = planner::parse_count(trim(form.global_batch), true, "global_batch"); !tokens) {
      errors.push_back({"global_batch", tokens.error().message.substr(std::string("global_batch: ").size())});
    } else if (t.seq_len > 0) {
      const double sequences = std::round(*tokens / static_cast<double>(t.seq_len));
      if (sequences < 1) errors.push_back({"global_batch", "less than one sequence of " + std::to_string(t.seq_len) + " tokens"});
      else t.global_batch = static_cast<std::int64_t>(sequences);
    }
  }
  if (!trim(form.train_tokens).empty()) {
    auto tokens = planner::parse_count(trim(form.train_tokens), false, "train_tokens");
    if (!tokens) errors.push_back({"train_tokens", tokens.error().message.substr(std::string("train_tokens: ").size())});
    else if (*tokens > cm::kMaxTrainTokens) errors.push_back({"train_tokens", "at most 1e24 tokens, as in plan files"});
    else t.train_tokens = *tokens;
  }

  for (const auto& [key, value] : form.fixed) {
    const std::string v = trim(value);
    if (v.empty() || v == "auto") continue;
    auto applied = planner::apply_constraint(key, v, req.parallel);
    if (!applied) {
      std::string message = applied.error().message;
      if (message.rfind(key + " ", 0) == 0) message.erase(0, key.size() + 1);
      errors.push_back({"fix/" + key, message});
    }
  }

  if (!errors.empty() || !model || !cluster || !gpus) return built;
  req.model = std::move(*model);
  req.cluster = std::move(*cluster);
  // A loaded document, or a preset changed in its fields, is no preset: plans carry the document.
  req.model_ref = form.model.document ? "inline" : cm::resolve_model_alias(form.model.ref);
  req.cluster_ref = form.cluster.document ? "inline" : form.cluster.ref;
  if (!form.model.edits.empty() && cm::model_to_json(req.model) != model_document(DocumentInput{form.model.ref, form.model.document, {}}).value()) {
    req.model_ref = "inline";
  }
  if (!form.cluster.edits.empty() &&
      cm::hwprofile_to_json(req.cluster) != cluster_document(DocumentInput{form.cluster.ref, form.cluster.document, {}}).value()) {
    req.cluster_ref = "inline";
  }
  req.gpus = static_cast<int>(*gpus);
  req.name = req.model.name + "-" + std::to_string(req.gpus) + "gpu";
  cm::resolve_training_defaults(req.model, req.training);
  auto valid = cm::validate_request(req);
  if (!valid) {
    const std::string field = field_of_message(valid.error().message, "", "fix");
    std::string message = valid.error().message;
    if (message.rfind('/', 0) == 0) message.erase(0, message.find(": ") + 2);
    errors.push_back({field, message});
    return built;
  }
  built.request = std::move(req);
  return built;
}

}  // namespace trainplan::gui
