#include "trainplan/planner/inputs.hpp"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <optional>
#include <stdexcept>

namespace trainplan::planner {

using costmodel::Error;
using costmodel::Result;

Result<double> parse_count(const std::string& text, bool binary, const std::string& what) {
  std::size_t used = 0;
  double value = 0;
  // Decimal only: std::stod also reads hexadecimal ("0x10" is 16) and skips leading blanks.
  const std::size_t digits = !text.empty() && (text[0] == '+' || text[0] == '-') ? 1 : 0;
  const bool hexadecimal = text.size() > digits + 1 && text[digits] == '0' && (text[digits + 1] == 'x' || text[digits + 1] == 'X');
  if (text.empty() || hexadecimal || std::isspace(static_cast<unsigned char>(text[0]))) {
    return Error{what + ": \"" + text + "\" is not a number"};
  }
  try {
    value = std::stod(text, &used);
  } catch (...) {
    return Error{what + ": \"" + text + "\" is not a number"};
  }
  const std::string suffix = text.substr(used);
  const bool force_binary = suffix.size() == 2 && suffix[1] == 'i';
  const char unit = suffix.empty() ? ' ' : static_cast<char>(std::toupper(static_cast<unsigned char>(suffix[0])));
  const int power = unit == 'K' ? 1 : unit == 'M' ? 2 : unit == 'G' || unit == 'B' ? 3 : unit == 'T' ? 4 : unit == 'P' ? 5 : 0;
  // "B" is a decimal word (billion), so "Bi" means nothing.
  if (!suffix.empty() && (power == 0 || suffix.size() > (force_binary ? 2u : 1u) || (force_binary && unit == 'B'))) {
    return Error{what + ": unknown suffix \"" + suffix + "\" in \"" + text + "\" (accepted, in either case: K, M, G or B, T, P = powers of " +
                 (binary ? "1024" : "1000") + " here; Ki, Mi, Gi, Ti, Pi = powers of 1024; or no suffix)"};
  }
  value *= std::pow((binary || force_binary) ? 1024.0 : 1000.0, power);
  if (!std::isfinite(value) || value <= 0) return Error{what + ": must be a positive number (got \"" + text + "\")"};
  return value;
}

Result<bool> apply_constraint(const std::string& key, const std::string& value, costmodel::ParallelConstraints& c) {
  using costmodel::Offload;
  using costmodel::Recompute;
  using costmodel::Schedule;
  const auto as_int = [&](int min, int max, std::optional<int>& out) -> Result<bool> {
    try {
      std::size_t used = 0;
      const long v = std::stol(value, &used);
      if (used != value.size() || v < min || v > max) throw std::out_of_range("range");
      out = static_cast<int>(v);
      return true;
    } catch (...) {
      return Error{key + " must be an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]"};
    }
  };
  if (key == "tp") return as_int(1, 1 << 16, c.tp);
  if (key == "pp") return as_int(1, 1 << 16, c.pp);
  if (key == "dp") return as_int(1, 1 << 24, c.dp);
  if (key == "cp") return as_int(1, 1 << 16, c.cp);
  if (key == "ep") return as_int(1, 1 << 16, c.ep);
  if (key == "zero" || key == "zero_stage") return as_int(0, 3, c.zero_stage);
  if (key == "shard_group") return as_int(0, 1 << 24, c.shard_group);
  if (key == "mb" || key == "micro_batch") return as_int(1, 1 << 20, c.micro_batch);
  if (key == "v" || key == "virtual_stages") return as_int(1, 1024, c.virtual_stages);
  if (key == "sp" || key == "sequence_parallel") {
    if (value == "on" || value == "true" || value == "1") c.sequence_parallel = true;
    else if (value == "off" || value == "false" || value == "0") c.sequence_parallel = false;
    else return Error{"sp must be on or off"};
    return true;
  }
  if (key == "schedule") {
    if (value == "gpipe") c.schedule = Schedule::kGpipe;
    else if (value == "1f1b") c.schedule = Schedule::kOneFOneB;
    else if (value == "interleaved") c.schedule = Schedule::kInterleaved;
    else return Error{"schedule must be gpipe, 1f1b or interleaved"};
    return true;
  }
  if (key == "recompute") {
    if (value == "none") c.recompute = Recompute::kNone;
    else if (value == "selective") c.recompute = Recompute::kSelective;
    else if (value == "full") c.recompute = Recompute::kFull;
    else return Error{"recompute must be none, selective or full"};
    return true;
  }
  if (key == "offload" || key == "offload_optimizer") {
    if (value == "none") c.offload_optimizer = Offload::kNone;
    else if (value == "cpu") c.offload_optimizer = Offload::kCpu;
    else if (value == "nvme") c.offload_optimizer = Offload::kNvme;
    else return Error{"offload must be none, cpu or nvme"};
    return true;
  }
  if (key == "cp_comm" || key == "cp_comm_type") {
    c.cp_comm = costmodel::cp_comm_type_from_name(value);
    if (!c.cp_comm) return Error{"cp_comm must be p2p (the ring) or all_gather"};
    return true;
  }
  if (key == "first_stage_layers" || key == "last_stage_layers") {
    std::optional<int> layers;
    auto r = as_int(1, 100000, layers);
    if (!r) return r;
    (key == "first_stage_layers" ? c.first_stage_layers : c.last_stage_layers) = *layers;
    return true;
  }
  return Error{"unknown key \"" + key + "\" (tp, pp, dp, cp, ep, zero, shard_group, mb, v, sp, schedule, recompute, offload, "
               "first_stage_layers, last_stage_layers, cp_comm)"};
}

std::string planner_command(const costmodel::PlanRequest& r, const std::string& objective, double memory_headroom) {
  const auto number = [](double x) {  // the shortest text that reads back as x
    char buf[64];
    for (int digits = 6; digits <= 17; ++digits) {
      std::snprintf(buf, sizeof buf, "%.*g", digits, x);
      if (std::strtod(buf, nullptr) == x) break;
    }
    return std::string(buf);
  };
  const costmodel::TrainingConfig& t = r.training;
  std::string s = "planner --model " + (r.model_ref.empty() || r.model_ref == "inline" ? std::string("MODEL.json") : r.model_ref);
  s += " --gpus " + std::to_string(r.gpus);
  s += " --cluster " + (r.cluster_ref.empty() || r.cluster_ref == "inline" ? std::string("CLUSTER.json") : r.cluster_ref);
  s += " --seq-len " + std::to_string(t.seq_len) + " --global-batch " + std::to_string(t.global_batch);
  s += " --train-tokens " + number(t.train_tokens);
  s += std::string(" --precision ") + costmodel::precision_name(t.precision) + " --optimizer " + costmodel::optimizer_name(t.optimizer) +
       " --mode " + costmodel::mode_name(t.mode) + " --objective " + objective;
  if (t.mode == costmodel::TrainingMode::kLora || t.mode == costmodel::TrainingMode::kQlora) {
    s += " --lora-rank " + std::to_string(t.lora.rank);
    std::string targets;
    for (const std::string& target : t.lora.targets) targets += (targets.empty() ? "" : ",") + target;
    if (targets != "q,k,v,o") s += " --lora-targets " + targets;
    if (t.mode == costmodel::TrainingMode::kQlora && t.lora.base_format == costmodel::QuantFormat::kInt8) s += " --base-format int8";
  }
  if (t.attention == costmodel::AttentionKernel::kStandard) s += " --attention standard";
  if (t.attention_mask == costmodel::AttentionMask::kExplicit) s += " --attention-mask explicit";
  if (t.loss) s += std::string(" --loss ") + costmodel::loss_kernel_name(*t.loss);
  if (!t.master_weights) s += " --pure-16bit";
  if (t.dropout) s += " --dropout";
  if (t.stack != costmodel::Stack::kTrainplan) s += std::string(" --stack ") + costmodel::stack_name(t.stack);
  if (memory_headroom != costmodel::kDefaultMemoryHeadroom) s += " --memory-headroom " + number(100 * memory_headroom);
  const costmodel::ParallelConstraints& c = r.parallel;
  const auto fix = [&](const char* key, const std::optional<int>& v) {
    if (v) s += std::string(" --fix ") + key + "=" + std::to_string(*v);
  };
  fix("tp", c.tp);
  fix("pp", c.pp);
  fix("dp", c.dp);
  fix("cp", c.cp);
  fix("ep", c.ep);
  fix("zero", c.zero_stage);
  fix("shard_group", c.shard_group);
  fix("mb", c.micro_batch);
  fix("v", c.virtual_stages);
  if (c.sequence_parallel) s += std::string(" --fix sp=") + (*c.sequence_parallel ? "on" : "off");
  if (c.schedule) s += std::string(" --fix schedule=") + costmodel::schedule_name(*c.schedule);
  if (c.recompute) s += std::string(" --fix recompute=") + costmodel::recompute_name(*c.recompute);
  if (c.offload_optimizer) s += std::string(" --fix offload=") + costmodel::offload_name(*c.offload_optimizer);
  if (c.first_stage_layers > 0) s += " --fix first_stage_layers=" + std::to_string(c.first_stage_layers);
  if (c.last_stage_layers > 0) s += " --fix last_stage_layers=" + std::to_string(c.last_stage_layers);
  if (c.cp_comm) s += std::string(" --fix cp_comm=") + costmodel::cp_comm_type_name(*c.cp_comm);
  return s;
}

}  // namespace trainplan::planner
