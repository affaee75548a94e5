#pragma once
// Reports for people and machines: the search result or one evaluated plan as aligned text,
// Markdown, a standalone HTML page, JSON (`trainplan/search/v1`, `trainplan/estimate/v1`) or CSV.

#include <cstddef>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "trainplan/planner/search.hpp"

namespace trainplan::planner {

// kHtml: the Markdown report as one standalone HTML page (markdown_to_html).
enum class Format { kText, kMarkdown, kJson, kCsv, kHtml };

struct ReportContext {
  std::string command;          // the command line that produced it, for the record
  bool default_cluster = false; // the user gave no --cluster
  std::string train_tokens_note;  // "20 tokens per parameter (default)"
  std::string batch_note;       // "--global-batch-tokens 10000 rounded to whole sequences"
  std::string plan_path;        // where --save-plan wrote the recommended plan, if anywhere
  double memory_headroom = costmodel::kDefaultMemoryHeadroom;  // fraction of HBM capacity the search kept
};

[[nodiscard]] std::string render_search(const costmodel::PlanRequest& request, const SearchResult& result,
                                        const ReportContext& context, Format format);
[[nodiscard]] std::string render_evaluation(const Candidate& candidate, const ReportContext& context, Format format);

// The commands that run a plan with the executor, for a plan saved at `plan_path`.
[[nodiscard]] std::string executor_command(const costmodel::Plan& plan, const std::string& plan_path);

// The Markdown the reports write (headings "# " and "## ", list items "- ", pipe tables whose
// separator row sets the alignment, ``` blocks, paragraphs) as a standalone HTML5 page titled
// `title`, with a small inline style sheet; text is escaped. Other Markdown is kept as text.
[[nodiscard]] std::string markdown_to_html(const std::string& markdown, const std::string& title);

// Human-readable numbers: 70.6 B, 1.2 M, 3.4 T; past E (1e18) in scientific form (2.5e+21).
[[nodiscard]] std::string si(double x, int precision = 3);

// Bytes with a decimal unit ladder (GB = 1e9): 512 MB, 2.1 TB, 3.4 PB, 3 significant digits.
[[nodiscard]] std::string decimal_bytes_text(double bytes);

// `x` with `decimals` decimals ("%.2f") while that is at most `max_width` characters, else
// scientific with 3 significant digits ("1.23e+15"), so a huge value cannot widen a table without
// bound.
[[nodiscard]] std::string bounded_number(double x, int decimals, std::size_t max_width = 10);

// "1 micro-batch", "4 micro-batches": `count` and `noun`, plural unless count is 1.
[[nodiscard]] std::string count_text(double count, const std::string& noun, const std::string& plural_noun);

// `x` in the shortest text that reads back as the same double (std::to_chars), for CSV and other
// machine-read output: 85899345920, 0.1, 1.2345678901234567e+21.
[[nodiscard]] std::string full_precision(double x);

}  // namespace trainplan::planner
