// Inputs as people type them (shared by the CLI and the GUI) and the HTML form of the reports.

#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "trainplan/planner/inputs.hpp"
#include "trainplan/planner/report.hpp"

namespace trainplan {
namespace {

using planner::apply_constraint;
using planner::markdown_to_html;
using planner::parse_count;

TEST(ParseCount, BinarySuffixesArePowersOf1024AndDecimalOnesOf1000) {
  struct Case {
    const char* text;
    bool binary;
    double expected;
  };
  const Case cases[] = {
      {"16M", true, 16.0 * 1048576}, {"16M", false, 16e6},   {"15T", false, 15e12}, {"2Ki", false, 2048},
      {"8192", true, 8192},          {"1.5G", false, 1.5e9}, {"3B", false, 3e9},    {"4k", true, 4096},
  };
  for (const auto& c : cases) {
    auto v = parse_count(c.text, c.binary, "x");
    ASSERT_TRUE(v.ok()) << c.text << ": " << v.error().message;
    EXPECT_DOUBLE_EQ(*v, c.expected) << c.text;
  }
}

TEST(ParseCount, RejectsWordsUnknownSuffixesAndNonPositiveValues) {
  struct Case {
    const char* text;
    const char* fragment;
  };
  const Case cases[] = {{"abc", "is not a number"}, {"8X", "unknown suffix \"X\""}, {"0", "must be a positive number"},
                        {"-5", "must be a positive number"}, {"", "is not a number"}, {"1e400", "is not a number"}};
  for (const auto& c : cases) {
    auto v = parse_count(c.text, true, "--seq-len");
    ASSERT_FALSE(v.ok()) << c.text;
    EXPECT_EQ(v.error().message.rfind("--seq-len: ", 0), 0u) << v.error().message;
    EXPECT_NE(v.error().message.find(c.fragment), std::string::npos) << v.error().message;
  }
}

TEST(ParseCount, TheUnknownSuffixErrorListsEveryAcceptedSuffix) {
  auto decimal = parse_count("15X", false, "--train-tokens");
  ASSERT_FALSE(decimal.ok());
  EXPECT_EQ(decimal.error().message, "--train-tokens: unknown suffix \"X\" in \"15X\" (accepted, in either case: K, M, G or B, T, P = powers of "
                                     "1000 here; Ki, Mi, Gi, Ti, Pi = powers of 1024; or no suffix)");
  auto binary = parse_count("4Q", true, "--global-batch-tokens");
  ASSERT_FALSE(binary.ok());
  EXPECT_NE(binary.error().message.find("K, M, G or B, T, P = powers of 1024 here"), std::string::npos) << binary.error().message;
  // Each listed suffix is accepted; "Bi" (billion is decimal) is not.
  for (const char* s : {"1K", "1M", "1G", "1B", "1T", "1P", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1k", "1p", "1pi"}) {
    EXPECT_TRUE(parse_count(s, false, "--train-tokens").ok()) << s;
  }
  EXPECT_FALSE(parse_count("1Bi", false, "--train-tokens").ok());
  EXPECT_DOUBLE_EQ(*parse_count("2Pi", false, "x"), 2 * std::pow(1024.0, 5));
  EXPECT_DOUBLE_EQ(*parse_count("2P", false, "x"), 2e15);
}

TEST(ApplyConstraint, FixesEachKeyAndNamesTheRuleOnBadValues) {
  costmodel::ParallelConstraints c;
  ASSERT_TRUE(apply_constraint("tp", "8", c).ok());
  ASSERT_TRUE(apply_constraint("zero", "3", c).ok());
  ASSERT_TRUE(apply_constraint("mb", "2", c).ok());
  ASSERT_TRUE(apply_constraint("schedule", "interleaved", c).ok());
  ASSERT_TRUE(apply_constraint("recompute", "full", c).ok());
  ASSERT_TRUE(apply_constraint("sp", "off", c).ok());
  EXPECT_EQ(c.tp, 8);
  EXPECT_EQ(c.zero_stage, 3);
  EXPECT_EQ(c.micro_batch, 2);
  EXPECT_EQ(c.schedule, costmodel::Schedule::kInterleaved);
  EXPECT_EQ(c.recompute, costmodel::Recompute::kFull);
  EXPECT_EQ(c.sequence_parallel, false);

  auto bad = apply_constraint("tp", "0", c);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "tp must be an integer in [1, 65536]");
  EXPECT_EQ(c.tp, 8) << "unchanged on error";
  EXPECT_FALSE(apply_constraint("zero", "4", c).ok());
  EXPECT_FALSE(apply_constraint("pp", "2x", c).ok());
  EXPECT_NE(apply_constraint("tensor", "2", c).error().message.find("unknown key \"tensor\""), std::string::npos);
}

TEST(MarkdownToHtml, WritesHeadingsListsAlignedTablesAndEscapedText) {
  const std::string md =
      "# Report <1>\n\n- Model  a & b\n- Cluster c\n\n## Top plans\n\n"
      "| # | recompute | step s |\n|--:|-----------|-------:|\n|  1 | full      |  12.50 |\n\n"
      "```\n  memory  GiB\n```\n\nWhy: fast.\nSecond line.\n";
  const std::string html = markdown_to_html(md, "t<i>tle");
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<title>t&lt;i&gt;tle</title>"), std::string::npos);
  EXPECT_NE(html.find("<h1>Report &lt;1&gt;</h1>"), std::string::npos) << html;
  EXPECT_NE(html.find("<ul>\n<li>Model  a &amp; b</li>\n<li>Cluster c</li>\n</ul>"), std::string::npos) << html;
  EXPECT_NE(html.find("<h2>Top plans</h2>"), std::string::npos);
  EXPECT_NE(html.find("<tr><th class=\"num\">#</th><th>recompute</th><th class=\"num\">step s</th></tr>"), std::string::npos) << html;
  EXPECT_NE(html.find("<tr><td class=\"num\">1</td><td>full</td><td class=\"num\">12.50</td></tr>"), std::string::npos) << html;
  EXPECT_NE(html.find("<pre>  memory  GiB\n</pre>"), std::string::npos) << html;
  EXPECT_NE(html.find("<p>Why: fast.<br>\nSecond line.</p>"), std::string::npos) << html;
  EXPECT_NE(html.find("</body>\n</html>\n"), std::string::npos);
}

}  // namespace
}  // namespace trainplan
