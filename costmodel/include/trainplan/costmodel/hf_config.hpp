#pragma once
// Models from Hugging Face `config.json` files: the families Llama, Mistral, Mixtral, Qwen2,
// Qwen3, Qwen2-MoE, Qwen3-MoE, Gemma, GPT-2, GPT-NeoX, Falcon, Phi-3 and DeepSeek-V2/V3, read
// into a ModelSpec. `model_type` decides the family and so which keys are read.
//
// Keys that size the model (hidden size, layers, heads, intermediate size, vocabulary) are
// required even where transformers' config class has a default: a config without them is not
// the model its reader thinks. Keys that choose a behaviour (kv heads, tied embeddings, max
// positions, head_dim, biases, sliding window, expert counts, MLA ranks) take the default of the
// family's transformers configuration class (transformers 4.53, configuration_<family>.py;
// DeepSeek-V2 from DeepSeek's configuration_deepseek.py) when absent. Keys this planner has no use
// for are ignored: configs carry dozens (token ids, rope scaling, dropout, dtype).

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "trainplan/costmodel/model.hpp"
#include "trainplan/costmodel/result.hpp"

namespace trainplan::costmodel {

// The model_type values parse_hf_config reads, comma-separated, for messages and help texts.
[[nodiscard]] const char* hf_model_types();

// True for a JSON object with no `schema` and `model_type`, `architectures` or
// `num_hidden_layers`: a Hugging Face config (one without model_type is refused for that), not a
// trainplan document.
[[nodiscard]] bool is_hf_config(const nlohmann::json& json);

// Reads a Hugging Face config.json. `file` names the source in error messages and the model:
// its name is the file's stem, or the folder's name for a file called config.json. Errors are one
// line naming the file, the key's JSON pointer and the model_type
// ("config.json: /hidden_size: is required (model_type llama)").
[[nodiscard]] Result<ModelSpec> parse_hf_config(const nlohmann::json& json, const std::string& file);

// Parses text as JSON and reads it as a Hugging Face config (is_hf_config) or a
// `trainplan/model/v1` document.
[[nodiscard]] Result<ModelSpec> parse_model_or_hf_config_text(const std::string& text, const std::string& file);

}  // namespace trainplan::costmodel
