#pragma once
// Private to planner: printf-style formatting into a std::string and aligned text or Markdown
// tables, shared by the reports.

#include <string>
#include <vector>

namespace trainplan::planner::detail {

// printf into a std::string (at most 511 characters).
[[nodiscard]] std::string fmt(const char* format, ...) __attribute__((format(printf, 1, 2)));

// `text` broken at spaces into lines of at most `width` characters (a longer word stays whole),
// each line led by `indent` and ended by a newline; width 0: one line.
[[nodiscard]] std::string wrap_text(const std::string& text, std::size_t width, const std::string& indent);

struct Row {
  std::vector<std::string> cells;
};

// Columns padded to their widest cell, two spaces apart and indented by two; `markdown` gives a
// pipe table with a separator line instead. REQUIRES: every row has header.size() cells and
// right_align.size() == header.size().
[[nodiscard]] std::string table(const std::vector<std::string>& header, const std::vector<Row>& rows, bool markdown,
                                const std::vector<bool>& right_align);

}  // namespace trainplan::planner::detail
