#include "trainplan/planner/profile.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>


namespace trainplan::planner {

using namespace trainplan::costmodel;

namespace {

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  std::istringstream in(line);
  while (std::getline(in, cell, ',')) out.push_back(cell);
  if (!line.empty() && line.back() == ',') out.push_back("");
  return out;
}

struct Table {
  std::string file;
  std::vector<std::string> header;
  std::vector<std::pair<int, std::vector<std::string>>> rows;  // (line number, cells)
  [[nodiscard]] int column(const std::string& name) const {
    const auto it = std::find(header.begin(), header.end(), name);
    return it == header.end() ? -1 : static_cast<int>(it - header.begin());
  }
};

Result<Table> read_table(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Error{path + ": cannot read"};
  Table t{path, {}, {}};
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;  // blank lines and comments (a copy's citation)
    if (t.header.empty()) t.header = split_csv(line);
    else t.rows.emplace_back(number, split_csv(line));
  }
  if (t.header.empty()) return Error{path + ": empty file (expected a CSV header)"};
  return t;
}

// A finite number > 0 from a cell, or an error naming file, line and column.
Result<double> positive(const Table& t, int line, const std::vector<std::string>& cells, const std::string& column) {
  const int c = t.column(column);
  const std::string where = t.file + ":" + std::to_string(line) + ": column " + column;
  if (c < 0 || c >= static_cast<int>(cells.size())) return Error{where + ": missing"};
  try {
    std::size_t used = 0;
    const double v = std::stod(cells[static_cast<std::size_t>(c)], &used);
    if (used != cells[static_cast<std::size_t>(c)].size() || !std::isfinite(v) || v <= 0) throw std::invalid_argument("");
    return v;
  } catch (const std::exception&) {
    return Error{where + ": must be a finite number > 0 (got \"" + cells[static_cast<std::size_t>(c)] + "\")"};
  }
}

}  // namespace

Result<KernelImport> import_kernel_csv(const std::vector<std::string>& files, double fallback_latency) {
  KernelSamples samples;
  // (batch, seq_len, head_dim, heads) -> forward, forward+backward times: the CSV gives them on
  // rows of their own, each possibly more than once (averaged).
  std::map<std::tuple<double, double, double, double>, std::pair<std::vector<double>, std::vector<double>>> attention;

  for (const std::string& file : files) {
    auto table = read_table(file);
    if (!table) return table.error();
    const Table& t = *table;
    if (t.column("kind") >= 0 && t.column("seconds") >= 0) {
      for (const auto& [line, cells] : t.rows) {
        const std::string kind = cells.empty() ? "" : cells[0];
        const auto num = [&](const char* column) { return positive(t, line, cells, column); };
        if (kind.rfind("gemm", 0) == 0) {
          auto m = num("m"), n = num("n"), kk = num("k"), s = num("seconds");
          for (auto* r : {&m, &n, &kk, &s}) {
            if (!*r) return r->error();
          }
          samples.gemm.push_back({*m, *n, *kk, *s});
        } else if (kind == "sdpa_fwd" || kind == "sdpa_fwdbwd") {
          auto batch = num("m"), seq = num("n"), d = num("k"), s = num("seconds");
          for (auto* r : {&batch, &seq, &d, &s}) {
            if (!*r) return r->error();
          }
          const std::string extra = cells.size() > 4 ? cells[4] : "";
          double heads = 0;
          if (extra.rfind("heads", 0) == 0) heads = std::atof(extra.c_str() + 5);
          if (!(heads > 0)) return Error{t.file + ":" + std::to_string(line) + ": column extra: expected headsN (got \"" + extra + "\")"};
          auto& entry = attention[{*batch, *seq, *d, heads}];
          (kind == "sdpa_fwd" ? entry.first : entry.second).push_back(*s);
        } else if (kind.rfind("adamw_fused", 0) == 0) {
          auto rate = num("tflops_or_gbps");
          if (!rate) return rate.error();
          samples.adamw_fused_gb_per_s.push_back(*rate);
        } else if (kind == "copy") {
          auto rate = num("tflops_or_gbps");
          if (!rate) return rate.error();
          samples.copy_gb_per_s.push_back(*rate);
        } else {
          return Error{t.file + ":" + std::to_string(line) + ": unknown kind \"" + kind +
                       "\" (expected gemm_*, sdpa_fwd, sdpa_fwdbwd, adamw_fused_*, copy)"};
        }
      }
    } else if (t.column("op") >= 0 && t.column("seconds_fwd") >= 0) {
      for (const auto& [line, cells] : t.rows) {
        const std::string name = cells.empty() ? "" : cells[0];
        if (name.rfind("launch", 0) == 0) continue;  // host launch overhead, not a kernel rate
        if (elementwise_op_named(name) == nullptr) return Error{t.file + ":" + std::to_string(line) + ": unknown op \"" + name + "\""};
        auto tokens = positive(t, line, cells, "tokens"), fwd = positive(t, line, cells, "seconds_fwd"), bwd = positive(t, line, cells, "seconds_bwd");
        for (auto* r : {&tokens, &fwd, &bwd}) {
          if (!*r) return r->error();
        }
        const int wc = t.column("width");
        const std::string width_text = wc >= 0 && wc < static_cast<int>(cells.size()) ? cells[static_cast<std::size_t>(wc)] : "";
        // "128256x2048" (embedding: rows x hidden) counts the hidden size.
        const std::string last = width_text.substr(width_text.find('x') == std::string::npos ? 0 : width_text.find('x') + 1);
        const double width = std::atof(last.c_str());
        if (!(width > 0)) return Error{t.file + ":" + std::to_string(line) + ": column width: expected a number or ROWSxHIDDEN (got \"" + width_text + "\")"};
        samples.elementwise.push_back({name, *tokens, width, width_text, *fwd, *bwd});
      }
    } else {
      return Error{file + ": unknown CSV header (expected kind,m,n,k,extra,seconds,tflops_or_gbps or op,tokens,width,dtype,seconds_fwd,seconds_bwd)"};
    }
  }
  const auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
  };
  int repeated = 0;
  for (const auto& [key, times] : attention) {
    repeated += static_cast<int>(std::max(times.first.size(), std::size_t{1}) + std::max(times.second.size(), std::size_t{1})) - 2;
    samples.attention.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), std::get<3>(key), mean(times.first), mean(times.second)});
  }
  if (samples.gemm.empty()) return Error{"no gemm_* rows in the CSV files: a kernel table needs measured GEMMs"};
  if (samples.attention.empty()) return Error{"no sdpa_fwd / sdpa_fwdbwd rows in the CSV files: a kernel table needs measured attention"};
  if (samples.copy_gb_per_s.empty()) return Error{"no copy row in the CSV files: the copy bandwidth is needed for streaming kernels"};
  auto out = build_kernel_tables(samples, fallback_latency);
  if (!out) return out.error();
  std::string list;  // file names without their directories: a profile names no machine's paths
  for (const auto& f : files) list += (list.empty() ? "" : ", ") + f.substr(f.find_last_of('/') == std::string::npos ? 0 : f.find_last_of('/') + 1);
  KernelImport imported = std::move(out).value();
  imported.merged_duplicates += repeated;
  imported.tables.source = "imported by `planner profile --from-csv` from " + list;
  return imported;
}

}  // namespace trainplan::planner
