#include "trainplan/planner/stack_logs.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainplan/costmodel/presets.hpp"
#include "trainplan/planner/search.hpp"
#include "statistics.hpp"

namespace trainplan::planner {

namespace cm = costmodel;
using cm::Error;
using cm::Result;

const char* stack_log_name(StackLog log) { return log == StackLog::kTorchtitan ? "torchtitan" : "megatron-lm"; }

namespace {

// torchtitan colours its step lines with ANSI escape sequences (components/metrics.py Color).
std::string without_colour(const std::string& line) {
  static const std::regex kEscape("\x1b\\[[0-9;]*m");
  return std::regex_replace(line, kEscape, "");
}

// A number as the logs print it (thousands separated by commas in torchtitan's tps), or nothing
// when the text is not one whole finite number.
std::optional<double> number(const std::string& text) {
  std::string digits;
  for (const char c : text) {
    if (c != ',') digits += c;
  }
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(digits.c_str(), &end);
  if (digits.empty() || end != digits.c_str() + digits.size() || errno == ERANGE || !std::isfinite(x)) return std::nullopt;
  return x;
}

// A count the logs print (sizes, batch, sequence length): a whole number from 1 to 2^31 - 1.
std::optional<int> count(const std::string& text) {
  const auto x = number(text);
  if (!x || *x < 1 || *x > 2147483647.0 || *x != std::floor(*x)) return std::nullopt;
  return static_cast<int>(*x);
}

// Numbers with an exponent too ("5.6e3"), so that a value is read whole or refused, never cut.
#define TRAINPLAN_LOG_NUMBER R"([0-9][0-9,]*(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)"
const std::regex kTitanStep(R"(step:\s*(\d+)\s+loss:\s*(\S+).*?memory:\s*()" TRAINPLAN_LOG_NUMBER R"()GiB.*?(?:tps|wps):\s*()" TRAINPLAN_LOG_NUMBER ")");
const std::regex kMegatronIteration(R"(iteration\s+(\d+)/\s*\d+\s*\|.*elapsed time per iteration \(ms\):\s*(\S+))");
#undef TRAINPLAN_LOG_NUMBER

// The steps the measurement stands for: every logged step after the first (compilation, warm-up
// and the allocator's first growth land there), or the one step a log has.
std::vector<double> steady(const std::vector<double>& per_step) {
  return per_step.size() > 1 ? std::vector<double>(per_step.begin() + 1, per_step.end()) : per_step;
}

struct Parsed {
  std::vector<double> step_seconds, tokens_per_second_per_gpu, losses;
  double reserved_bytes = 0, allocated_bytes = 0;
  std::optional<int> world_size, tp, pp, dp, cp, ep;
  std::optional<long long> seq_len, global_batch;
  std::string device;
  bool compiled = false;
  std::string error;  // the first value that is not what the log should print, with its line
  int line = 0;

  // `text` as a number above 0 (a time, a rate, a size), or the error set.
  double positive(const std::string& text, const char* what) {
    const auto x = number(text);
    if (x && *x > 0) return *x;
    if (error.empty()) error = "line " + std::to_string(line) + ": " + what + " \"" + text + "\" is not a number above 0";
    return 0;
  }
  int counted(const std::string& text, const char* what) {
    const auto n = count(text);
    if (n) return *n;
    if (error.empty()) error = "line " + std::to_string(line) + ": " + what + " \"" + text + "\" is not a whole number from 1 to 2147483647";
    return 1;
  }
  // A loss: any finite number (nan is what a diverged run prints: kept as not a number).
  double loss(const std::string& text) { return number(text).value_or(std::nan("")); }
};

void read_torchtitan(std::istream& in, Parsed& p) {
  static const std::regex kMesh(R"(Building device mesh with parallelism: pp=(\d+), dp_replicate=(\d+), dp_shard=(-?\d+), cp=(\d+), tp=(\d+)(?:, ep=(\d+))?)");
  static const std::regex kBatch(R"(local batch size (\d+), global batch size (\d+), gradient accumulation steps (\d+), sequence length (\d+))");
  static const std::regex kDevice(R"(CUDA capacity: (.+?) with [0-9.]+GiB memory)");
  std::smatch m;
  for (std::string raw; p.error.empty() && std::getline(in, raw);) {
    ++p.line;
    const std::string line = without_colour(raw);
    if (std::regex_search(line, m, kTitanStep)) {
      p.losses.push_back(p.loss(m[2]));
      p.reserved_bytes = std::max(p.reserved_bytes, p.positive(m[3], "memory (GiB)") * 1073741824.0);  // GiB: device memory monitor's 1024^3
      p.tokens_per_second_per_gpu.push_back(p.positive(m[4], "tps"));
    } else if (std::regex_search(line, m, kMesh)) {
      p.pp = p.counted(m[1], "pp");
      p.cp = p.counted(m[4], "cp");
      p.tp = p.counted(m[5], "tp");
      p.ep = m[6].matched ? p.counted(m[6], "ep") : 1;
      const int replicate = p.counted(m[2], "dp_replicate");
      const auto shard = number(m[3]);  // -1: the ranks left over
      if (shard && *shard > 0) {
        const double dp = replicate * *shard, world = dp * *p.cp * *p.tp * *p.pp;
        if (world > 16777216.0) {
          p.error = "line " + std::to_string(p.line) + ": a mesh of " + std::to_string(world) + " ranks";
        } else {
          p.dp = static_cast<int>(dp);
          p.world_size = static_cast<int>(world);
        }
      }
    } else if (std::regex_search(line, m, kBatch)) {
      p.global_batch = p.counted(m[2], "global batch size");
      p.seq_len = p.counted(m[4], "sequence length");
    } else if (std::regex_search(line, m, kDevice)) {
      p.device = m[1];
    } else if (line.find("with torch.compile") != std::string::npos && line.find("Compiling") != std::string::npos) {
      p.compiled = true;
    }
  }
}

void read_megatron(std::istream& in, Parsed& p) {
  static const std::regex kLoss(R"(\| lm loss:\s*(\S+) \|)");
  static const std::regex kBatch(R"(global batch size:\s*(\d+))");
  static const std::regex kMemory(
      R"(memory \(MB\) \| allocated: [0-9.]+ \| max allocated: ([0-9.]+) \| reserved: [0-9.]+ \| max reserved: ([0-9.]+))");
  static const std::regex kArgument(R"(^\s*(seq_length|world_size|expert_model_parallel_size) \.+ (\d+)\s*$)");
  const auto sizes = [&p](const std::string& line) {
    static const std::regex kSize(R"((world|data-parallel|context-parallel|tensor-model-parallel|pipeline-model-parallel) size: (\d+))");
    for (std::sregex_iterator it(line.begin(), line.end(), kSize), end; it != end; ++it) {
      const std::string what = (*it)[1];
      const int value = p.counted((*it)[2], "size");
      (what == "world" ? p.world_size : what == "data-parallel" ? p.dp : what == "context-parallel" ? p.cp : what == "tensor-model-parallel" ? p.tp : p.pp) =
          value;
    }
  };
  std::smatch m;
  for (std::string line; p.error.empty() && std::getline(in, line);) {
    ++p.line;
    if (std::regex_search(line, m, kMegatronIteration)) {
      p.step_seconds.push_back(p.positive(m[2], "elapsed time per iteration (ms)") / 1e3);
      if (std::regex_search(line, m, kBatch)) p.global_batch = p.counted(m[1], "global batch size");
      if (std::regex_search(line, m, kLoss)) p.losses.push_back(p.loss(m[1]));
    } else if (std::regex_search(line, m, kMemory)) {
      // report_memory: MB of 1024 x 1024 bytes (mega_bytes = 1024.0 * 1024.0); the busiest rank printed.
      p.allocated_bytes = std::max(p.allocated_bytes, p.positive(m[1], "max allocated (MB)") * 1048576.0);
      p.reserved_bytes = std::max(p.reserved_bytes, p.positive(m[2], "max reserved (MB)") * 1048576.0);
    } else if (line.find("using world size:") != std::string::npos) {
      sizes(line);
    } else if (std::regex_search(line, m, kArgument)) {
      const std::string key = m[1];
      if (key == "seq_length") p.seq_len = p.counted(m[2], "seq_length");
      if (key == "world_size") p.world_size = p.counted(m[2], "world_size");
      if (key == "expert_model_parallel_size") p.ep = p.counted(m[2], "expert_model_parallel_size");
    }
  }
}

}  // namespace

std::optional<StackLog> detect_stack_log(const std::string& text) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const std::string plain = without_colour(line);
    if (std::regex_search(plain, kTitanStep)) return StackLog::kTorchtitan;
    if (std::regex_search(plain, kMegatronIteration)) return StackLog::kMegatron;
  }
  return std::nullopt;
}

Result<PerformanceDocument> read_stack_log(const std::string& path, const std::string& text, StackLog log, const LogDefaults& defaults) {
  Parsed p;
  std::istringstream in(text);
  if (log == StackLog::kTorchtitan) {
    read_torchtitan(in, p);
  } else {
    read_megatron(in, p);
  }
  const std::string what = std::string(stack_log_name(log)) + " log";
  if (!p.error.empty()) return Error{path + ": " + p.error + " (a " + what + ")"};
  // The plan's values stand in for what the log does not state; one the log states otherwise
  // would set its tokens per second beside a prediction of other work.
  const auto differs = [&](const char* name, std::optional<long long> logged, long long planned) -> std::optional<Error> {
    if (!logged || planned <= 0 || *logged == planned) return std::nullopt;
    return Error{path + ": the " + what + " ran " + name + " " + std::to_string(*logged) + " where the plan has " + std::to_string(planned) +
                 "; compare a log with the plan it ran"};
  };
  if (auto e = differs("global batch", p.global_batch, defaults.global_batch)) return *e;
  if (auto e = differs("sequence length", p.seq_len, defaults.seq_len)) return *e;
  if (auto e = differs("world size", p.world_size ? std::optional<long long>(*p.world_size) : std::nullopt, defaults.world_size)) return *e;
  const std::size_t steps = log == StackLog::kTorchtitan ? p.tokens_per_second_per_gpu.size() : p.step_seconds.size();
  if (steps == 0) return Error{path + ": no " + (log == StackLog::kTorchtitan ? "step" : "iteration") + " lines in this " + what};
  const int world = p.world_size.value_or(defaults.world_size);
  const long long seq_len = p.seq_len.value_or(defaults.seq_len);
  const long long global_batch = p.global_batch.value_or(defaults.global_batch);
  if (world <= 0 || seq_len <= 0 || global_batch <= 0) {
    return Error{path + ": the " + what + " states no " + (world <= 0 ? "world size" : seq_len <= 0 ? "sequence length" : "global batch") +
                 ", and the plan gives none"};
  }
  const double tokens_per_step = static_cast<double>(global_batch) * static_cast<double>(seq_len);

  PerformanceDocument d;
  d.file = path;
  d.schema = kMeasurementSchema;
  d.name = std::filesystem::path(path).stem().string();
  d.device = p.device;
  d.world_size = world;
  d.losses = p.losses;
  if (log == StackLog::kTorchtitan) {
    // metrics.py: tps = tokens this data-parallel rank read since the last log / (seconds x the
    // ranks that share them, tp x pp x cp): per GPU. All of them: tps x world; a step is then
    // the step's tokens over that.
    const double per_gpu = median(steady(p.tokens_per_second_per_gpu));
    d.throughput["tokens_per_second_per_gpu"] = per_gpu;
    d.throughput["tokens_per_second"] = per_gpu * world;
    d.time["step_seconds"] = tokens_per_step / (per_gpu * world);
    d.stack = cm::stack_name(p.compiled ? cm::Stack::kFsdp2Compile : cm::Stack::kFsdp2);
  } else {
    const double seconds = median(steady(p.step_seconds));
    d.time["step_seconds"] = seconds;
    d.throughput["tokens_per_second"] = tokens_per_step / seconds;
    d.throughput["tokens_per_second_per_gpu"] = tokens_per_step / seconds / world;
    d.stack = cm::stack_name(cm::Stack::kMegatronTe);
  }
  if (p.reserved_bytes > 0) d.memory["reserved_bytes"] = p.reserved_bytes;
  if (p.allocated_bytes > 0) d.memory["total_bytes"] = p.allocated_bytes;
  if (p.tp && p.pp && p.dp) {
    d.layout = ParallelLayout{*p.tp, *p.pp, *p.dp, p.cp.value_or(1), p.ep.value_or(defaults.ep), defaults.zero_stage};
  }
  return d;
}

Result<std::pair<PerformanceDocument, PerformanceDocument>> load_log_comparison(const std::string& prediction_path, const std::string& log_path,
                                                                                const std::string& log_text, StackLog log) {
  auto text = cm::read_text_file(prediction_path);
  if (!text) return text.error();
  auto json = cm::parse_json_text(*text, prediction_path);
  if (!json) return json.error();
  if (!json->is_object()) return Error{prediction_path + ": /: must be a JSON object"};
  const auto integer = [&](const char* section, const char* key) -> long long {
    const nlohmann::json* at = &*json;
    if (section != nullptr) {
      const auto s = json->find(section);
      if (s == json->end() || !s->is_object()) return 0;
      at = &*s;
    }
    const auto v = at->find(key);
    return v != at->end() && v->is_number_integer() ? v->get<long long>() : 0;
  };
  LogDefaults defaults;
  defaults.seq_len = integer("training", "seq_len");
  defaults.global_batch = integer("training", "global_batch");
  defaults.world_size = static_cast<int>(integer(nullptr, "gpus"));
  defaults.zero_stage = static_cast<int>(integer("parallel", "zero_stage"));
  defaults.ep = std::max<int>(1, static_cast<int>(integer("parallel", "ep")));
  auto measured = read_stack_log(log_path, log_text, log, defaults);
  if (!measured) return measured.error();
  const auto schema = json->find("schema");
  if (schema != json->end() && *schema == "trainplan/plan/v1") {
    auto request = cm::parse_plan(*json, prediction_path);
    if (!request) return request.error();
    auto plan = fixed_plan(*request, prediction_path);
    if (!plan) return plan.error();
    cm::Plan run = std::move(plan).value();
    run.training.stack = cm::stack_from_name(measured->stack).value_or(run.training.stack);
    if (auto valid = cm::validate_plan(run); !valid) {
      return Error{prediction_path + ": the plan run on the " + std::string(cm::stack_name(run.training.stack)) + " stack, as " + log_path +
                   " ran it: " + valid.error().message};
    }
    return std::make_pair(predict(run, prediction_path), std::move(measured).value());
  }
  auto predicted = load_prediction_file(prediction_path);
  if (!predicted) return predicted.error();
  return std::make_pair(std::move(predicted).value(), std::move(measured).value());
}

}  // namespace trainplan::planner
