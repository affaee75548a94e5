#pragma once
// The published tables `planner validate` reproduces: the CSV files of tests/data (each row cites
// its paper) and the hardware profile they need, compiled into the planner library
// (cmake/EmbedPresets.cmake) so the validation runs from any working directory. The files in
// tests/data stay the single source of truth. Plus the small CSV reader they need.

#include <map>
#include <string>
#include <vector>

#include "trainplan/costmodel/presets.hpp"
#include "trainplan/costmodel/result.hpp"

namespace trainplan::planner {

// Every embedded file: name (file stem, "megatron2021_table1"), source path at build time, text.
const std::vector<costmodel::EmbeddedDocument>& embedded_published_data();

// The text of the embedded file named `name` (its stem). The error lists the names there are.
[[nodiscard]] costmodel::Result<std::string> published_data_text(const std::string& name);

// One data row of a CSV table: cells by header name, and where it was read (for messages).
struct CsvRow {
  int line = 0;  // 1-based line in the file
  std::map<std::string, std::string> cells;
};

// Rows of CSV text whose first non-comment line is the header. Lines starting with '#' and empty
// lines are skipped; cells are split at commas (quoted cells are not supported: our data has
// none); missing trailing cells read as "". A row with more cells than the header is an error
// naming `file` and the line.
[[nodiscard]] costmodel::Result<std::vector<CsvRow>> parse_csv(const std::string& text, const std::string& file);

}  // namespace trainplan::planner
