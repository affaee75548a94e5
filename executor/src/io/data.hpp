#pragma once
// Training data: deterministic synthetic sequences, a flat token file (uint16 or uint32,
// memory-mapped), or instruction-tuning examples (prompt and response, JSON Lines or a JSON array)
// tokenised byte by byte or with a given vocabulary, the loss taken on the response tokens only. The sampler is a pure function of (step, data-parallel rank, micro-batch), so
// every data-parallel rank reads distinct samples, a 1-rank run with the same global batch sees
// the same samples, and a resumed run continues exactly where it stopped.

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace trainplan::executor {

struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct DataSpec {
  std::string source = "synthetic";  // "synthetic" or a path to a token file
  int token_bytes = 2;               // 2 (uint16) or 4 (uint32) for token files
  uint64_t seed = 1234;
  // Instruction data (a source ending in .jsonl or .json): a vocabulary file (a JSON object of
  // piece -> id, or a Hugging Face tokenizer.json, whose model.vocab is read); empty: byte-level.
  std::string vocab;
};

// Targets that take no loss (instruction data: the prompt and the padding).
constexpr int64_t kIgnoredTarget = -1;

struct MicroBatch {
  at::Tensor tokens;   // [micro_batch, seq] int64
  at::Tensor targets;  // [micro_batch, seq] int64: tokens shifted by one, kIgnoredTarget where no loss is taken
};

class TokenSource;

class DataLoader {
 public:
  // Throws DataError naming the file when it cannot be opened or holds fewer than seq_len + 1
  // tokens.
  DataLoader(const DataSpec& spec, int64_t vocab, int64_t seq_len);
  ~DataLoader();
  // Samples (step - 1) * global_batch + dp_rank * (global_batch / dp) + micro_index * micro_batch
  // and the next micro_batch - 1. Throws DataError naming the file and token offset when a token
  // id is >= vocab. `step` counts from 1.
  [[nodiscard]] MicroBatch micro_batch(int64_t step, int dp_rank, int dp, int64_t global_batch, int64_t micro_batch,
                                       int64_t micro_index, const at::Device& device);
  [[nodiscard]] std::string describe() const;
  // Whether some targets are kIgnoredTarget (instruction data).
  [[nodiscard]] bool masked() const;
  // The targets that take a loss in step `step` over the whole global batch: the loss of a step is
  // their mean, whichever rank holds them (the trainer divides by this, not by each rank's count).
  [[nodiscard]] int64_t step_targets(int64_t step, int64_t global_batch);

 private:
  std::unique_ptr<TokenSource> source_;
  int64_t vocab_, seq_len_;
};

}  // namespace trainplan::executor
