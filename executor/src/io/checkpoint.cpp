// Sharded checkpoints with a checksummed manifest, and safetensors export (see checkpoint.hpp).

#include "checkpoint.hpp"
#include "hf_checkpoint.hpp"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <map>
#include <fstream>
#include <regex>
#include <sstream>

#include "trainplan/costmodel/presets.hpp"

namespace trainplan::executor {

namespace fs = std::filesystem;

namespace {

// Removes `path` and everything under it (nothing to do when it does not exist); an empty string
// or what failed. Not std::filesystem::remove_all: LibTorch's libraries export their own copy of
// libstdc++'s filesystem functions, and remove_all bound to theirs jumps to address 0 (SIGSEGV)
// whenever the directory exists, e.g. a checkpoint saved again or a crash's leftover ".partial".
std::string remove_tree(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return errno == ENOENT ? std::string() : path + ": " + std::strerror(errno);
  const auto remove_one = [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p) == 0 ? 0 : -1; };
  if (nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0) return path + ": cannot remove: " + std::strerror(errno);
  return std::string();
}

constexpr char kMagic[16] = "TRAINPLAN-CKPT1";  // 15 characters and a NUL

std::string step_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%06lld", static_cast<long long>(step));
  return name;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Appends bytes to an open descriptor, keeping a running CRC-32.
class FileWriter {
 public:
  explicit FileWriter(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd_ < 0) throw CheckpointError(path + ": cannot create: " + std::strerror(errno));
    crc_ = crc32(0L, Z_NULL, 0);
  }
  ~FileWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  void write(const void* data, std::size_t bytes) {
    const char* p = static_cast<const char*>(data);
    crc_ = crc32_z(crc_, reinterpret_cast<const Bytef*>(p), bytes);
    size_ += bytes;
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, p, bytes);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw CheckpointError(path_ + ": write failed: " + std::strerror(errno));
      }
      p += n;
      bytes -= static_cast<std::size_t>(n);
    }
  }
  void write_tensor(const at::Tensor& t) {
    const at::Tensor host = t.contiguous().cpu();
    write(host.data_ptr(), static_cast<std::size_t>(host.numel()) * host.element_size());
  }
  void close_synced() {
    if (::fsync(fd_) != 0) throw CheckpointError(path_ + ": fsync failed: " + std::strerror(errno));
    ::close(fd_);
    fd_ = -1;
  }
  [[nodiscard]] uint64_t size() const { return size_; }
  [[nodiscard]] unsigned long crc() const { return crc_; }

 private:
  std::string path_;
  int fd_ = -1;
  unsigned long crc_ = 0;
  uint64_t size_ = 0;
};

void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FileWriter w(tmp);
  w.write(text.data(), text.size());
  w.close_synced();
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw CheckpointError(path + ": rename failed: " + std::strerror(errno));
}

std::string shard_file(const std::string& prefix, int shard) {
  char name[32];
  std::snprintf(name, sizeof(name), "%05d.bin", shard);
  return "shard_" + prefix + name;
}

// Size and CRC-32 of a whole file.
std::pair<uint64_t, unsigned long> file_digest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(path + ": missing or unreadable");
  unsigned long crc = crc32(0L, Z_NULL, 0);
  uint64_t size = 0;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    crc = crc32_z(crc, reinterpret_cast<const Bytef*>(buffer.data()), n);
    size += n;
  }
  return {size, crc};
}

// The key of the manifest's own CRC-32: of the manifest's compact dump without this key.
constexpr char kManifestCrcKey[] = "manifest_crc32";

unsigned long text_crc(const std::string& text) {
  return crc32_z(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(text.data()), text.size());
}

// The parsed manifest of `step_dir` (duplicate keys refused like every JSON input); throws
// CheckpointError saying why it cannot be read.
nlohmann::json read_manifest(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / "manifest.json").string();
  auto text = costmodel::read_text_file(path);
  if (!text) throw CheckpointError(path + ": missing or unreadable");
  auto json = costmodel::parse_json_text(*text, path);
  if (!json) throw CheckpointError("corrupt manifest: " + json.error().message);
  return std::move(json).value();
}

// Rank 0 runs `check`; every rank then throws its message, so no rank goes on alone.
void agree(Communicator& world, const std::function<std::string()>& check) {
  std::string error;
  if (world.rank() == 0) {
    try {
      error = check();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const std::vector<std::string> all = world.all_gather_strings(error);
  if (!all[0].empty()) throw CheckpointError(all[0]);
}

}  // namespace

nlohmann::json checkpoint_layout(const DataParallelEngine& engine, int world_size, const std::string& precision,
                                 const nlohmann::json& parallel) {
  int64_t parameters = 0;
  for (const UnitLayout& u : model_layout(engine.model())) parameters += u.numel;
  nlohmann::json layout = {{"world_size", world_size},
                           {"zero_stage", engine.config().zero_stage},
                           {"shard_size", engine.shard_size()},
                           {"parallel", parallel},
                           {"precision", precision},
                           {"model", {{"name", engine.model().name}, {"parameters", parameters}}}};
  if (engine.expert_shard_size() > 0) layout["expert_shard_size"] = engine.expert_shard_size();  // only then: older layouts still match
  return layout;
}

std::string save_checkpoint(const std::string& dir, DataParallelEngine& engine, Communicator& world, const TrainerState& state,
                            const nlohmann::json& layout) {
  const std::string final_dir = (fs::path(dir) / step_name(state.step)).string();
  const std::string partial = final_dir + ".partial";
  agree(world, [&] {
    if (std::string failed = remove_tree(partial); !failed.empty()) return "cannot clear a previous attempt's " + failed;
    std::error_code ec;
    fs::create_directories(partial, ec);
    return ec ? partial + ": cannot create checkpoint directory: " + ec.message() : std::string();
  });

  nlohmann::json mine = nlohmann::json::array();  // empty on ranks that hold replicas other ranks write
  std::string error;
  for (const DataParallelEngine::StatePart& part : engine.state_parts()) {
    if (!part.writes || !error.empty()) continue;
    const std::string name = shard_file(part.prefix, part.shard);
    try {
      FileWriter w((fs::path(partial) / (name + ".tmp")).string());
      w.write(kMagic, sizeof(kMagic));
      for (const OwnedState& s : part.states) {
        w.write_tensor(s.master);
        w.write_tensor(s.exp_avg);
        w.write_tensor(s.exp_avg_sq);
      }
      w.close_synced();
      const auto tmp = fs::path(partial) / (name + ".tmp");
      fs::rename(tmp, fs::path(partial) / name);
      mine.push_back({{"file", name}, {"bytes", w.size()}, {"crc32", w.crc()}});
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const std::vector<std::string> reports = world.all_gather_strings(error.empty() ? mine.dump() : "!" + error);
  for (const std::string& r : reports) {
    if (!r.empty() && r[0] == '!') throw CheckpointError("checkpoint " + final_dir + ": " + r.substr(1));
  }
  agree(world, [&] {
    nlohmann::json files = nlohmann::json::array();
    for (const std::string& r : reports) {
      for (const auto& file : nlohmann::json::parse(r)) files.push_back(file);
    }
    nlohmann::json manifest = {
        {"schema", "trainplan/checkpoint/v1"},
        {"step", state.step},
        {"layout", layout},
        {"files", files},
        {"trainer", {{"step", state.step}, {"loss_scale", state.loss_scale}, {"good_steps", state.good_steps}, {"losses", state.losses}}},
    };
    manifest[kManifestCrcKey] = text_crc(manifest.dump());
    write_text_atomically((fs::path(partial) / "manifest.json").string(), manifest.dump(2) + "\n");
    fsync_path(partial);
    if (std::string failed = remove_tree(final_dir); !failed.empty()) return "cannot replace the checkpoint of the same step: " + failed;
    std::error_code ec;
    fs::rename(partial, final_dir, ec);
    if (ec) return final_dir + ": cannot move the finished checkpoint into place: " + ec.message();
    fsync_path(dir);
    return std::string();
  });
  return final_dir;
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  for (const std::string& step_dir : checkpoint_directories(dir)) {
    std::error_code ec;
    if (fs::exists(fs::path(step_dir) / "manifest.json", ec)) return step_dir;
  }
  return std::nullopt;
}

std::vector<std::string> checkpoint_directories(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  const std::regex pattern("step_([0-9]+)");
  std::vector<std::pair<long long, std::string>> found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, pattern) || !entry.is_directory(ec)) continue;
    found.emplace_back(std::stoll(m[1].str()), entry.path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

std::string checkpoint_damage(const std::string& step_dir, const nlohmann::json& layout) {
  const std::string manifest_path = (fs::path(step_dir) / "manifest.json").string();
  nlohmann::json manifest;
  try {
    manifest = read_manifest(step_dir);
    if (!manifest.is_object() || manifest.value("schema", "") != "trainplan/checkpoint/v1") {
      return manifest_path + ": /schema: expected \"trainplan/checkpoint/v1\"";
    }
    // Checkpoints written before the manifest carried its own checksum have only the files'.
    if (manifest.contains(kManifestCrcKey)) {
      nlohmann::json body = manifest;
      body.erase(kManifestCrcKey);
      if (text_crc(body.dump()) != manifest[kManifestCrcKey].get<unsigned long>()) return manifest_path + ": CRC-32 mismatch (corrupt manifest)";
    }
    if (!manifest.contains("layout") || !manifest.contains("files") || !manifest.contains("trainer")) {
      return manifest_path + ": corrupt manifest (no layout, files or trainer)";
    }
  } catch (const CheckpointError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return manifest_path + ": corrupt manifest: " + e.what();
  }
  if (manifest["layout"] != layout) {
    throw CheckpointError(manifest_path + ": written under layout " + manifest["layout"].dump() + ", but this run has " + layout.dump() +
                          "; resume with the same plan (dp, ZeRO stage, shard group, precision, model)");
  }
  try {
    for (const auto& f : manifest["files"]) {
      const std::string path = (fs::path(step_dir) / f.at("file").get<std::string>()).string();
      const auto [size, crc] = file_digest(path);
      if (size != f.at("bytes").get<uint64_t>()) {
        return path + ": " + std::to_string(size) + " bytes, the manifest says " + std::to_string(f["bytes"].get<uint64_t>()) +
               " (truncated or overwritten shard)";
      }
      if (crc != f.at("crc32").get<unsigned long>()) return path + ": CRC-32 mismatch (corrupt shard)";
    }
    const auto& t = manifest["trainer"];
    (void)t.at("step").get<int64_t>();
    (void)t.at("loss_scale").get<double>();
    (void)t.at("good_steps").get<int64_t>();
    (void)t.at("losses").get<std::vector<double>>();
  } catch (const CheckpointError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return manifest_path + ": corrupt manifest: " + e.what();
  }
  return "";
}

namespace {

// Every rank: this rank's shard and the trainer state of a checkpoint rank 0 has verified.
TrainerState load_verified(const std::string& step_dir, DataParallelEngine& engine) {
  const nlohmann::json manifest = read_manifest(step_dir);
  for (DataParallelEngine::StatePart& part : engine.state_parts()) {
    const std::string path = (fs::path(step_dir) / shard_file(part.prefix, part.shard)).string();
    std::ifstream in(path, std::ios::binary);
    char magic[sizeof(kMagic)] = {};
    in.read(magic, sizeof(magic));
    if (!in || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) throw CheckpointError(path + ": not a trainplan checkpoint shard");
    for (OwnedState& s : part.states) {
      for (at::Tensor* t : {&s.master, &s.exp_avg, &s.exp_avg_sq}) {
        at::Tensor host = at::empty({t->numel()}, at::TensorOptions().dtype(at::kFloat));
        in.read(static_cast<char*>(host.data_ptr()), static_cast<std::streamsize>(host.numel() * 4));
        if (!in) throw CheckpointError(path + ": ends early");
        t->variable_data().copy_(host);
      }
    }
    if (in.peek() != std::char_traits<char>::eof()) throw CheckpointError(path + ": longer than this rank's state (another plan's shard?)");
  }
  engine.load_masters_done();

  TrainerState state;
  const auto& t = manifest.at("trainer");
  state.step = t.at("step").get<int64_t>();
  state.loss_scale = t.at("loss_scale").get<double>();
  state.good_steps = t.at("good_steps").get<int64_t>();
  state.losses = t.at("losses").get<std::vector<double>>();
  return state;
}

}  // namespace

TrainerState load_checkpoint(const std::string& step_dir, DataParallelEngine& engine, Communicator& world,
                             const nlohmann::json& layout) {
  agree(world, [&] { return checkpoint_damage(step_dir, layout); });
  return load_verified(step_dir, engine);
}

Resumed resume_newest_intact(const std::string& dir, DataParallelEngine& engine, Communicator& world, const nlohmann::json& layout) {
  // Rank 0 chooses; every rank learns its choice (or its error) and loads the same checkpoint.
  std::string choice;
  if (world.rank() == 0) {
    nlohmann::json c = {{"skipped", nlohmann::json::array()}};
    try {
      const std::vector<std::string> dirs = checkpoint_directories(dir);
      std::string damages;
      for (const std::string& step_dir : dirs) {
        const std::string why = checkpoint_damage(step_dir, layout);
        if (why.empty()) {
          c["dir"] = step_dir;
          break;
        }
        c["skipped"].push_back(step_dir + ": " + why);
        damages += (damages.empty() ? "" : "; ") + step_dir + ": " + why;
      }
      if (dirs.empty()) c["error"] = dir + ": no complete checkpoint (step_NNNNNN with manifest.json) found";
      else if (!c.contains("dir")) c["error"] = dir + ": no intact checkpoint to resume from: " + damages;
    } catch (const std::exception& e) {
      c["error"] = e.what();
    }
    choice = c.dump();
  }
  const nlohmann::json c = nlohmann::json::parse(world.all_gather_strings(choice)[0]);  // rank 0's own text
  if (c.contains("error")) throw CheckpointError(c["error"].get<std::string>());
  Resumed resumed;
  resumed.step_dir = c["dir"].get<std::string>();
  resumed.skipped = c["skipped"].get<std::vector<std::string>>();
  resumed.state = load_verified(resumed.step_dir, engine);
  return resumed;
}

namespace {

// Collective. Every parameter of `whole` (the whole model's layout) joined from its TP pieces, in
// layout order, handed to `consume` on rank 0.
void gather_parameters(DataParallelEngine& engine, Communicator& world, const ExportPlan& plan, const std::vector<UnitLayout>& whole,
                       const std::function<void(const UnitLayout&, const ParamSlot&, const at::Tensor&)>& consume) {
  const bool writer = world.rank() == 0;
  constexpr int kTag = 29000;
  // Every rank gathers its units' data-parallel shards (collective within the shard group); the
  // first data-parallel replica sends its pieces to rank 0 in model order, once every gather is
  // done: under NCCL a send queued before a gather holds that gather back until rank 0 receives
  // it, while rank 0 waits in the same gather for this rank (a deadlock with experts, whose
  // senders share rank 0's shard group; MPI's sends order nothing, so CPU ranks never showed it).
  std::map<std::string, at::Tensor> local;  // rank 0's own pieces, by "name#piece"
  std::vector<at::Tensor> outgoing;         // another rank's pieces, in model order
  for (std::size_t i = 0; i < engine.layout().size(); ++i) {
    const at::Tensor full = engine.full_master(i);
    if (!plan.sends(engine.layout()[i])) continue;
    for (const ParamSlot& s : engine.layout()[i].slots) {
      if (!s.primary || s.tied_copy) continue;
      at::Tensor piece = full.narrow(0, s.offset, s.numel).contiguous().clone();
      if (writer) local[s.name + "#" + std::to_string(s.shard_index)] = piece;
      else outgoing.push_back(std::move(piece));
    }
  }
  std::vector<std::pair<std::unique_ptr<Work>, at::Tensor>> sends;
  for (at::Tensor& piece : outgoing) {
    auto work = world.send(piece, 0, kTag);
    sends.emplace_back(std::move(work), std::move(piece));
  }
  if (writer) {
    for (const UnitLayout& u : whole) {
      for (const ParamSlot& s : u.slots) {
        // The pieces of this parameter, from the ranks that hold them, joined along the TP split.
        const ParamSlot& cut = plan.piece_slot(u.name, s.name, 0);
        std::vector<at::Tensor> pieces;
        for (int j = 0; j < cut.shard_count; ++j) {
          const ParamSlot& piece_slot = plan.piece_slot(u.name, s.name, j);
          const int owner = plan.owner_rank(u.name, s.name, j);
          at::Tensor piece;
          if (owner == 0) {
            piece = local.at(s.name + "#" + std::to_string(j));
          } else {
            piece = at::empty({piece_slot.numel}, at::TensorOptions().dtype(at::kFloat).device(world.device()));
            world.recv(piece, owner, kTag)->wait();
          }
          pieces.push_back(piece.view(piece_slot.shape));
        }
        consume(u, s, cut.split_dim < 0 ? pieces[0] : at::cat(pieces, cut.split_dim).contiguous());
      }
    }
  }
  for (auto& s : sends) s.first->wait();
}

// What an export's header says of its producer.
std::map<std::string, std::string> export_metadata(int64_t step) {
  return {{"format", "pt"}, {"producer", "trainplan executor"}, {"step", std::to_string(step)}};
}

// The model without adapters, streamed one parameter at a time.
void export_streamed(const std::string& dir, DataParallelEngine& engine, Communicator& world, int64_t step, const ExportPlan& plan,
                     const ExportOptions& options) {
  const std::vector<UnitLayout> whole = model_layout(engine.model());
  std::unique_ptr<SafetensorsWriter> out;
  if (world.rank() == 0) {
    std::vector<SafetensorsWriter::Entry> entries;
    for (const UnitLayout& u : whole) {
      for (const ParamSlot& s : u.slots) entries.push_back({options.hugging_face ? hf_name(s.name) : s.name, at::kFloat, s.shape});
    }
    out = std::make_unique<SafetensorsWriter>((fs::path(dir) / "model.safetensors").string(), entries, export_metadata(step));
  }
  gather_parameters(engine, world, plan, whole, [&](const UnitLayout&, const ParamSlot&, const at::Tensor& t) { out->write(t); });
  if (out) out->finish();
}

// A LoRA run, streamed too: each block's base weights are held (on the host) until its adapters
// arrive, then written merged (W + scale B A, under the base's names); the adapters go to their
// own file as they come. Rank 0 holds one block and its adapters at a time.
void export_lora(const std::string& dir, DataParallelEngine& engine, Communicator& world, int64_t step, const ExportPlan& plan,
                 const ExportOptions& options) {
  const LoraSpec& lora = engine.config().lora;
  ModelSharding whole_model;
  whole_model.lora = lora;
  const std::vector<UnitLayout> whole = model_layout(engine.model(), whole_model);
  const auto name_of = [&](const std::string& name) { return options.hugging_face ? hf_name(name) : name; };
  std::unique_ptr<SafetensorsWriter> model_file, adapter_file;
  if (world.rank() == 0) {
    std::vector<SafetensorsWriter::Entry> base, adapters;
    for (const UnitLayout& u : whole) {
      for (const ParamSlot& s : u.slots) (u.kind == UnitKind::kAdapters ? adapters : base).push_back({name_of(s.name), at::kFloat, s.full_shape});
    }
    const std::map<std::string, std::string> metadata = export_metadata(step);
    if (options.merged) model_file = std::make_unique<SafetensorsWriter>((fs::path(dir) / "model.safetensors").string(), base, metadata);
    if (options.adapters) adapter_file = std::make_unique<SafetensorsWriter>((fs::path(dir) / "adapter_model.safetensors").string(), adapters, metadata);
  }
  std::vector<std::pair<std::string, at::Tensor>> block;  // the current block's base weights, in slot order
  std::map<std::string, at::Tensor> unit_adapters;
  gather_parameters(engine, world, plan, whole, [&](const UnitLayout& u, const ParamSlot& s, const at::Tensor& t) {
    const at::Tensor value = t.view(s.full_shape).cpu();
    if (u.kind == UnitKind::kBlock) {
      block.emplace_back(s.name, value);
      return;
    }
    if (u.kind != UnitKind::kAdapters) {
      if (model_file) model_file->write(value);
      return;
    }
    if (adapter_file) adapter_file->write(value);
    unit_adapters[s.name] = value;
    if (&s != &u.slots.back()) return;
    // The unit's last adapter: merge them into the block's weights and write the block.
    for (auto& [name, w] : block) {
      for (const std::string& target : lora_target_order()) {
        const std::string base = "layers." + std::to_string(u.layer) + "." + lora_base_slot(target);
        if (lora.has(target) && name == base + ".weight") {
          w = w + lora.scale * at::mm(unit_adapters.at(base + ".lora_B.weight"), unit_adapters.at(base + ".lora_A.weight"));
        }
      }
      if (model_file) model_file->write(w);
    }
    block.clear();
    unit_adapters.clear();
  });
  if (model_file) model_file->finish();
  if (adapter_file) adapter_file->finish();
}

}  // namespace

void export_safetensors(const std::string& dir, DataParallelEngine& engine, Communicator& world, int64_t step,
                        const ExportPlan& plan, const ExportOptions& options) {
  if (world.rank() == 0) fs::create_directories(dir);
  if (engine.config().lora.active()) export_lora(dir, engine, world, step, plan, options);
  else export_streamed(dir, engine, world, step, plan, options);
  if (world.rank() == 0 && (options.merged || !engine.config().lora.active())) {
    const std::string config = options.hugging_face ? hf_llama_config(engine.model(), "float32").dump(2) : costmodel::model_to_json(engine.model()).dump(2);
    write_text_atomically((fs::path(dir) / "config.json").string(), config + "\n");
  }
  if (world.rank() == 0 && options.adapters && engine.config().lora.active()) {
    costmodel::LoraConfig config;
    config.rank = engine.config().lora.rank;
    config.alpha = engine.config().lora.scale * config.rank;
    config.targets = engine.config().lora.targets;
    write_text_atomically((fs::path(dir) / "adapter_config.json").string(), peft_adapter_config(config, options.base_model).dump(2) + "\n");
  }
  world.barrier();
}

}  // namespace trainplan::executor
