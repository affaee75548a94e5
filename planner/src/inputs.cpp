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
    if (!c.cp_comm) return Error{"cp_comm must be p2p (the ring), all_gather (K/V gathered, their gradients reduce-scattered) or allgather_rotate (PyTorch's: K/V gathered, their gradients passed round)"};
    return true;
  }
  if (key == "ends_in_split" || key == "ends_in_pipeline_split") {
    if (value == "on" || value == "true" || value == "1") c.ends_in_split = true;
    else if (value == "off" || value == "false" || value == "0") c.ends_in_split = false;
    else return Error{key + " must be on or off"};
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
               "first_stage_layers, last_stage_layers, ends_in_split, cp_comm)"};
}

}  // namespace trainplan::planner
