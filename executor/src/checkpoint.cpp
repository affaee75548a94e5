// Sharded checkpoints with a checksummed manifest, and safetensors export (see checkpoint.hpp).

#include "checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <fstream>
#include <regex>
#include <sstream>

namespace trainplan::executor {

namespace fs = std::filesystem;

namespace {

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
  return {{"world_size", world_size},
          {"zero_stage", engine.config().zero_stage},
          {"shard_size", engine.shard_size()},
          {"parallel", parallel},
          {"precision", precision},
          {"model", {{"name", engine.model().name}, {"parameters", parameters}}}};
}

std::string save_checkpoint(const std::string& dir, DataParallelEngine& engine, Communicator& world, const TrainerState& state,
                            const nlohmann::json& layout) {
  const std::string final_dir = (fs::path(dir) / step_name(state.step)).string();
  const std::string partial = final_dir + ".partial";
  agree(world, [&] {
    std::error_code ec;
    fs::remove_all(partial, ec);
    fs::create_directories(partial, ec);
    return ec ? partial + ": cannot create checkpoint directory: " + ec.message() : std::string();
  });

  nlohmann::json mine;  // empty on ranks that hold a replica another rank writes
  std::string error;
  if (engine.writes_checkpoint()) {
    const std::string name = shard_file(engine.config().shard_prefix, engine.shard_rank());
    try {
      FileWriter w((fs::path(partial) / (name + ".tmp")).string());
      w.write(kMagic, sizeof(kMagic));
      for (const OwnedState& s : engine.owned_states()) {
        w.write_tensor(s.master);
        w.write_tensor(s.exp_avg);
        w.write_tensor(s.exp_avg_sq);
      }
      w.close_synced();
      const auto tmp = fs::path(partial) / (name + ".tmp");
      fs::rename(tmp, fs::path(partial) / name);
      mine = {{"file", name}, {"bytes", w.size()}, {"crc32", w.crc()}};
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
      if (r != "null" && !r.empty()) files.push_back(nlohmann::json::parse(r));
    }
    const nlohmann::json manifest = {
        {"schema", "trainplan/checkpoint/v1"},
        {"step", state.step},
        {"layout", layout},
        {"files", files},
        {"trainer", {{"step", state.step}, {"loss_scale", state.loss_scale}, {"good_steps", state.good_steps}, {"losses", state.losses}}},
    };
    write_text_atomically((fs::path(partial) / "manifest.json").string(), manifest.dump(2) + "\n");
    fsync_path(partial);
    std::error_code ec;
    fs::remove_all(final_dir, ec);
    fs::rename(partial, final_dir, ec);
    if (ec) return final_dir + ": cannot move the finished checkpoint into place: " + ec.message();
    fsync_path(dir);
    return std::string();
  });
  return final_dir;
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  const std::regex pattern("step_([0-9]+)");
  long long best = -1;
  std::string found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, pattern) || !fs::exists(entry.path() / "manifest.json")) continue;
    const long long step = std::stoll(m[1].str());
    if (step > best) {
      best = step;
      found = entry.path().string();
    }
  }
  if (best < 0) return std::nullopt;
  return found;
}

TrainerState load_checkpoint(const std::string& step_dir, DataParallelEngine& engine, Communicator& world,
                             const nlohmann::json& layout) {
  const std::string manifest_path = (fs::path(step_dir) / "manifest.json").string();
  nlohmann::json manifest;
  agree(world, [&] {
    std::ifstream in(manifest_path);
    if (!in) return manifest_path + ": missing or unreadable";
    try {
      manifest = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      return manifest_path + ": corrupt manifest: " + e.what();
    }
    if (manifest.value("schema", "") != "trainplan/checkpoint/v1") return manifest_path + ": /schema: expected \"trainplan/checkpoint/v1\"";
    if (manifest["layout"] != layout) {
      return manifest_path + ": written under layout " + manifest["layout"].dump() + ", but this run has " + layout.dump() +
             "; resume with the same plan (dp, ZeRO stage, shard group, precision, model)";
    }
    for (const auto& f : manifest["files"]) {
      const std::string path = (fs::path(step_dir) / f["file"].get<std::string>()).string();
      const auto [size, crc] = file_digest(path);
      if (size != f["bytes"].get<uint64_t>()) {
        return path + ": " + std::to_string(size) + " bytes, the manifest says " + std::to_string(f["bytes"].get<uint64_t>()) +
               " (truncated or overwritten shard)";
      }
      if (crc != f["crc32"].get<unsigned long>()) return path + ": CRC-32 mismatch (corrupt shard)";
    }
    return std::string();
  });
  // Every rank parses the manifest itself (same file, already verified by rank 0).
  if (world.rank() != 0) {
    std::ifstream in(manifest_path);
    manifest = nlohmann::json::parse(in);
  }

  const std::string path = (fs::path(step_dir) / shard_file(engine.config().shard_prefix, engine.shard_rank())).string();
  std::ifstream in(path, std::ios::binary);
  char magic[sizeof(kMagic)] = {};
  in.read(magic, sizeof(magic));
  if (!in || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) throw CheckpointError(path + ": not a trainplan checkpoint shard");
  for (OwnedState& s : engine.owned_states()) {
    for (at::Tensor* t : {&s.master, &s.exp_avg, &s.exp_avg_sq}) {
      at::Tensor host = at::empty({t->numel()}, at::TensorOptions().dtype(at::kFloat));
      in.read(static_cast<char*>(host.data_ptr()), static_cast<std::streamsize>(host.numel() * 4));
      if (!in) throw CheckpointError(path + ": ends early");
      t->variable_data().copy_(host);
    }
  }
  engine.load_masters_done();

  TrainerState state;
  const auto& t = manifest["trainer"];
  state.step = t["step"].get<int64_t>();
  state.loss_scale = t["loss_scale"].get<double>();
  state.good_steps = t["good_steps"].get<int64_t>();
  state.losses = t["losses"].get<std::vector<double>>();
  return state;
}

void export_safetensors(const std::string& dir, DataParallelEngine& engine, Communicator& world, int64_t step,
                        const ExportPlan& plan) {
  const bool writer = world.rank() == 0;
  const std::vector<UnitLayout> whole = model_layout(engine.model());
  constexpr int kTag = 29000;

  // Every rank gathers its units' data-parallel shards (collective within the shard group); the
  // first data-parallel replica sends its pieces to rank 0 in model order.
  std::map<std::string, at::Tensor> local;  // rank 0's own pieces, by "name#piece"
  std::vector<std::pair<std::unique_ptr<Work>, at::Tensor>> sends;
  for (std::size_t i = 0; i < engine.layout().size(); ++i) {
    const at::Tensor full = engine.full_master(i);
    if (!plan.sender) continue;
    for (const ParamSlot& s : engine.layout()[i].slots) {
      if (!s.primary || s.tied_copy) continue;
      at::Tensor piece = full.narrow(0, s.offset, s.numel).contiguous().clone();
      if (writer) {
        local[s.name + "#" + std::to_string(s.shard_index)] = piece;
      } else {
        auto work = world.send(piece, 0, kTag);
        sends.emplace_back(std::move(work), piece);
      }
    }
  }

  if (writer) {
    nlohmann::ordered_json header;
    header["__metadata__"] = {{"format", "pt"}, {"producer", "trainplan executor"}, {"step", std::to_string(step)}};
    uint64_t offset = 0;
    for (const UnitLayout& u : whole) {
      for (const ParamSlot& s : u.slots) {
        const uint64_t bytes = static_cast<uint64_t>(s.numel) * 4;
        header[s.name] = {{"dtype", "F32"}, {"shape", s.shape}, {"data_offsets", {offset, offset + bytes}}};
        offset += bytes;
      }
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
    const std::string path = (fs::path(dir) / "model.safetensors").string();
    fs::create_directories(dir);
    FileWriter w(path + ".tmp");
    const uint64_t length = text.size();  // little-endian on every platform we build for
    w.write(&length, 8);
    w.write(text.data(), text.size());
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
        const at::Tensor joined = cut.split_dim < 0 ? pieces[0] : at::cat(pieces, cut.split_dim).contiguous();
        w.write_tensor(joined.reshape({-1}));
      }
    }
    w.close_synced();
    fs::rename(path + ".tmp", path);
    write_text_atomically((fs::path(dir) / "config.json").string(), costmodel::model_to_json(engine.model()).dump(2) + "\n");
  }
  for (auto& s : sends) s.first->wait();
  world.barrier();
}

}  // namespace trainplan::executor
