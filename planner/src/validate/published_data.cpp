#include "trainplan/planner/published_data.hpp"

#include <sstream>

namespace trainplan::planner {

using costmodel::Error;
using costmodel::Result;

Result<std::string> published_data_text(const std::string& name) {
  std::string names;
  for (const auto& document : embedded_published_data()) {
    if (name == document.name) return std::string(document.text);
    names += (names.empty() ? "" : ", ") + std::string(document.name);
  }
  return Error{"no published table named \"" + name + "\" (there are: " + names + ")"};
}

Result<std::vector<CsvRow>> parse_csv(const std::string& text, const std::string& file) {
  std::vector<std::string> header;
  std::vector<CsvRow> rows;
  std::istringstream in(text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> cells;
    std::istringstream fields(line);
    std::string cell;
    while (std::getline(fields, cell, ',')) cells.push_back(cell);
    if (line.back() == ',') cells.emplace_back();
    if (header.empty()) {
      header = std::move(cells);
      continue;
    }
    if (cells.size() > header.size()) {
      return Error{file + ": line " + std::to_string(number) + ": " + std::to_string(cells.size()) + " cells, the header has " +
                   std::to_string(header.size())};
    }
    CsvRow row;
    row.line = number;
    for (std::size_t i = 0; i < header.size(); ++i) row.cells[header[i]] = i < cells.size() ? cells[i] : "";
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace trainplan::planner
