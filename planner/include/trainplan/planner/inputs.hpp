#pragma once
// Inputs as people type them, shared by the planner CLI and the GUI so both read the same text the
// same way: counts with K/M/G/T suffixes ("16M" tokens, "15T" tokens to train) and one fixed
// parallel setting ("tp" = "8", "recompute" = "full"); and the planner command line of a request.

#include <string>

#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/plan.hpp"
#include "trainplan/costmodel/result.hpp"
#include "trainplan/executor/capabilities.hpp"

namespace trainplan::planner {

// A positive count: a number with an optional suffix K, M, G (or B), T, P, in either case. The
// suffixes are powers of 1024 when `binary` (a "4M-token batch" = 4 * 2^20) and of 1000 otherwise
// ("15T tokens" = 15e12); Ki, Mi, Gi, Ti, Pi are always binary. `what` names the input in the
// error, which lists every accepted suffix: "--seq-len: unknown suffix "X" in "8X" (accepted, in
// either case: K, M, G or B, T, P = powers of 1024 here; Ki, Mi, Gi, Ti, Pi = powers of 1024; or
// no suffix)".
[[nodiscard]] costmodel::Result<double> parse_count(const std::string& text, bool binary, const std::string& what);

// Fixes one parallel setting in `constraints`. Keys: tp, pp, dp, cp, ep, zero (zero_stage),
// shard_group, mb (micro_batch), v (virtual_stages), sp (sequence_parallel: on|off), schedule
// (gpipe|1f1b|interleaved), recompute (none|selective|full), offload (offload_optimizer:
// none|cpu|nvme). The error names the key and the rule ("tp must be an integer in [1, 65536]");
// `constraints` is unchanged on error.
[[nodiscard]] costmodel::Result<bool> apply_constraint(const std::string& key, const std::string& value,
                                                       costmodel::ParallelConstraints& constraints);

// The planner command line that plans a request again (capabilities.hpp, which the executor shares).
using executor::planner_command;

}  // namespace trainplan::planner
