#include "trainplan/planner/profile.hpp"

#include <algorithm>
#include <cmath>
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
    if (line.empty()) continue;
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

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const ElementwiseOpInfo* op_named(const std::string& name) {
  for (const auto& info : elementwise_ops()) {
    if (name == info.name) return &info;
  }
  return nullptr;
}

}  // namespace

Result<KernelImport> import_kernel_csv(const std::vector<std::string>& files, double fallback_latency) {
  KernelImport out;
  KernelTables& k = out.tables;
  std::map<std::tuple<double, double, double>, std::vector<double>> gemm;
  std::map<std::tuple<double, double, double, double>, std::pair<double, double>> attention;  // forward, forward+backward
  std::vector<double> adamw, copy;
  // (op, elements) -> forward, backward seconds; (op, width) -> {tokens: forward seconds} for the latency fit
  std::map<std::pair<int, double>, std::vector<std::pair<double, double>>> elementwise;
  std::map<std::pair<std::string, std::string>, std::map<double, double>> by_size;

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
          gemm[{*m, *n, *kk}].push_back(*s);
        } else if (kind == "sdpa_fwd" || kind == "sdpa_fwdbwd") {
          auto batch = num("m"), seq = num("n"), d = num("k"), s = num("seconds");
          for (auto* r : {&batch, &seq, &d, &s}) {
            if (!*r) return r->error();
          }
          const std::string extra = cells.size() > 4 ? cells[4] : "";
          double heads = 0;
          if (extra.rfind("heads", 0) == 0) heads = std::atof(extra.c_str() + 5);
          if (!(heads > 0)) return Error{t.file + ":" + std::to_string(line) + ": column extra: expected headsN (got \"" + extra + "\")"};
          auto& entry = attention[{*d, *seq, heads, *batch}];
          (kind == "sdpa_fwd" ? entry.first : entry.second) = *s;
        } else if (kind.rfind("adamw_fused", 0) == 0) {
          auto rate = num("tflops_or_gbps");
          if (!rate) return rate.error();
          adamw.push_back(*rate);
        } else if (kind == "copy") {
          auto rate = num("tflops_or_gbps");
          if (!rate) return rate.error();
          copy.push_back(*rate);
        } else {
          return Error{t.file + ":" + std::to_string(line) + ": unknown kind \"" + kind +
                       "\" (expected gemm_*, sdpa_fwd, sdpa_fwdbwd, adamw_fused_*, copy)"};
        }
      }
    } else if (t.column("op") >= 0 && t.column("seconds_fwd") >= 0) {
      for (const auto& [line, cells] : t.rows) {
        const std::string name = cells.empty() ? "" : cells[0];
        if (name.rfind("launch", 0) == 0) continue;  // host launch overhead, not a kernel rate
        const ElementwiseOpInfo* info = op_named(name);
        if (info == nullptr) return Error{t.file + ":" + std::to_string(line) + ": unknown op \"" + name + "\""};
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
        elementwise[{static_cast<int>(info->op), *tokens * width}].push_back({*fwd, *bwd});
        by_size[{name, width_text}][*tokens] = *fwd;
      }
    } else {
      return Error{file + ": unknown CSV header (expected kind,m,n,k,extra,seconds,tflops_or_gbps or op,tokens,width,dtype,seconds_fwd,seconds_bwd)"};
    }
  }
  if (gemm.empty()) return Error{"no gemm_* rows in the CSV files: a kernel table needs measured GEMMs"};
  if (attention.empty()) return Error{"no sdpa_fwd / sdpa_fwdbwd rows in the CSV files: a kernel table needs measured attention"};
  if (copy.empty()) return Error{"no copy row in the CSV files: the copy bandwidth is needed for streaming kernels"};

  // Kernel latency: intercepts of element-wise ops timed at two sizes, per kernel.
  std::vector<double> intercepts;
  for (const auto& [key, sizes] : by_size) {
    if (sizes.size() < 2) continue;
    const auto first = sizes.begin();
    const auto second = std::next(first);
    if (second->first != 2 * first->first) continue;
    const double intercept = (2 * first->second - second->second) / op_named(key.first)->forward_kernels;
    if (intercept > 0) intercepts.push_back(intercept);
  }
  k.kernel_latency = intercepts.empty() ? fallback_latency : std::round(std::clamp(median(intercepts), 0.5e-6, 20e-6) * 1e8) / 1e8;  // 0.01 us
  out.notes.push_back(intercepts.empty() ? "kernel latency: not measurable from these files, the base profile's min_kernel_us"
                                         : "kernel latency: median intercept of " + std::to_string(intercepts.size()) +
                                               " element-wise ops timed at two sizes");
  k.copy_bandwidth = median(copy) * 1e9;
  k.adamw_fused_bandwidth = adamw.empty() ? 0 : median(adamw) * 1e9;
  k.gemm_dtype = Dtype::kBf16;
  for (const auto& [shape, seconds] : gemm) {
    double sum = 0;
    for (double s : seconds) sum += s;
    k.gemm.push_back({std::get<0>(shape), std::get<1>(shape), std::get<2>(shape), sum / seconds.size()});
    out.merged_duplicates += static_cast<int>(seconds.size()) - 1;
  }
  for (const auto& [key, times] : attention) {
    const auto [fwd, both] = times;
    if (!(fwd > 0) || !(both > fwd)) {
      return Error{"attention head_dim " + std::to_string(std::get<0>(key)) + ", seq_len " + std::to_string(std::get<1>(key)) +
                   ": needs an sdpa_fwd row and a longer sdpa_fwdbwd row"};
    }
    k.attention.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), std::get<3>(key), fwd, both - fwd});
  }
  for (const auto& [key, samples] : elementwise) {
    double f = 0, b = 0;
    for (const auto& [fs, bs] : samples) {
      f += fs;
      b += bs;
    }
    k.elementwise[static_cast<std::size_t>(key.first)].push_back({key.second, f / samples.size(), b / samples.size()});
    out.merged_duplicates += static_cast<int>(samples.size()) - 1;
    ++out.elementwise_rows;
  }
  out.gemm_rows = static_cast<int>(k.gemm.size());
  out.attention_rows = static_cast<int>(k.attention.size());
  std::string list;  // file names without their directories: a profile names no machine's paths
  for (const auto& f : files) list += (list.empty() ? "" : ", ") + f.substr(f.find_last_of('/') == std::string::npos ? 0 : f.find_last_of('/') + 1);
  k.source = "imported by `planner profile --from-csv` from " + list;
  return out;
}

HardwareProfile with_kernel_tables(HardwareProfile base, const KernelImport& import, const std::string& name) {
  auto tables = std::make_shared<KernelTables>(import.tables);
  tables->prepare(base.gpu.sm_count);
  base.gpu.kernels = std::move(tables);
  if (!name.empty()) base.name = name;
  return base;
}

}  // namespace trainplan::planner
