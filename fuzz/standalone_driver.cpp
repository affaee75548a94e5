// Runs the fuzz target without libFuzzer: deterministic mutations (bit flips, byte and token
// insertions, deletions, truncations, splices) of seed documents, for a bounded number of
// iterations. Usage: json_loaders_fuzz_standalone ITERATIONS SEED_FILE...
// Exit 0 when every input was handled; a crash or an escaping exception fails the test.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

const char* kTokens[] = {"-1", "0", "1e400", "-0", "1e308", "null", "true", "\"auto\"", "{}", "[]", "\"\"", "9007199254740993",
                         "\"tp\": 3", "\"zero_stage\": 7", "\"gpus\": 0", ",", ":", "\"", "\\u0000", "{\"a\":", "]]]]"};

std::string mutate(std::string s, std::mt19937_64& rng, const std::vector<std::string>& seeds) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < edits; ++i) {
    const std::size_t pos = s.empty() ? 0 : rng() % s.size();
    switch (rng() % 6) {
      case 0: if (!s.empty()) s[pos] = static_cast<char>(s[pos] ^ (1 << (rng() % 8))); break;
      case 1: s.insert(pos, kTokens[rng() % (sizeof kTokens / sizeof *kTokens)]); break;
      case 2: if (!s.empty()) s.erase(pos, 1 + rng() % 8); break;
      case 3: s.resize(pos); break;  // truncation
      case 4: {  // splice a piece of another seed
        const std::string& other = seeds[rng() % seeds.size()];
        if (!other.empty()) {
          const std::size_t from = rng() % other.size();
          s.insert(pos, other.substr(from, 1 + rng() % 40));
        }
        break;
      }
      default: {  // replace a number with another
        const std::size_t digit = s.find_first_of("0123456789", pos);
        if (digit != std::string::npos) s.replace(digit, 1, kTokens[rng() % 5]);
      }
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ITERATIONS SEED_FILE...\n", argv[0]);
    return 2;
  }
  const long iterations = std::strtol(argv[1], nullptr, 10);
  std::vector<std::string> seeds;
  for (int i = 2; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) { std::fprintf(stderr, "cannot read seed %s\n", argv[i]); return 2; }
    std::ostringstream text;
    text << in.rdbuf();
    seeds.push_back(text.str());
  }
  std::mt19937_64 rng(20261121);
  long handled = 0;
  for (const auto& s : seeds) { LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()); ++handled; }
  for (long i = 0; i < iterations; ++i) {
    const std::string input = mutate(seeds[rng() % seeds.size()], rng, seeds);
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
    ++handled;
  }
  std::printf("fuzz: %ld inputs handled without a crash\n", handled);
  return 0;
}
