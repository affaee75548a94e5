// The validation report: aligned text, Markdown and `trainplan/validation/v1` JSON.

#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "text_table.hpp"
#include "trainplan/planner/validate.hpp"

namespace trainplan::planner {

using detail::fmt;
using detail::Row;

namespace {

// Four significant digits, never in exponent form from 1000 up: 137, 149.2, 1.875, 0.12, 6554.
std::string number_text(double x) { return std::fabs(x) >= 1000 ? fmt("%.0f", x) : fmt("%.4g", x); }

std::string percent(double fraction) { return fmt("%.1f%%", 100 * fraction); }
std::string signed_percent(double fraction) { return fmt("%+.1f%%", 100 * fraction); }

// The row with the largest |error|; nullptr for a table without rows.
const ValidationRow* worst_row(const ValidationTable& table) {
  const ValidationRow* worst = nullptr;
  for (const ValidationRow& row : table.rows) {
    if (!worst || std::fabs(row.error) > std::fabs(worst->error)) worst = &row;
  }
  return worst;
}

std::string closing_line(const ValidationTable& table) {
  const ValidationRow* worst = worst_row(table);
  if (!worst) return "No rows.";
  return fmt("%zu rows, MAPE ", table.rows.size()) + percent(table.mape) + ", worst " + signed_percent(worst->error) + " (" +
         worst->label + ").";
}

std::string table_section(const ValidationTable& table, bool markdown) {
  std::vector<Row> rows;
  for (const ValidationRow& r : table.rows) {
    rows.push_back(Row{{r.label, number_text(r.published), number_text(r.predicted), signed_percent(r.error), r.note}});
  }
  const std::vector<std::string> header = {"configuration", table.reference, "predicted", "error", "note"};
  std::ostringstream out;
  if (markdown) {
    out << "## " << table.title << " (" << table.quantity << ")\n\n";
    out << "Source: " << table.source << ". Runs: " << table.run_kind << ". Table id `" << table.id << "`.\n\n";
  } else {
    out << table.title << " (" << table.quantity << ")\n";
    out << "  source: " << table.source << "\n";
    out << "  runs: " << table.run_kind << "\n";
  }
  out << detail::table(header, rows, markdown, {false, true, true, true, false});
  out << (markdown ? "\n" : "  ") << closing_line(table) << "\n\n";
  return out.str();
}

// Text tables pad their last column; a report has no trailing blanks.
std::string without_trailing_blanks(const std::string& text) {
  std::ostringstream out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    line.erase(line.find_last_not_of(' ') + 1);
    out << line << "\n";
  }
  return out.str();
}

std::string summary_section(const std::vector<ValidationTable>& tables, bool markdown) {
  std::vector<Row> rows;
  for (const ValidationTable& t : tables) {
    const ValidationRow* worst = worst_row(t);
    rows.push_back(Row{{t.title, t.run_kind, t.quantity, std::to_string(t.rows.size()), percent(t.mape), worst ? signed_percent(worst->error) : "-",
                        t.mape > kValidationMapeGoal ? t.missing : ""}});
  }
  std::ostringstream out;
  out << (markdown ? "## Summary\n\n" : "Summary\n");
  out << detail::table({"table", "runs", "quantity", "rows", "MAPE", "worst", "still missing (MAPE above 10%)"}, rows, markdown,
                       {false, false, false, true, true, true, false});
  return out.str();
}

}  // namespace

nlohmann::json validation_to_json(const std::vector<ValidationTable>& tables) {
  nlohmann::json out_tables = nlohmann::json::array();
  nlohmann::json summary = nlohmann::json::array();
  for (const ValidationTable& t : tables) {
    nlohmann::json rows = nlohmann::json::array();
    for (const ValidationRow& r : t.rows) {
      rows.push_back({{"label", r.label}, {"published", r.published}, {"predicted", r.predicted}, {"error", r.error}, {"note", r.note}, {"fits", r.fits}});
    }
    out_tables.push_back({{"id", t.id},
                          {"title", t.title},
                          {"quantity", t.quantity},
                          {"source", t.source},
                          {"reference", t.reference},
                          {"run_kind", t.run_kind},
                          {"missing", t.missing},
                          {"mape", t.mape},
                          {"max_abs_error", t.max_abs_error},
                          {"rows", std::move(rows)}});
    summary.push_back({{"id", t.id}, {"rows", t.rows.size()}, {"mape", t.mape}, {"max_abs_error", t.max_abs_error}});
  }
  return {{"schema", kValidationSchema}, {"tables", std::move(out_tables)}, {"summary", std::move(summary)}};
}

std::string render_validation(const std::vector<ValidationTable>& tables, Format format) {
  if (format == Format::kJson) return validation_to_json(tables).dump(2) + "\n";
  const bool markdown = format == Format::kMarkdown;
  std::ostringstream out;
  out << (markdown ? "# " : "") << "trainplan validation: the cost model against published figures and measurements\n\n";
  const std::string intro =
      "Each row predicts a published (or measured) figure for the configuration that produced it; "
      "error = predicted / published - 1; MAPE is the mean |error| of a table. Regenerate with `planner validate`.";
  out << (markdown ? intro : "  " + intro) << "\n\n";
  for (const ValidationTable& t : tables) out << table_section(t, markdown);
  out << summary_section(tables, markdown);
  return markdown ? out.str() : without_trailing_blanks(out.str());
}

}  // namespace trainplan::planner
