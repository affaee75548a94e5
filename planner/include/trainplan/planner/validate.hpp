#pragma once
// Validation: the cost model's prediction against published figures (the tables of tests/data,
// each reproduced with the paper's configuration) and against measurements the executor wrote,
// per row, with the mean absolute percentage error of each table; and the report of it for
// people (aligned text or Markdown) or machines (`trainplan/validation/v1`). `planner validate`
// prints it; tests bound the errors.

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "trainplan/costmodel/result.hpp"
#include "trainplan/planner/report.hpp"

namespace trainplan::planner {

inline constexpr const char* kValidationSchema = "trainplan/validation/v1";

struct ValidationRow {
  std::string label;     // the configuration, as the paper names it ("1.7B, 32 GPUs, tp1 pp1")
  double published = 0;  // the reference figure (published or measured), in the table's unit
  double predicted = 0;  // the cost model's figure for the same configuration, same unit
  double error = 0;      // predicted / published - 1
  std::string note;      // the plan found or assumed ("mb=2 v=3"), and why it does not fit when it does not
  bool fits = true;      // false: the cost model says the configuration runs out of memory (the run did not);
                         // `predicted` is then that of the plan that needs the least memory
};

struct ValidationTable {
  std::string id;         // stable key: "megatron2021_table1", or "measurement:<file stem>"
  std::string title;      // "Megatron-LM 2021, Table 1"
  std::string quantity;   // what the rows compare, with its unit: "hardware TFLOP/s per GPU"
  std::string source;     // the citation, or the measurement file, what it ran on and the plan predicted
  std::string reference = "published";  // what `published` is: "published" or "measured"
  // What kind of run the rows are: "benchmark" (a short recipe or benchmark run: compared with
  // the benchmark step), "production" (a long production run: compared with the sustained step,
  // which waits for the slowest GPU), "measured" (this project's executor), "microbenchmark"
  // (one collective or kernel), "analytic" (a paper's formula).
  std::string run_kind = "benchmark";
  // The mechanisms the model still lacks for these rows, said where the table's MAPE is above
  // kValidationMapeGoal (the summary's "still missing" column); "" where none is known.
  std::string missing;
  std::vector<ValidationRow> rows;
  double mape = 0;           // mean of |error| over the rows (a fraction: 0.064 is 6.4%)
  double max_abs_error = 0;  // largest |error| (a fraction)
};

// The MAPE a table is held to (issue 32: every table within 10%, or the summary says what is
// still missing for it).
inline constexpr double kValidationMapeGoal = 0.10;

// A row with error = predicted / published - 1. REQUIRES: published != 0.
[[nodiscard]] ValidationRow validation_row(std::string label, double published, double predicted, std::string note = "", bool fits = true);

// Sets mape and max_abs_error from the rows (0 for a table without rows).
void summarise(ValidationTable& table);

// One function per published table; each reproduces the paper's configuration (what is given is
// fixed, the rest searched as described) and predicts its figure with the best plan found. When
// no plan fits, the row holds the plan that needs the least memory, with fits = false and the
// reason in its note. An error names the table and the row (a configuration the search rejects
// as invalid, a malformed embedded table).
//
// Narayanan et al. 2021, Table 1: hardware TFLOP/s per GPU, GPT 1.7B-1T on 32-3072 A100-80GB,
// full recompute; micro-batch and interleaving searched.
[[nodiscard]] costmodel::Result<ValidationTable> validate_megatron2021_table1();
// Korthikanti et al. 2022, Table 3: iteration seconds, full recompute and SP + selective recompute.
[[nodiscard]] costmodel::Result<ValidationTable> validate_korthikanti2022_table3();
// Korthikanti et al. 2022, Table 4: forward and backward milliseconds of one layer of the 22B
// model (Table 3's configuration) under each recompute and sequence-parallel setting.
[[nodiscard]] costmodel::Result<ValidationTable> validate_korthikanti2022_table4();
// Rajbhandari et al. 2020 (ZeRO), Table 1: model-state GB per device, 3 models x 3 stages x 6 DP degrees.
[[nodiscard]] costmodel::Result<ValidationTable> validate_zero2020_table1();
// Dubey et al. 2024 (Llama 3), Table 4: MFU of Llama 3 405B on 8K and 16K H100 with the
// published layout, predicted for the megatron-te stack. Held out: printed, never bounded.
[[nodiscard]] costmodel::Result<ValidationTable> validate_llama3_405b_h100();
// NVIDIA's NeMo / Megatron-Bridge performance summaries: tokens/s per GPU of Llama and GPT-3
// 175B in FP8 on DGX-H100 with the published layout, predicted for the megatron-te stack. Held
// out: printed, never bounded.
[[nodiscard]] costmodel::Result<ValidationTable> validate_nemo_h100_fp8();
// Published nccl-tests results (tests/data/nccl_tests_published.csv): the time of one collective
// of the printed size on the printed number of GPUs and nodes, against network.hpp's NCCL model
// on the profile of that system.
[[nodiscard]] costmodel::Result<ValidationTable> validate_nccl_tests();
// The executor's runs on one H100 (tests/data/h100-llama3.2-1b): step seconds, peak allocated and
// reserved GiB per run against its plan's estimate; the source says whether the run that ran out
// of memory is predicted not to fit.
[[nodiscard]] costmodel::Result<ValidationTable> validate_h100_runs();
// Issue 12's stacks on one H100 at micro-batch 4 (trainplan-reference, pytorch-eager, torch-compile):
// tokens/s and peak allocated GiB.
[[nodiscard]] costmodel::Result<ValidationTable> validate_h100_stacks();
// Our runs of the stacks' exports on one H200 against the stacks they run on (tests/data/h200-stacks/).
[[nodiscard]] costmodel::Result<ValidationTable> validate_h200_stack_runs();
// FSDP runs of Llama-family models on A100 (TinyLlama; PyTorch/IBM blog): MFU in percent.
[[nodiscard]] costmodel::Result<ValidationTable> validate_fsdp_runs_a100();
// torchtitan's published A100 runs (64 x A100-80GB, FSDP): MFU in percent.
[[nodiscard]] costmodel::Result<ValidationTable> validate_torchtitan_a100();
// torchtitan's community benchmarks on H100 (500 W) and H200: tokens/s per GPU and peak reserved memory.
[[nodiscard]] costmodel::Result<ValidationTable> validate_torchtitan_h100_h200();
// torchao's float8 README: torchtitan Llama 3 8B on 8 H100 in bf16 and in fp8 with the fp8 all-gather
// (tests/data/torchao_float8_h100.csv).
[[nodiscard]] costmodel::Result<ValidationTable> validate_torchao_float8_h100();

// All of the above, in that order.
[[nodiscard]] costmodel::Result<std::vector<ValidationTable>> validate_published();

// A measurement (`trainplan/measurement/v1`, parsed JSON read from `file`) against the estimate
// of the plan its header describes (`model` and `cluster` preset names or paths, `gpus`,
// `training`, `parallel`; rebuilt as a `trainplan/plan/v1` document, unset fields taking
// plan_with_defaults' defaults). Rows, for what was measured (> 0): step seconds, tokens/s,
// peak allocated GiB (`memory.total_bytes` against the estimate's total less its overhead) and
// peak reserved GiB (`memory.reserved_bytes` against the total less the GPU's reserved memory).
// Errors name `file` and the JSON pointer (malformed quantities, unknown preset, invalid plan).
[[nodiscard]] costmodel::Result<ValidationTable> validate_measurement(const nlohmann::json& document, const std::string& file);
// Reads `path` (errors name it, with line and column for malformed JSON), then validate_measurement.
[[nodiscard]] costmodel::Result<ValidationTable> validate_measurement_file(const std::string& path);

// Text and Markdown: a section per table (title, quantity, source, rows of label, published,
// predicted, error, note, and the table's MAPE and worst error), then a summary with one line per
// table (rows, MAPE, worst error). Json: validation_to_json. Other formats render as text.
[[nodiscard]] std::string render_validation(const std::vector<ValidationTable>& tables, Format format);

// The `trainplan/validation/v1` document: {schema, tables: [{id, title, quantity, source,
// reference, mape, max_abs_error, rows: [{label, published, predicted, error, note, fits}]}],
// summary: [{id, rows, mape, max_abs_error}]}; errors and MAPE as fractions.
[[nodiscard]] nlohmann::json validation_to_json(const std::vector<ValidationTable>& tables);

}  // namespace trainplan::planner
