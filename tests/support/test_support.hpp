#pragma once
// Test helpers: paths to tests/data (absolute, set by CMake, so no test depends on the working
// directory), a small CSV reader, and plan builders.

#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/presets.hpp"

namespace trainplan::testing {

inline std::string data_path(const std::string& name) { return std::string(TRAINPLAN_TEST_DATA_DIR) + "/" + name; }
inline std::string source_path(const std::string& name) { return std::string(TRAINPLAN_SOURCE_DIR) + "/" + name; }

// A file's bytes as they are.
inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Rows of a CSV file as maps from header to cell; lines starting with '#' are comments.
// Quoted cells are not needed by our data and not supported.
inline std::vector<std::map<std::string, std::string>> read_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<std::string> header;
  std::vector<std::map<std::string, std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) cells.push_back(cell);
    if (line.back() == ',') cells.emplace_back();
    if (header.empty()) { header = cells; continue; }
    std::map<std::string, std::string> row;
    for (std::size_t i = 0; i < header.size(); ++i) row[header[i]] = i < cells.size() ? cells[i] : "";
    rows.push_back(std::move(row));
  }
  return rows;
}

using costmodel::gpt_model;

inline costmodel::HardwareProfile cluster(const std::string& name) {
  auto hw = costmodel::find_hwprofile(name);
  if (!hw) throw std::runtime_error(hw.error().message);
  return *hw;
}

inline costmodel::HardwareProfile hwprofile_file(const std::string& path) {
  auto text = costmodel::read_text_file(path);
  if (!text) throw std::runtime_error(text.error().message);
  auto hw = costmodel::parse_hwprofile_text(*text, path);
  if (!hw) throw std::runtime_error(hw.error().message);
  return *hw;
}

inline costmodel::ModelSpec model(const std::string& name) {
  auto m = costmodel::find_model(name);
  if (!m) throw std::runtime_error(m.error().message);
  return *m;
}

// A plan with every GPU in data parallelism (dp = gpus) and default training settings;
// tests set the parallel fields they study.
inline costmodel::Plan make_plan(const costmodel::ModelSpec& model, const std::string& cluster_name, int gpus, long long seq_len,
                                 long long global_batch) {
  costmodel::Plan p;
  p.name = "test-plan";
  p.model = model;
  p.model_ref = "inline";
  p.cluster = cluster(cluster_name);
  p.cluster_ref = cluster_name;
  p.gpus = gpus;
  p.training.seq_len = seq_len;
  p.training.global_batch = global_batch;
  costmodel::resolve_training_defaults(p.model, p.training);
  p.parallel.dp = gpus;
  return p;
}

inline costmodel::Plan make_plan(const std::string& model_name, const std::string& cluster_name, int gpus, long long seq_len,
                                 long long global_batch) {
  costmodel::Plan p = make_plan(model(model_name), cluster_name, gpus, seq_len, global_batch);
  p.model_ref = model_name;
  return p;
}

// The estimate of a plan that must be valid; a structural error fails the test loudly.
inline costmodel::Estimate checked_estimate(const costmodel::Plan& plan) {
  auto valid = costmodel::validate_plan(plan);
  if (!valid) throw std::runtime_error(valid.error().message);
  return costmodel::estimate(plan);
}

}  // namespace trainplan::testing
