#pragma once
// Internal to the planner library: summary statistics its readers of measurements share
// (costmodel/statistics.hpp).

#include "trainplan/costmodel/statistics.hpp"

namespace trainplan::planner {

using costmodel::median;

}  // namespace trainplan::planner
