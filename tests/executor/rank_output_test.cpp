// Messages a rank prints: every line carries its rank (executor/src/io/rank_output.hpp).

#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "rank_output.hpp"

namespace trainplan::executor {
namespace {

TEST(RankPrefixed, PrefixesEveryLineAndEndsWithANewline) {
  const std::pair<std::string, std::string> cases[] = {
      {"executor: error: x", "[rank 3] executor: error: x\n"},
      {"one\ntwo\n", "[rank 3] one\n[rank 3] two\n"},
      {"plan refused:\n  - a\n  - b", "[rank 3] plan refused:\n[rank 3]   - a\n[rank 3]   - b\n"},
      {"a\n\nb", "[rank 3] a\n[rank 3] \n[rank 3] b\n"},
      {"", "[rank 3] \n"},
  };
  for (const auto& [text, expected] : cases) EXPECT_EQ(rank_prefixed(3, text), expected) << text;
}

}  // namespace
}  // namespace trainplan::executor
