// markdown_to_html: the Markdown subset the reports write, as a standalone HTML page.

#include <sstream>
#include <string>
#include <vector>

#include "trainplan/planner/report.hpp"

namespace trainplan::planner {

namespace {

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  const auto last = s.find_last_not_of(" \t");
  return s.substr(first, last - first + 1);
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// The cells of a pipe-table line "| a | b |".
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::string body = trim(line);
  if (starts_with(body, "|")) body.erase(0, 1);
  if (!body.empty() && body.back() == '|') body.pop_back();
  std::size_t start = 0;
  while (true) {
    const auto bar = body.find('|', start);
    out.push_back(trim(body.substr(start, bar == std::string::npos ? std::string::npos : bar - start)));
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  return out;
}

bool is_separator_row(const std::string& line) {
  if (!starts_with(trim(line), "|")) return false;
  for (char c : line) {
    if (c != '|' && c != '-' && c != ':' && c != ' ') return false;
  }
  return line.find('-') != std::string::npos;
}

constexpr const char* kStyle =
    "body{font-family:sans-serif;max-width:72em;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:0.5em 0 1em}"
    "th,td{border:1px solid #ccc;padding:0.2em 0.6em;font-variant-numeric:tabular-nums}"
    "th{background:#f0f0f0}td.num,th.num{text-align:right}"
    "pre{background:#f6f6f6;padding:0.6em;overflow-x:auto}";

}  // namespace

std::string markdown_to_html(const std::string& markdown, const std::string& title) {
  std::vector<std::string> lines;
  {
    std::istringstream in(markdown);
    std::string line;
    while (std::getline(in, line)) lines.push_back(line);
  }
  std::ostringstream out;
  out << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" << escape(title)
      << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n";
  std::vector<std::string> paragraph;
  const auto flush_paragraph = [&] {
    if (paragraph.empty()) return;
    out << "<p>";
    for (std::size_t i = 0; i < paragraph.size(); ++i) out << (i ? "<br>\n" : "") << escape(paragraph[i]);
    out << "</p>\n";
    paragraph.clear();
  };
  bool in_list = false;
  const auto close_list = [&] {
    if (in_list) out << "</ul>\n";
    in_list = false;
  };
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    const std::string text = trim(line);
    if (starts_with(text, "```")) {
      flush_paragraph();
      close_list();
      out << "<pre>";
      for (++i; i < lines.size() && !starts_with(trim(lines[i]), "```"); ++i) out << escape(lines[i]) << "\n";
      out << "</pre>\n";
      continue;
    }
    if (starts_with(text, "|") && i + 1 < lines.size() && is_separator_row(lines[i + 1])) {
      flush_paragraph();
      close_list();
      const std::vector<std::string> header = cells(line);
      std::vector<bool> right;
      for (const auto& s : cells(lines[i + 1])) right.push_back(!s.empty() && s.back() == ':');
      right.resize(header.size(), false);
      const auto cls = [&](std::size_t k) { return k < right.size() && right[k] ? " class=\"num\"" : ""; };
      out << "<table>\n<thead><tr>";
      for (std::size_t k = 0; k < header.size(); ++k) out << "<th" << cls(k) << ">" << escape(header[k]) << "</th>";
      out << "</tr></thead>\n<tbody>\n";
      for (i += 2; i < lines.size() && starts_with(trim(lines[i]), "|"); ++i) {
        const std::vector<std::string> row = cells(lines[i]);
        out << "<tr>";
        for (std::size_t k = 0; k < row.size(); ++k) out << "<td" << cls(k) << ">" << escape(row[k]) << "</td>";
        out << "</tr>\n";
      }
      out << "</tbody>\n</table>\n";
      --i;
      continue;
    }
    if (text.empty()) {
      flush_paragraph();
      close_list();
      continue;
    }
    if (starts_with(text, "## ") || starts_with(text, "# ")) {
      flush_paragraph();
      close_list();
      const bool h1 = starts_with(text, "# ");
      out << (h1 ? "<h1>" : "<h2>") << escape(trim(text.substr(h1 ? 2 : 3))) << (h1 ? "</h1>\n" : "</h2>\n");
      continue;
    }
    if (starts_with(text, "- ")) {
      flush_paragraph();
      if (!in_list) out << "<ul>\n";
      in_list = true;
      out << "<li>" << escape(trim(text.substr(2))) << "</li>\n";
      continue;
    }
    close_list();
    paragraph.push_back(text);
  }
  flush_paragraph();
  close_list();
  out << "</body>\n</html>\n";
  return out.str();
}

}  // namespace trainplan::planner
