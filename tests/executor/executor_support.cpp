// Executor test helpers (see executor_support.hpp).

#include "executor_support.hpp"

#include <cmath>

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "trainplan/costmodel/plan.hpp"

namespace trainplan::testing {

namespace fs = std::filesystem;

// A new directory each call (mkdtemp), so nothing is ever removed: std::filesystem::remove_all
// binds to LibTorch's exported copy in the binaries that link it and crashes on a directory that
// exists (executor/src/io/checkpoint.cpp, remove_tree).
std::string scratch_dir(const std::string& name) {
  std::string pattern = (fs::temp_directory_path() / ("trainplan-executor-" + std::to_string(::getpid()) + "-" + name + "-XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
  return pattern;
}

costmodel::Estimate estimate_plan_file(const std::string& path) {
  auto request = costmodel::load_plan_file(path);
  if (!request.ok()) throw std::runtime_error(request.error().message);
  auto plan = costmodel::plan_with_defaults(*request);
  if (!plan.ok()) throw std::runtime_error(plan.error().message);
  return costmodel::estimate(*plan);
}

std::string write_plan(const std::string& dir, const std::string& name, const PlanSpec& s) {
  nlohmann::json model = s.model;
  if (s.layers > 0 || !s.model_patch.empty()) {  // the preset's document, changed
    model = read_json(std::string(TRAINPLAN_SOURCE_DIR) + "/samples/models/" + s.model + ".json");
    if (s.layers > 0) model["layers"] = s.layers;
    model.update(s.model_patch);
    model["name"] = s.model + "-" + name;
  }
  nlohmann::json plan = {
      {"schema", "trainplan/plan/v1"},
      {"name", name},
      {"model", model},
      {"cluster", "dgx-h100"},
      {"gpus", s.ranks * s.tp * s.pp * s.cp},
      {"training", {{"seq_len", s.seq_len}, {"global_batch", s.global_batch}, {"precision", s.precision}, {"optimizer", "adamw"}, {"train_tokens", 1e6}}},
      {"parallel",
       {{"tp", s.tp}, {"pp", s.pp}, {"dp", s.ranks}, {"cp", s.cp}, {"ep", s.ep}, {"zero_stage", s.zero_stage}, {"shard_group", s.shard_group},
        {"micro_batch", s.micro_batch}, {"recompute", s.recompute}, {"recompute_layers", s.recompute_layers}, {"virtual_stages", s.virtual_stages}, {"schedule", s.schedule},
        {"sequence_parallel", s.sequence_parallel}}},
  };
  plan["training"].update(s.training_patch);
  const std::string path = (fs::path(dir) / (name + ".json")).string();
  std::ofstream(path) << plan.dump(2);
  return path;
}

Outcome run_command(const std::string& command) {
  Outcome o;
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed: " + command);
  std::array<char, 4096> buffer{};
  std::size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) o.output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

Outcome run_executor(int ranks, const std::string& args) {
  const std::string exe = TRAINPLAN_EXECUTOR_BIN;
  if (ranks <= 1) return run_command(exe + " " + args);
  return run_mpi(ranks, exe + " " + args);
}

Outcome run_mpi(int ranks, const std::string& command) {
  // Root in containers needs the two variables; the single-copy mechanism fails in containers.
  const std::string mpirun = std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") + TRAINPLAN_MPIRUN +
                             " --oversubscribe --mca btl_vader_single_copy_mechanism none -n " + std::to_string(ranks) + " ";
  return run_command(mpirun + command);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(in);
}

std::map<std::string, std::vector<float>> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  uint64_t header_length = 0;
  in.read(reinterpret_cast<char*>(&header_length), 8);
  std::string header(header_length, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_length));
  const nlohmann::json h = nlohmann::json::parse(header);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, info] : h.items()) {
    if (name == "__metadata__") continue;
    if (info.at("dtype") != "F32") throw std::runtime_error(path + ": " + name + " is not F32");
    const auto begin = info.at("data_offsets")[0].get<std::size_t>(), end = info.at("data_offsets")[1].get<std::size_t>();
    if (end > data.size() || begin > end) throw std::runtime_error(path + ": " + name + " has offsets beyond the file");
    std::vector<float> values((end - begin) / 4);
    std::memcpy(values.data(), data.data() + begin, end - begin);
    out[name] = std::move(values);
  }
  return out;
}

void expect_parameters_close(const Parameters& expected, const Parameters& got, double tolerance) {
  ASSERT_EQ(got.size(), expected.size());
  double total_diff = 0, total_norm = 0;
  for (const auto& [name, want] : expected) {
    ASSERT_TRUE(got.count(name)) << name;
    const auto& have = got.at(name);
    ASSERT_EQ(have.size(), want.size()) << name;
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < have.size(); ++i) {
      diff += (double(have[i]) - want[i]) * (double(have[i]) - want[i]);
      norm += double(want[i]) * want[i];
    }
    total_diff += diff;
    total_norm += norm;
    if (name.find("attention.wk.bias") != std::string::npos) {
      EXPECT_LT(std::sqrt(diff / have.size()), 1e-3) << name;
      continue;
    }
    // The token embedding's rows see few of a step's tokens (8 x 32 here), so Adam divides their
    // summation-order rounding (the order of tensor-, sequence- and data-parallel reductions) by
    // a small sqrt(v): tp2_sp_pp2_dp2_zero3 measured 1.05e-3 on a 2026-11-27 Xeon VM (under 1e-3
    // on the CPUs before it). The whole model's bound below is unchanged.
    const double per_tensor = name.find("embedding.tokens.weight") != std::string::npos ? 20 : 10;
    EXPECT_LE(std::sqrt(diff), per_tensor * tolerance * std::sqrt(norm)) << name;
  }
  EXPECT_LE(std::sqrt(total_diff), tolerance * std::sqrt(total_norm));
}

}  // namespace trainplan::testing
