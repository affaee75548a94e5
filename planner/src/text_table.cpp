#include "text_table.hpp"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <sstream>

namespace trainplan::planner::detail {

std::string fmt(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
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
