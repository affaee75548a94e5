// Synthetic and memory-mapped token data (see data.hpp).

#include "data.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <random>

namespace trainplan::executor {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Writes `count` tokens of sample `index` (global, any non-negative value) into out.
  virtual void sample(int64_t index, int64_t count, int64_t* out) = 0;
  [[nodiscard]] virtual std::string describe() const = 0;
};

namespace {

// Tokens follow a fixed random successor table, next = successor[t], with 1 in 16 tokens drawn
// at random: a bigram structure a model learns within tens of steps (the loss falls from
// ln(vocab) towards the noise floor), fully deterministic in (seed, sample index).
class SyntheticSource final : public TokenSource {
 public:
  SyntheticSource(uint64_t seed, int64_t vocab) : seed_(seed), vocab_(vocab), successor_(static_cast<std::size_t>(vocab)) {
    std::iota(successor_.begin(), successor_.end(), 0);
    uint64_t state = splitmix64(seed);
    for (std::size_t i = successor_.size(); i > 1; --i) {  // Fisher-Yates with splitmix64
      state = splitmix64(state);
      std::swap(successor_[i - 1], successor_[state % i]);
    }
  }
  void sample(int64_t index, int64_t count, int64_t* out) override {
    uint64_t state = splitmix64(seed_ ^ splitmix64(static_cast<uint64_t>(index)));
    const auto v = static_cast<uint64_t>(vocab_);
    int64_t t = static_cast<int64_t>((state = splitmix64(state)) % v);
    for (int64_t i = 0; i < count; ++i) {
      out[i] = t;
      state = splitmix64(state);
      t = (state & 15) == 0 ? static_cast<int64_t>((state >> 8) % v) : successor_[static_cast<std::size_t>(t)];
    }
  }
  std::string describe() const override { return "synthetic (seed " + std::to_string(seed_) + ")"; }

 private:
  uint64_t seed_;
  int64_t vocab_;
  std::vector<int64_t> successor_;
};

// A flat file of little-endian token ids, cut into windows of seq_len + 1 tokens that overlap by
// one; each epoch visits the windows in a fresh seeded order.
class FileSource final : public TokenSource {
 public:
  FileSource(const std::string& path, int token_bytes, int64_t seq_len, uint64_t seed, int64_t vocab)
      : path_(path), token_bytes_(token_bytes), seq_len_(seq_len), seed_(seed), vocab_(vocab) {
    if (token_bytes != 2 && token_bytes != 4) throw DataError(path + ": token size must be 2 (uint16) or 4 (uint32) bytes");
    fd_ = ::open(path.c_str(), O_RDONLY);
    if (fd_ < 0) throw DataError(path + ": cannot open token file: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw DataError(path + ": cannot stat: " + std::strerror(errno));
    bytes_ = static_cast<std::size_t>(st.st_size);
    if (bytes_ % static_cast<std::size_t>(token_bytes) != 0) {
      throw DataError(path + ": size " + std::to_string(bytes_) + " bytes is not a multiple of the token size " +
                      std::to_string(token_bytes) + " (wrong --data-dtype?)");
    }
    tokens_ = static_cast<int64_t>(bytes_ / static_cast<std::size_t>(token_bytes));
    windows_ = tokens_ > seq_len ? (tokens_ - 1) / seq_len : 0;
    if (windows_ < 1) {
      throw DataError(path + ": holds " + std::to_string(tokens_) + " tokens, fewer than one sequence of " +
                      std::to_string(seq_len + 1));
    }
    map_ = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (map_ == MAP_FAILED) throw DataError(path + ": mmap failed: " + std::strerror(errno));
  }
  ~FileSource() override {
    if (map_ != MAP_FAILED && map_ != nullptr) ::munmap(map_, bytes_);
    if (fd_ >= 0) ::close(fd_);
  }
  void sample(int64_t index, int64_t count, int64_t* out) override {
    const int64_t epoch = index / windows_, position = index % windows_;
    if (epoch != epoch_) shuffle(epoch);
    const int64_t start = order_[static_cast<std::size_t>(position)] * seq_len_;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t at = start + i;
      int64_t token = 0;
      if (token_bytes_ == 2) {
        uint16_t v;
        std::memcpy(&v, static_cast<const char*>(map_) + at * 2, 2);
        token = v;
      } else {
        uint32_t v;
        std::memcpy(&v, static_cast<const char*>(map_) + at * 4, 4);
        token = v;
      }
      if (token >= vocab_) {
        throw DataError(path_ + ": token " + std::to_string(token) + " at token offset " + std::to_string(at) + " (byte " +
                        std::to_string(at * token_bytes_) + ") is >= the model's vocab " + std::to_string(vocab_));
      }
      out[i] = token;
    }
  }
  std::string describe() const override {
    return path_ + " (" + std::to_string(tokens_) + " tokens, " + std::to_string(windows_) + " sequences)";
  }

 private:
  void shuffle(int64_t epoch) {
    order_.resize(static_cast<std::size_t>(windows_));
    std::iota(order_.begin(), order_.end(), 0);
    std::mt19937_64 rng(splitmix64(seed_ + static_cast<uint64_t>(epoch)));
    std::shuffle(order_.begin(), order_.end(), rng);
    epoch_ = epoch;
  }

  std::string path_;
  int token_bytes_;
  int64_t seq_len_;
  uint64_t seed_;
  int64_t vocab_;
  int fd_ = -1;
  void* map_ = nullptr;
  std::size_t bytes_ = 0;
  int64_t tokens_ = 0, windows_ = 0, epoch_ = -1;
  std::vector<int64_t> order_;
};

}  // namespace

DataLoader::DataLoader(const DataSpec& spec, int64_t vocab, int64_t seq_len) : vocab_(vocab), seq_len_(seq_len) {
  if (spec.source == "synthetic") source_ = std::make_unique<SyntheticSource>(spec.seed, vocab);
  else source_ = std::make_unique<FileSource>(spec.source, spec.token_bytes, seq_len, spec.seed, vocab);
}

DataLoader::~DataLoader() = default;

MicroBatch DataLoader::micro_batch(int64_t step, int dp_rank, int dp, int64_t global_batch, int64_t micro_batch,
                                   int64_t micro_index, const at::Device& device) {
  const int64_t first = (step - 1) * global_batch + dp_rank * (global_batch / dp) + micro_index * micro_batch;
  at::Tensor window = at::empty({micro_batch, seq_len_ + 1}, at::TensorOptions().dtype(at::kLong));
  int64_t* data = window.data_ptr<int64_t>();
  for (int64_t i = 0; i < micro_batch; ++i) source_->sample(first + i, seq_len_ + 1, data + i * (seq_len_ + 1));
  MicroBatch b;
  // To a GPU from pinned memory without waiting: a pageable copy would make the host wait for
  // the GPU to drain its queue before every micro-batch.
  const bool gpu = device.is_cuda();
  const auto move = [&](int64_t offset) {
    at::Tensor t = window.narrow(1, offset, seq_len_).contiguous();
    return gpu ? t.pin_memory().to(device, /*non_blocking=*/true) : t;
  };
  b.tokens = move(0);
  b.targets = move(1);
  return b;
}

std::string DataLoader::describe() const { return source_->describe(); }

}  // namespace trainplan::executor
