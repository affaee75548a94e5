// Synthetic and memory-mapped token data (see data.hpp).

#include "data.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace trainplan::executor {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Item `index` of an endless sequence of epochs over `count` items, each epoch a fresh seeded
// permutation: a pure function of (seed, index), computed once per epoch.
class EpochOrder {
 public:
  EpochOrder(uint64_t seed, int64_t count) : seed_(seed), count_(count) {}
  int64_t operator()(int64_t index) {
    const int64_t epoch = index / count_;
    if (epoch != epoch_) {
      order_.resize(static_cast<std::size_t>(count_));
      std::iota(order_.begin(), order_.end(), 0);
      std::mt19937_64 rng(splitmix64(seed_ + static_cast<uint64_t>(epoch)));
      std::shuffle(order_.begin(), order_.end(), rng);
      epoch_ = epoch;
    }
    return order_[static_cast<std::size_t>(index % count_)];
  }

 private:
  uint64_t seed_;
  int64_t count_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
};

}  // namespace

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Writes `count` tokens of sample `index` (global, any non-negative value) into out.
  virtual void sample(int64_t index, int64_t count, int64_t* out) = 0;
  [[nodiscard]] virtual std::string describe() const = 0;
  // Sets the targets of sample `index` that take no loss ([count], the tokens shifted by one) to
  // kIgnoredTarget; returns how many take one.
  virtual int64_t mask_targets(int64_t /*index*/, int64_t count, int64_t* /*targets*/) { return count; }
  [[nodiscard]] virtual bool masked() const { return false; }
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
      : path_(path), token_bytes_(token_bytes), seq_len_(seq_len), vocab_(vocab) {
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
    order_ = EpochOrder(seed, windows_);
  }
  ~FileSource() override {
    if (map_ != MAP_FAILED && map_ != nullptr) ::munmap(map_, bytes_);
    if (fd_ >= 0) ::close(fd_);
  }
  void sample(int64_t index, int64_t count, int64_t* out) override {
    const int64_t start = order_(index) * seq_len_;
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
  std::string path_;
  int token_bytes_;
  int64_t seq_len_;
  int64_t vocab_;
  int fd_ = -1;
  void* map_ = nullptr;
  std::size_t bytes_ = 0;
  int64_t tokens_ = 0, windows_ = 0;
  EpochOrder order_{0, 1};  // over the windows, set once they are counted
};

// Text to token ids: bytes (ids 0-255, then BOS 256, EOS 257, PAD 258), or a vocabulary's pieces
// matched greedily, longest first (not the tokenizer's BPE merges: ids may differ from its), in
// the vocabulary's alphabet: a byte-level BPE vocabulary's (GPT-2, Llama 3: it has "Ġ", each byte
// is first mapped to its printable stand-in, GPT-2's bytes_to_unicode), a SentencePiece one's
// (Llama 2: it has "▁" pieces, the text is prefixed with and its spaces replaced by "▁"), else the
// text's bytes as they are; a byte no piece covers takes the byte-fallback piece "<0xNN>".
class Tokenizer {
 public:
  Tokenizer(const std::string& vocab_path, int64_t model_vocab) {
    if (vocab_path.empty()) {
      if (model_vocab < 259) {
        throw DataError("byte-level tokens need a vocabulary of at least 259 (256 bytes, BOS, EOS, PAD); the model has " +
                        std::to_string(model_vocab) + " (give --vocab)");
      }
      bos_ = 256;
      eos_ = 257;
      pad_ = 258;
      describe_ = "bytes";
      return;
    }
    std::ifstream in(vocab_path);
    if (!in) throw DataError(vocab_path + ": cannot open the vocabulary: " + std::strerror(errno));
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw DataError(vocab_path + ": not JSON: " + e.what());
    }
    if (j.is_object() && j.contains("model") && j["model"].is_object() && j["model"].contains("vocab")) j = j["model"]["vocab"];  // tokenizer.json
    if (!j.is_object() || j.empty()) throw DataError(vocab_path + ": expected a JSON object of piece -> id (or a tokenizer.json with model.vocab)");
    for (const auto& [piece, id] : j.items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= model_vocab) {
        throw DataError(vocab_path + ": piece " + nlohmann::json(piece).dump() + " has id " + id.dump() + ", outside the model's vocabulary of " +
                        std::to_string(model_vocab));
      }
      pieces_[piece] = id.get<int64_t>();
      longest_ = std::max(longest_, piece.size());
    }
    const auto first_of = [&](std::initializer_list<const char*> names) -> int64_t {
      for (const char* n : names) {
        if (const auto f = pieces_.find(n); f != pieces_.end()) return f->second;
      }
      return -1;
    };
    bos_ = first_of({"<s>", "<|begin_of_text|>", "<bos>"});
    eos_ = first_of({"</s>", "<|end_of_text|>", "<|eot_id|>", "<eos>"});
    pad_ = first_of({"<pad>", "<|finetune_right_pad_id|>"});
    if (pad_ < 0) pad_ = eos_ >= 0 ? eos_ : 0;  // padding takes no loss: any id does
    byte_level_ = pieces_.count("\xC4\xA0") != 0;  // "Ġ", the space's stand-in
    sentencepiece_ = !byte_level_ && (pieces_.count(kSpace) != 0 || std::any_of(pieces_.begin(), pieces_.end(), [](const auto& p) {
                                        return p.first.rfind(kSpace, 0) == 0;
                                      }));
    describe_ = vocab_path + " (" + std::to_string(pieces_.size()) + " pieces)";
  }
  // Appends the ids of `input` to `out`; `where` names the example in errors.
  void encode(const std::string& input, std::vector<int64_t>& out, const std::string& where) const {
    if (pieces_.empty()) {
      for (unsigned char c : input) out.push_back(c);
      return;
    }
    std::string text;
    if (byte_level_) {
      for (unsigned char c : input) text += byte_stand_in(c);
    } else if (sentencepiece_) {
      text = kSpace;
      for (char c : input) text += c == ' ' ? std::string(kSpace) : std::string(1, c);
    } else {
      text = input;
    }
    std::size_t i = 0;
    while (i < text.size()) {
      std::size_t length = std::min(longest_, text.size() - i);
      for (; length > 0; --length) {
        if (const auto f = pieces_.find(text.substr(i, length)); f != pieces_.end()) {
          out.push_back(f->second);
          break;
        }
      }
      if (length == 0) {
        char fallback[8];
        std::snprintf(fallback, sizeof fallback, "<0x%02X>", static_cast<unsigned char>(text[i]));
        const auto f = pieces_.find(fallback);
        if (f == pieces_.end()) {
          throw DataError(where + ": byte " + std::to_string(i) + " (" + fallback + ") matches no piece of the vocabulary and it has no byte fallback");
        }
        out.push_back(f->second);
        length = 1;
      }
      i += length;
    }
  }
  static constexpr const char* kSpace = "\xE2\x96\x81";  // "▁", SentencePiece's space
  // GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for U+0100 on, as UTF-8.
  static std::string byte_stand_in(unsigned char b) {
    static const std::vector<std::string> table = [] {
      std::vector<int> code(256, -1);
      for (int c = '!'; c <= '~'; ++c) code[static_cast<std::size_t>(c)] = c;
      for (int c = 0xA1; c <= 0xAC; ++c) code[static_cast<std::size_t>(c)] = c;
      for (int c = 0xAE; c <= 0xFF; ++c) code[static_cast<std::size_t>(c)] = c;
      int next = 256;
      for (int c = 0; c < 256; ++c) {
        if (code[static_cast<std::size_t>(c)] < 0) code[static_cast<std::size_t>(c)] = next++;
      }
      std::vector<std::string> utf8;
      for (int c : code) {
        std::string u;
        if (c < 0x80) u += static_cast<char>(c);
        else {
          u += static_cast<char>(0xC0 | (c >> 6));
          u += static_cast<char>(0x80 | (c & 0x3F));
        }
        utf8.push_back(u);
      }
      return utf8;
    }();
    return table[b];
  }
  [[nodiscard]] int64_t bos() const { return bos_; }
  [[nodiscard]] int64_t eos() const { return eos_; }
  [[nodiscard]] int64_t pad() const { return pad_; }
  [[nodiscard]] const std::string& describe() const { return describe_; }

 private:
  std::unordered_map<std::string, int64_t> pieces_;
  std::size_t longest_ = 0;
  bool byte_level_ = false, sentencepiece_ = false;
  int64_t bos_ = -1, eos_ = -1, pad_ = 0;
  std::string describe_;
};

// Instruction-tuning examples, one per sequence: BOS, the prompt, the response, EOS, cut to
// seq_len + 1 tokens and padded; the loss is taken on the response and its EOS only. Each epoch
// visits the examples in a fresh seeded order. Examples: {"prompt", "response"}, or Alpaca's
// {"instruction", "input" (optional), "output"} (prompt = instruction, a blank line, input).
class InstructionSource final : public TokenSource {
 public:
  InstructionSource(const std::string& path, const std::string& vocab, int64_t seq_len, uint64_t seed, int64_t model_vocab)
      : path_(path), seq_len_(seq_len), tokenizer_(vocab, model_vocab) {
    std::ifstream in(path);
    if (!in) throw DataError(path + ": cannot open: " + std::strerror(errno));
    const bool lines = ends_with(path, ".jsonl");
    std::vector<std::pair<nlohmann::json, std::string>> records;  // (record, where)
    if (lines) {
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string where = path + ":" + std::to_string(n);
        try {
          records.emplace_back(nlohmann::json::parse(line), where);
        } catch (const std::exception& e) {
          throw DataError(where + ": not JSON: " + e.what());
        }
      }
    } else {
      nlohmann::json all;
      try {
        all = nlohmann::json::parse(in);
      } catch (const std::exception& e) {
        throw DataError(path + ": not JSON: " + e.what());
      }
      if (!all.is_array()) throw DataError(path + ": expected a JSON array of examples (or a .jsonl file, one per line)");
      for (std::size_t i = 0; i < all.size(); ++i) records.emplace_back(all[i], path + ": /" + std::to_string(i));
    }
    for (const auto& [r, where] : records) add(r, where);
    if (examples_.empty()) throw DataError(path + ": no examples");
    order_ = EpochOrder(seed, static_cast<int64_t>(examples_.size()));
  }
  void sample(int64_t index, int64_t count, int64_t* out) override {
    const Example& e = example(index);
    for (int64_t i = 0; i < count; ++i) out[i] = i < static_cast<int64_t>(e.tokens.size()) ? e.tokens[static_cast<std::size_t>(i)] : tokenizer_.pad();
  }
  int64_t mask_targets(int64_t index, int64_t count, int64_t* targets) override {
    const Example& e = example(index);
    int64_t kept = 0;
    for (int64_t j = 0; j < count; ++j) {  // target j is token j + 1
      const bool loss = j + 1 >= e.prompt_end && j + 1 < static_cast<int64_t>(e.tokens.size());
      if (!loss) targets[j] = kIgnoredTarget;
      kept += loss ? 1 : 0;
    }
    return kept;
  }
  [[nodiscard]] bool masked() const override { return true; }
  std::string describe() const override {
    return path_ + " (" + std::to_string(examples_.size()) + " instruction examples, " + std::to_string(truncated_) + " cut to " +
           std::to_string(seq_len_ + 1) + " tokens; " + tokenizer_.describe() + "; loss on response tokens)";
  }

 private:
  struct Example {
    std::vector<int64_t> tokens;
    int64_t prompt_end = 0;  // the first response token
  };
  void add(const nlohmann::json& r, const std::string& where) {
    if (!r.is_object()) throw DataError(where + ": an example must be a JSON object");
    const auto text = [&](const char* key, bool required) -> std::string {
      if (!r.contains(key)) {
        if (required) throw DataError(where + ": no \"" + key + "\" (an example has prompt and response, or instruction and output)");
        return "";
      }
      if (!r[key].is_string()) throw DataError(where + ": \"" + key + "\" must be a string");
      return r[key].get<std::string>();
    };
    std::string prompt, response;
    if (r.contains("prompt") || !r.contains("instruction")) {
      prompt = text("prompt", true);
      response = text("response", true);
    } else {
      prompt = text("instruction", true);
      if (const std::string input = text("input", false); !input.empty()) prompt += "\n\n" + input;
      response = text("output", true);
    }
    Example e;
    if (tokenizer_.bos() >= 0) e.tokens.push_back(tokenizer_.bos());
    tokenizer_.encode(prompt, e.tokens, where + " prompt");
    e.prompt_end = static_cast<int64_t>(e.tokens.size());
    tokenizer_.encode(response, e.tokens, where + " response");
    if (tokenizer_.eos() >= 0) e.tokens.push_back(tokenizer_.eos());
    if (static_cast<int64_t>(e.tokens.size()) > seq_len_ + 1) {
      e.tokens.resize(static_cast<std::size_t>(seq_len_ + 1));
      ++truncated_;
    }
    if (e.prompt_end >= static_cast<int64_t>(e.tokens.size())) {
      throw DataError(where + ": the prompt fills the whole sequence of " + std::to_string(seq_len_ + 1) + " tokens: no response token is left to train on");
    }
    examples_.push_back(std::move(e));
  }
  const Example& example(int64_t index) {
    return examples_[static_cast<std::size_t>(order_(index))];
  }

  std::string path_;
  int64_t seq_len_;
  Tokenizer tokenizer_;
  std::vector<Example> examples_;
  int64_t truncated_ = 0;
  EpochOrder order_{0, 1};  // over the examples, set once they are read
};

}  // namespace

DataLoader::DataLoader(const DataSpec& spec, int64_t vocab, int64_t seq_len) : vocab_(vocab), seq_len_(seq_len) {
  struct stat st {};
  if (spec.source != "synthetic" && ::stat(spec.source.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    throw DataError(spec.source + ": is a directory; give a token file, or instruction examples (*.jsonl or *.json)");
  }
  if (spec.source == "synthetic") source_ = std::make_unique<SyntheticSource>(spec.seed, vocab);
  else if (ends_with(spec.source, ".jsonl") || ends_with(spec.source, ".json")) source_ = std::make_unique<InstructionSource>(spec.source, spec.vocab, seq_len, spec.seed, vocab);
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
  at::Tensor tokens = window.narrow(1, 0, seq_len_).clone(), targets = window.narrow(1, 1, seq_len_).clone();
  if (source_->masked()) {
    for (int64_t i = 0; i < micro_batch; ++i) source_->mask_targets(first + i, seq_len_, targets.data_ptr<int64_t>() + i * seq_len_);
  }
  // To a GPU from pinned memory without waiting: a pageable copy would make the host wait for
  // the GPU to drain its queue before every micro-batch.
  const bool gpu = device.is_cuda();
  const auto move = [&](const at::Tensor& t) { return gpu ? t.pin_memory().to(device, /*non_blocking=*/true) : t; };
  b.tokens = move(tokens);
  b.targets = move(targets);
  return b;
}

std::string DataLoader::describe() const { return source_->describe(); }

bool DataLoader::masked() const { return source_->masked(); }

int64_t DataLoader::step_targets(int64_t step, int64_t global_batch) {
  if (!source_->masked()) return global_batch * seq_len_;
  std::vector<int64_t> scratch(static_cast<std::size_t>(seq_len_));
  int64_t total = 0;
  for (int64_t i = 0; i < global_batch; ++i) total += source_->mask_targets((step - 1) * global_batch + i, seq_len_, scratch.data());
  return total;
}

}  // namespace trainplan::executor
