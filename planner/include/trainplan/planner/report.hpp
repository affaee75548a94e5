#pragma once
// Reports for people and machines: the search result or one evaluated plan as aligned text,
// Markdown, a standalone HTML page, JSON (`trainplan/search/v1`, `trainplan/estimate/v1`) or CSV.

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

// Human-readable numbers: 70.6 B, 1.2 M, 3.4 T.
[[nodiscard]] std::string si(double x, int precision = 3);

}  // namespace trainplan::planner
