// Hugging Face checkpoints: safetensors files, Llama names and configs (see hf_checkpoint.hpp).

#include "hf_checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "trainplan/costmodel/hf_config.hpp"

namespace trainplan::executor {

namespace cm = trainplan::costmodel;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ULL << 20;  // safetensors' own limit

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  return 0;
}

const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "F32";
    case at::kBFloat16: return "BF16";
    case at::kHalf: return "F16";
    case at::kLong: return "I64";
    default: throw std::invalid_argument("write_safetensors: only float32, bfloat16, float16 and int64 tensors are written");
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ImportError(path + ": cannot open (" + std::strerror(errno) + ")");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void pread_all(int fd, void* out, uint64_t bytes, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw ImportError(path + ": read failed at byte " + std::to_string(offset) + (n < 0 ? std::string(": ") + std::strerror(errno) : ": file ends early"));
    p += n;
    bytes -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// "layers.3.attention.wq" -> "model.layers.3.self_attn.q_proj" (no suffix).
std::string hf_module(const std::string& name) {
  static const std::map<std::string, std::string> kBlock = {
      {"attention_norm", "input_layernorm"},   {"mlp_norm", "post_attention_layernorm"}, {"attention.wq", "self_attn.q_proj"},
      {"attention.wk", "self_attn.k_proj"},    {"attention.wv", "self_attn.v_proj"},     {"attention.wo", "self_attn.o_proj"},
      {"mlp.gate", "mlp.gate_proj"},           {"mlp.up", "mlp.up_proj"},                {"mlp.down", "mlp.down_proj"}};
  if (name == "embedding.tokens") return "model.embed_tokens";
  if (name == "head.norm") return "model.norm";
  if (name == "head.output") return "lm_head";
  if (name.rfind("layers.", 0) == 0) {
    const std::size_t dot = name.find('.', 7);
    if (dot != std::string::npos) {
      const auto found = kBlock.find(name.substr(dot + 1));
      if (found != kBlock.end()) return "model." + name.substr(0, dot) + "." + found->second;
    }
  }
  throw std::logic_error("no Hugging Face Llama name for parameter " + name);
}

}  // namespace

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  Fd f{::open(path_.c_str(), O_RDONLY)};
  if (f.fd < 0) throw ImportError(path_ + ": cannot open (" + std::strerror(errno) + ")");
  const uint64_t size = fs::file_size(path_);
  if (size < 8) throw ImportError(path_ + ": " + std::to_string(size) + " bytes, too short for a safetensors file");
  uint64_t length = 0;
  pread_all(f.fd, &length, 8, 0, path_);  // little-endian on every platform we build for
  if (length > kMaxHeaderBytes || length > size - 8) {
    throw ImportError(path_ + ": header length " + std::to_string(length) + " exceeds the file (" + std::to_string(size) + " bytes): not a safetensors file, or truncated");
  }
  std::string text(length, '\0');
  pread_all(f.fd, text.data(), length, 8, path_);
  data_start_ = 8 + length;
  const uint64_t data_bytes = size - data_start_;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw ImportError(path_ + ": the header is not JSON: " + e.what());
  }
  if (!header.is_object()) throw ImportError(path_ + ": the header is not a JSON object");
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = path_ + ": tensor " + name;
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets") ||
        !value["dtype"].is_string() || !value["shape"].is_array() || !value["data_offsets"].is_array() || value["data_offsets"].size() != 2) {
      throw ImportError(where + ": needs dtype, shape and data_offsets [begin, end]");
    }
    Entry e;
    e.dtype = value["dtype"].get<std::string>();
    uint64_t numel = 1;
    for (const auto& d : value["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (1ULL << 40) || __builtin_mul_overflow(numel, d.get<uint64_t>(), &numel) || numel > (1ULL << 50)) {
        throw ImportError(where + ": shape " + value["shape"].dump() + " is not a list of sizes a tensor can have");
      }
      e.shape.push_back(d.get<int64_t>());
    }
    if (!value["data_offsets"][0].is_number_unsigned() || !value["data_offsets"][1].is_number_unsigned()) {
      throw ImportError(where + ": data_offsets " + value["data_offsets"].dump() + " are not byte offsets");
    }
    e.begin = value["data_offsets"][0].get<uint64_t>();
    e.end = value["data_offsets"][1].get<uint64_t>();
    const uint64_t width = dtype_bytes(e.dtype);
    if (width == 0) throw ImportError(where + ": unknown dtype " + e.dtype);
    if (e.end < e.begin || e.end - e.begin != numel * width) {
      throw ImportError(where + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ") do not hold " + e.dtype + " " +
                        shape_text(e.shape) + " (" + std::to_string(numel * width) + " bytes)");
    }
    if (e.end > data_bytes) {
      throw ImportError(where + ": its bytes end at " + std::to_string(e.end) + ", past the file's " + std::to_string(data_bytes) +
                        " data bytes (truncated file?)");
    }
    entries_[name] = std::move(e);
  }
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const auto found = entries_.find(name);
  if (found == entries_.end()) throw ImportError(path_ + ": no tensor " + name);
  const Entry& e = found->second;
  at::ScalarType type;
  if (e.dtype == "F32") type = at::kFloat;
  else if (e.dtype == "BF16") type = at::kBFloat16;
  else if (e.dtype == "F16") type = at::kHalf;
  else throw ImportError(path_ + ": tensor " + name + " is " + e.dtype + "; the executor imports F32, BF16 and F16 weights (dequantise it first)");
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(type));
  Fd f{::open(path_.c_str(), O_RDONLY)};
  if (f.fd < 0) throw ImportError(path_ + ": cannot open (" + std::strerror(errno) + ")");
  pread_all(f.fd, t.data_ptr(), e.end - e.begin, data_start_ + e.begin, path_);
  return t.to(at::kFloat);
}

SafetensorsWriter::SafetensorsWriter(std::string path, const std::vector<Entry>& entries, const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), entries_(entries) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    uint64_t bytes = at::elementSize(e.dtype);
    for (int64_t d : e.shape) bytes *= static_cast<uint64_t>(d);
    header[e.name] = {{"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  if (const fs::path parent = fs::path(path_).parent_path(); !parent.empty()) fs::create_directories(parent);
  fd_ = ::open((path_ + ".tmp").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd_ < 0) throw std::runtime_error(path_ + ".tmp: cannot create: " + std::strerror(errno));
  const uint64_t length = text.size();  // little-endian on every platform we build for
  write_bytes(&length, 8);
  write_bytes(text.data(), text.size());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::write_bytes(const void* data, std::size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(path_ + ".tmp: write failed: " + std::strerror(errno));
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void SafetensorsWriter::write(const at::Tensor& t) {
  if (written_ >= entries_.size()) throw std::logic_error(path_ + ": more tensors than the header names");
  const Entry& e = entries_[written_++];
  if (t.numel() != static_cast<int64_t>(c10::multiply_integers(e.shape))) throw std::logic_error(path_ + ": " + e.name + " has another size than its header");
  const at::Tensor host = t.to(at::kCPU, e.dtype).contiguous();
  write_bytes(host.data_ptr(), static_cast<std::size_t>(host.numel()) * host.element_size());
}

void SafetensorsWriter::finish() {
  if (written_ != entries_.size()) throw std::logic_error(path_ + ": " + std::to_string(entries_.size() - written_) + " tensors not written");
  if (::fsync(fd_) != 0) throw std::runtime_error(path_ + ".tmp: fsync failed: " + std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  fs::rename(path_ + ".tmp", path_);
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Entry> entries;
  for (const auto& [name, t] : tensors) entries.push_back({name, t.scalar_type(), t.sizes().vec()});
  SafetensorsWriter writer(path, entries, metadata);
  for (const auto& [name, t] : tensors) writer.write(t);
  writer.finish();
}

std::string hf_name(const std::string& name) {
  const std::size_t lora = name.find(".lora_");
  if (lora != std::string::npos) {  // layers.3.attention.wq.lora_A.weight
    return "base_model.model." + hf_module(name.substr(0, lora)) + name.substr(lora);
  }
  const std::size_t suffix = name.rfind('.');
  if (suffix == std::string::npos) throw std::logic_error("no Hugging Face Llama name for parameter " + name);
  return hf_module(name.substr(0, suffix)) + name.substr(suffix);
}

nlohmann::json hf_llama_config(const cm::ModelSpec& m, const std::string& dtype) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", m.hidden},
          {"intermediate_size", m.ffn_hidden},
          {"num_attention_heads", m.heads},
          {"num_key_value_heads", m.kv_heads},
          {"num_hidden_layers", m.layers},
          {"head_dim", m.head_dim()},
          {"vocab_size", m.vocab},
          {"max_position_embeddings", m.max_seq_len},
          {"rms_norm_eps", m.norm_eps},
          {"rope_theta", m.rope_theta},
          {"rope_scaling", nullptr},
          {"tie_word_embeddings", m.tied_embeddings},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"torch_dtype", dtype}};
}

nlohmann::json peft_adapter_config(const cm::LoraConfig& lora, const std::string& base_model) {
  static const std::map<std::string, std::string> kModules = {{"q", "q_proj"},       {"k", "k_proj"},   {"v", "v_proj"},    {"o", "o_proj"},
                                                              {"gate", "gate_proj"}, {"up", "up_proj"}, {"down", "down_proj"}};
  nlohmann::json modules = nlohmann::json::array();
  for (const std::string& t : lora.targets) modules.push_back(kModules.at(t));
  return {{"peft_type", "LORA"}, {"task_type", "CAUSAL_LM"}, {"base_model_name_or_path", base_model}, {"r", lora.rank},
          {"lora_alpha", lora.alpha}, {"lora_dropout", lora.dropout}, {"target_modules", modules}, {"bias", "none"},
          {"fan_in_fan_out", false}, {"inference_mode", true}};
}

HfCheckpoint::HfCheckpoint(const std::string& dir) : dir_(dir) {
  if (!fs::is_directory(dir)) throw ImportError(dir + ": not a directory (a Hugging Face checkpoint: config.json and *.safetensors)");
  const std::string config = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config)) throw ImportError(dir + ": no config.json");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(read_text(config));
  } catch (const nlohmann::json::exception& e) {
    throw ImportError(config + ": not JSON: " + e.what());
  }
  if (!cm::is_hf_config(json)) throw ImportError(config + ": not a Hugging Face config (no model_type)");
  const std::string type = json["model_type"].is_string() ? json["model_type"].get<std::string>() : "";
  // Qwen3 shares the names but adds a norm on queries and keys, which the executor's block lacks.
  if (type != "llama" && type != "mistral") {
    throw ImportError(config + ": model_type \"" + type + "\": the executor imports Llama-layout checkpoints (llama, mistral)");
  }
  if (json.contains("rope_scaling") && !json["rope_scaling"].is_null()) {
    throw ImportError(config + ": /rope_scaling " + json["rope_scaling"].dump() + ": scaled rotary positions are not in the executor");
  }
  auto model = cm::parse_hf_config(json, config);
  if (!model) throw ImportError(model.error().message);
  model_ = *model;

  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_text(index.string()));
    } catch (const nlohmann::json::exception& e) {
      throw ImportError(index.string() + ": not JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) throw ImportError(index.string() + ": no weight_map object");
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) throw ImportError(index.string() + ": /weight_map/" + name + " is not a file name");
      file_of_[name] = file.get<std::string>();
    }
  } else {
    const fs::path single = fs::path(dir) / "model.safetensors";
    if (!fs::exists(single)) throw ImportError(dir + ": neither model.safetensors nor model.safetensors.index.json");
    files_["model.safetensors"] = std::make_unique<SafetensorsFile>(single.string());
    for (const auto& [name, entry] : files_["model.safetensors"]->entries()) file_of_[name] = "model.safetensors";
  }
}

std::string HfCheckpoint::mismatch(const cm::ModelSpec& p) const {
  const cm::ModelSpec& c = model_;
  std::string out;
  const auto check = [&](const char* what, auto mine, auto theirs) {
    if (mine != theirs) {
      std::ostringstream s;
      s << (out.empty() ? "" : ", ") << what << " " << theirs << " in the plan, " << mine << " in the checkpoint";
      out += s.str();
    }
  };
  check("layers", c.layers, p.layers);
  check("hidden", c.hidden, p.hidden);
  check("heads", c.heads, p.heads);
  check("kv_heads", c.kv_heads, p.kv_heads);
  check("ffn_hidden", c.ffn_hidden, p.ffn_hidden);
  check("vocab", c.vocab, p.vocab);
  check("head_dim", c.head_dim(), p.head_dim());
  check("tied_embeddings", c.tied_embeddings, p.tied_embeddings);
  check("rope_theta", c.rope_theta, p.rope_theta);
  check("norm_eps", c.norm_eps, p.norm_eps);
  check("moe", c.moe.has_value(), p.moe.has_value());
  check("sliding_window", c.sliding_window, p.sliding_window);
  check("architecture", std::string(cm::architecture_name(c.architecture)), std::string(cm::architecture_name(p.architecture)));
  if (c.features() != p.features()) out += std::string(out.empty() ? "" : ", ") + "block features (norm, MLP, positions or biases) differ";
  return out;
}

std::string HfCheckpoint::unused_tensor(const cm::ModelSpec& model) const {
  std::set<std::string> used;
  for (const UnitLayout& u : model_layout(model)) {
    for (const ParamSlot& s : u.slots) used.insert(hf_name(s.name));
  }
  if (model.tied_embeddings) used.insert("lm_head.weight");  // some tied checkpoints store the copy
  for (const auto& [name, file] : file_of_) {
    if (used.count(name) == 0 && name.find("rotary_emb.inv_freq") == std::string::npos) return name + " (in " + file + ")";
  }
  return "";
}

at::Tensor HfCheckpoint::read(const std::string& hf, const std::vector<int64_t>& shape, const std::string& wanted_for) const {
  const auto file = file_of_.find(hf);
  if (file == file_of_.end()) throw ImportError(dir_ + ": tensor " + hf + " is missing (the executor's " + wanted_for + ")");
  auto& opened = files_[file->second];
  if (!opened) opened = std::make_unique<SafetensorsFile>((fs::path(dir_) / file->second).string());
  const auto entry = opened->entries().find(hf);
  if (entry == opened->entries().end()) throw ImportError(opened->path() + ": tensor " + hf + " is missing, though the index names this file");
  if (entry->second.shape != shape) {
    throw ImportError(opened->path() + ": tensor " + hf + " is " + shape_text(entry->second.shape) + ", the model needs " + shape_text(shape) +
                      " (the executor's " + wanted_for + ")");
  }
  return opened->read(hf);
}

void import_hf_weights(const HfCheckpoint& checkpoint, DataParallelEngine& engine) {
  const std::vector<UnitLayout>& units = engine.layout();
  for (std::size_t i = 0; i < units.size(); ++i) {
    const UnitLayout& u = units[i];
    if (u.kind == UnitKind::kAdapters) continue;  // not in a base checkpoint: they keep their initial values
    at::Tensor values = at::empty({u.numel}, at::TensorOptions().dtype(at::kFloat));
    for (const ParamSlot& s : u.slots) {
      // The tied copy of the token table (pp > 1) is the embedding's.
      const std::string name = s.tied_copy ? "model.embed_tokens.weight" : hf_name(s.name);
      const at::Tensor whole = checkpoint.read(name, s.full_shape, s.name);
      values.narrow(0, s.offset, s.numel).view(s.shape).copy_(slot_piece(s, whole));
    }
    engine.load_unit(i, values);
  }
  engine.load_masters_done();
}

}  // namespace trainplan::executor
