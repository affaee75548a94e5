#include "text_table.hpp"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <sstream>

namespace trainplan::planner::detail {

std::string wrap_text(const std::string& text, std::size_t width, const std::string& indent) {
  if (width == 0) return indent + text + "\n";
  std::string out, line;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (!line.empty() && indent.size() + line.size() + 1 + word.size() > width) {
      out += indent + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    start = end + 1;
  }
  if (!line.empty()) out += indent + line + "\n";
  return out;
}

std::string fmt(const char* format, ...) {
  va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string out(static_cast<std::size_t>(std::max(n, 0)) + 1, '\0');
  std::vsnprintf(out.data(), out.size(), format, again);
  va_end(again);
  out.resize(static_cast<std::size_t>(std::max(n, 0)));
  return out;
}

std::string table(const std::vector<std::string>& header, const std::vector<Row>& rows, bool markdown,
                  const std::vector<bool>& right_align) {
  std::vector<std::size_t> width(header.size());
  for (std::size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const auto& r : rows)
    for (std::size_t i = 0; i < r.cells.size(); ++i) width[i] = std::max(width[i], r.cells[i].size());
  std::ostringstream out;
  const auto line = [&](const std::vector<std::string>& cells) {
    if (markdown) out << "|";
    for (std::size_t i = 0; i < cells.size(); ++i) {
      const std::string pad(width[i] - cells[i].size(), ' ');
      out << (markdown ? " " : "  ");
      out << (right_align[i] ? pad + cells[i] : cells[i] + pad);
      if (markdown) out << " |";
    }
    out << "\n";
  };
  line(header);
  if (markdown) {
    out << "|";
    for (std::size_t i = 0; i < header.size(); ++i) out << (right_align[i] ? std::string(width[i] + 1, '-') + ":|" : std::string(width[i] + 2, '-') + "|");
    out << "\n";
  }
  for (const auto& r : rows) line(r.cells);
  return out.str();
}

}  // namespace trainplan::planner::detail
