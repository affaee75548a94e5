// Fuzz target for the JSON document loaders (model, hwprofile, plan) and, when a mutated plan
// is valid and fully fixed, the estimate itself. Any input must give a value or an error
// message: no crash, no hang, no exception escaping. Built for libFuzzer with
// -DTRAINPLAN_LIBFUZZER=ON (clang), otherwise driven by standalone_driver.cpp in the tests.

#include <cstddef>
#include <cstdint>
#include <string>

#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/model.hpp"
#include "trainplan/costmodel/plan.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace cm = trainplan::costmodel;
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)cm::parse_model_text(text, "fuzz.json");
  (void)cm::parse_hwprofile_text(text, "fuzz.json");
  auto request = cm::parse_plan_text(text, "fuzz.json");
  if (request && request->parallel.fully_fixed()) {
    cm::Plan plan{request->name, request->model_ref, request->cluster_ref, request->model, request->cluster,
                  request->gpus, request->training, request->parallel.fixed()};
    if (cm::validate_plan(plan)) (void)cm::estimate(plan);
  }
  return 0;
}
