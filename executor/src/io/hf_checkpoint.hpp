#pragma once
// Hugging Face checkpoints in and out: the safetensors format (an 8-byte little-endian header
// length, a JSON header naming each tensor's dtype, shape and byte range, then the data), the
// Llama layout's tensor names (transformers' LlamaForCausalLM, PEFT's LoRA adapters) and
// config.json. Import reads one tensor at a time and keeps only this rank's pieces, so no rank
// holds the whole model; export gathers on rank 0 (checkpoint.hpp export_safetensors).

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "engine.hpp"
#include "trainplan/costmodel/model.hpp"
#include "trainplan/costmodel/plan.hpp"

namespace trainplan::executor {

// A checkpoint that cannot be imported: the message names the file and the tensor or key.
struct ImportError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One safetensors file, its header read and checked on opening (every range inside the file,
// of its dtype and shape's size); tensors are read when asked for.
class SafetensorsFile {
 public:
  struct Entry {
    std::string dtype;  // "F32", "BF16", "F16", ...
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // bytes from the start of the data
  };
  // Throws ImportError for a missing, truncated or malformed file.
  explicit SafetensorsFile(std::string path);
  [[nodiscard]] const std::map<std::string, Entry>& entries() const { return entries_; }
  [[nodiscard]] const std::string& path() const { return path_; }
  // Tensor `name` as float32 on the CPU (F32, BF16 and F16 are read; another dtype throws
  // ImportError naming it).
  [[nodiscard]] at::Tensor read(const std::string& name) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
};

// A safetensors file written as its tensors come (rank 0's exports stream through it): the header
// from every entry's name, dtype (float32, bfloat16, float16 or int64) and shape first, then
// write() each tensor in that order, converted to its entry's dtype; finish() fsyncs and renames
// the temporary file into place, so a file under the final name is always complete.
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    at::ScalarType dtype = at::kFloat;
    std::vector<int64_t> shape;
  };
  SafetensorsWriter(std::string path, const std::vector<Entry>& entries, const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  void write(const at::Tensor& t);
  void finish();

 private:
  void write_bytes(const void* data, std::size_t bytes);
  std::string path_;
  std::vector<Entry> entries_;
  std::size_t written_ = 0;
  int fd_ = -1;
};

// Writes `tensors` (name, tensor, any device) as one safetensors file through SafetensorsWriter.
// `metadata`: the header's __metadata__.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The Hugging Face Llama name of an executor parameter (model.hpp's names): "layers.3.attention.wq.weight"
// -> "model.layers.3.self_attn.q_proj.weight"; a LoRA adapter's gets PEFT's names
// ("base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"). Throws std::logic_error
// for a name with none (GPT-style parameters).
[[nodiscard]] std::string hf_name(const std::string& name);

// transformers' config.json for `model` (a Llama-style ModelSpec), in `dtype` ("float32", "bfloat16").
[[nodiscard]] nlohmann::json hf_llama_config(const costmodel::ModelSpec& model, const std::string& dtype);
// PEFT's adapter_config.json for `lora` on `model`.
[[nodiscard]] nlohmann::json peft_adapter_config(const costmodel::LoraConfig& lora, const std::string& base_model);

// A Hugging Face Llama checkpoint directory: config.json and model.safetensors, or
// model.safetensors.index.json naming the file of every tensor.
class HfCheckpoint {
 public:
  // Throws ImportError when the directory, its config or its index is missing or malformed.
  explicit HfCheckpoint(const std::string& dir);
  [[nodiscard]] const costmodel::ModelSpec& model() const { return model_; }
  [[nodiscard]] const std::string& dir() const { return dir_; }
  // What differs between this checkpoint's architecture and `plan_model` ("" when they agree):
  // every size, tied embeddings, head size, rotary base, norm epsilon, sliding window and block features.
  [[nodiscard]] std::string mismatch(const costmodel::ModelSpec& plan_model) const;
  // A tensor of the checkpoint that `model` has no parameter for ("" when none): a layer the
  // executor's block lacks (Qwen3's query and key norms, biases) would otherwise be dropped unseen.
  // The rotary tables some checkpoints carry are derived, not parameters, and pass.
  [[nodiscard]] std::string unused_tensor(const costmodel::ModelSpec& model) const;
  // The whole tensor `hf` as float32, checked against `shape` (ImportError naming the tensor, its
  // file and both shapes; or the tensor missing, naming `wanted_for`).
  [[nodiscard]] at::Tensor read(const std::string& hf, const std::vector<int64_t>& shape, const std::string& wanted_for) const;

 private:
  std::string dir_;
  costmodel::ModelSpec model_;
  std::map<std::string, std::string> file_of_;  // tensor -> file name
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
};

// Loads every frozen or trainable base parameter of this rank's units from `checkpoint` (a LoRA
// run's adapters keep their initial values), one tensor at a time, this rank's pieces only, then
// refreshes the compute copies. Throws ImportError.
void import_hf_weights(const HfCheckpoint& checkpoint, DataParallelEngine& engine);

}  // namespace trainplan::executor
