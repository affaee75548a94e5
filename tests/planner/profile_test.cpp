// Kernel tables from measured samples (build_kernel_tables: duplicate averaging and the kernel
// latency fit, the one code path of the CSV import and the executor's --profile), the command
// `planner profile` runs, and `planner profile` end to end with a fake executor.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "test_support.hpp"
#include "trainplan/costmodel/kernels.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/planner/profile.hpp"
#include "trainplan/planner/profile_run.hpp"

namespace trainplan {
namespace {

namespace fs = std::filesystem;
using planner::KernelSamples;
using testing::quote;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A minimal complete sample set: one GEMM, one attention shape, one copy.
KernelSamples minimal_samples() {
  KernelSamples s;
  s.gemm = {{4096, 4096, 4096, 2e-3}};
  s.attention = {{1, 2048, 128, 16, 1e-3, 4e-3}};
  s.copy_gb_per_s = {2000};
  return s;
}

TEST(BuildKernelTables, AveragesShapesMeasuredMoreThanOnce) {
  KernelSamples s = minimal_samples();
  s.gemm.push_back({4096, 4096, 4096, 4e-3});
  s.gemm.push_back({1024, 4096, 4096, 1e-3});
  s.attention.push_back({1, 2048, 128, 16, 3e-3, 8e-3});
  s.elementwise = {{"gelu", 1000, 64, "", 10e-6, 20e-6}, {"gelu", 1000, 64, "", 30e-6, 40e-6}};
  auto built = planner::build_kernel_tables(s, 4e-6);
  ASSERT_TRUE(built) << built.error().message;
  const auto& k = built->tables;
  ASSERT_EQ(k.gemm.size(), 2u);  // in increasing (m, n, k): 1024 first
  EXPECT_DOUBLE_EQ(k.gemm[0].m, 1024);
  EXPECT_DOUBLE_EQ(k.gemm[1].seconds, 3e-3);
  ASSERT_EQ(k.attention.size(), 1u);
  EXPECT_DOUBLE_EQ(k.attention[0].forward_seconds, 2e-3);
  EXPECT_DOUBLE_EQ(k.attention[0].backward_seconds, 6e-3 - 2e-3);  // forward+backward minus forward, both averaged
  const auto& gelu = k.elementwise[static_cast<std::size_t>(costmodel::ElementwiseOp::kGelu)];
  ASSERT_EQ(gelu.size(), 1u);
  EXPECT_DOUBLE_EQ(gelu[0].elements, 64000);
  EXPECT_DOUBLE_EQ(gelu[0].forward_seconds, 20e-6);
  EXPECT_DOUBLE_EQ(gelu[0].backward_seconds, 30e-6);
  EXPECT_EQ(built->merged_duplicates, 3);
  EXPECT_EQ(built->gemm_rows, 2);
}

// rmsnorm (1 forward kernel): 12 us at t, 20 us at 2t: intercept 2 x 12 - 20 = 4 us. swiglu (2
// forward kernels): 30 and 50 us: (60 - 50) / 2 = 5 us. The median of {4, 5} is 4.5 us. gelu at
// t and 3t is no pair and does not count.
TEST(BuildKernelTables, FitsTheKernelLatencyFromOpsTimedAtTAndTwoT) {
  KernelSamples s = minimal_samples();
  s.elementwise = {{"rmsnorm", 1000, 256, "", 12e-6, 30e-6}, {"rmsnorm", 2000, 256, "", 20e-6, 50e-6},
                   {"swiglu", 1000, 1024, "", 30e-6, 60e-6}, {"swiglu", 2000, 1024, "", 50e-6, 90e-6},
                   {"gelu", 1000, 1024, "", 10e-6, 20e-6}, {"gelu", 3000, 1024, "", 11e-6, 20e-6}};
  auto built = planner::build_kernel_tables(s, 9e-6);
  ASSERT_TRUE(built) << built.error().message;
  EXPECT_NEAR(built->tables.kernel_latency, 4.5e-6, 1e-12);
  EXPECT_TRUE(contains(built->notes.front(), "median intercept of 2")) << built->notes.front();
}

TEST(BuildKernelTables, FallsBackToTheGivenLatencyWithoutPairs) {
  auto built = planner::build_kernel_tables(minimal_samples(), 7e-6);
  ASSERT_TRUE(built) << built.error().message;
  EXPECT_DOUBLE_EQ(built->tables.kernel_latency, 7e-6);
  EXPECT_DOUBLE_EQ(built->tables.copy_bandwidth, 2000e9);
  EXPECT_DOUBLE_EQ(built->tables.adamw_fused_bandwidth, 0);
}

TEST(BuildKernelTables, RefusesIncompleteOrImpossibleSamples) {
  struct Case {
    const char* what;
    KernelSamples samples;
    std::string message;
  };
  std::vector<Case> cases;
  KernelSamples s = minimal_samples();
  s.gemm.clear();
  cases.push_back({"no GEMM", s, "no GEMM samples"});
  s = minimal_samples();
  s.copy_gb_per_s.clear();
  cases.push_back({"no copy", s, "no copy sample"});
  s = minimal_samples();
  s.gemm[0].seconds = -1;
  cases.push_back({"negative time", s, "GEMM sample 4096x4096x4096: every value must be a finite number > 0"});
  s = minimal_samples();
  s.attention[0].forward_backward_seconds = 0.5e-3;
  cases.push_back({"backward shorter than nothing", s, "attention head_dim 128, seq_len 2048: needs a forward time and a longer forward+backward time"});
  s = minimal_samples();
  s.elementwise = {{"softmax", 1000, 64, "", 1e-5, 1e-5}};
  cases.push_back({"unknown op", s, "unknown op \"softmax\""});
  // Beyond any GPU: 2 x 4096^3 FLOP in 1e-300 s, and a 1e23-row GEMM in 2 ms (5e22 PFLOP/s).
  s = minimal_samples();
  s.gemm[0].seconds = 1e-300;
  cases.push_back({"a time typed wrong", s, "GEMM sample 4096x4096x4096 in 1e-300 s"});
  s = minimal_samples();
  s.gemm[0].m = 1e23;
  cases.push_back({"a shape typed wrong", s, "PFLOP/s, beyond any GPU"});
  // 256,000 elements in 1 ns: 2.56e14 a second.
  s = minimal_samples();
  s.elementwise = {{"rmsnorm", 1000, 256, "", 1e-9, 30e-6}};
  cases.push_back({"an element-wise time typed wrong", s, "element-wise sample rmsnorm 1000x256: more than 1e14 elements a second"});
  for (const Case& c : cases) {
    auto built = planner::build_kernel_tables(c.samples, 4e-6);
    ASSERT_FALSE(built) << c.what;
    EXPECT_TRUE(contains(built.error().message, c.message)) << c.what << ": " << built.error().message;
  }
}

// The CSV import reads rows into samples and builds the tables through the same function: the
// same measurements give the same tables either way.
TEST(ImportKernelCsv, GivesTheTablesOfTheSameSamplesInMemory) {
  const fs::path dir = fs::temp_directory_path() / ("trainplan_profile_csv_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "k.csv") << "kind,m,n,k,extra,seconds,tflops_or_gbps\n"
                                  "gemm_qkvo,4096,4096,4096,tp1,2e-3,68.7\n"
                                  "gemm_logits,4096,4096,4096,,4e-3,34.4\n"
                                  "sdpa_fwd,1,2048,128,heads16,1e-3,1\n"
                                  "sdpa_fwdbwd,1,2048,128,heads16,4e-3,1\n"
                                  "adamw_fused_fp32,100000000,,,x,1e-3,2900\n"
                                  "copy,1073741824,,,,1e-3,2500\n";
  std::ofstream(dir / "e.csv") << "op,tokens,width,dtype,seconds_fwd,seconds_bwd,bytes_fwd,gbps_fwd,gbps_bwd\n"
                                  "rmsnorm,1000,256,bf16,12e-6,30e-6,1,1,1\n"
                                  "rmsnorm,2000,256,bf16,20e-6,50e-6,1,1,1\n"
                                  "embedding,1000,32000x256,bf16,5e-6,40e-6,1,1,1\n"
                                  "launch_tiny_add,1,1,fp32,4e-6,,,,\n";
  auto imported = planner::import_kernel_csv({(dir / "k.csv").string(), (dir / "e.csv").string()}, 9e-6);
  fs::remove_all(dir);
  ASSERT_TRUE(imported) << imported.error().message;

  KernelSamples s;
  s.gemm = {{4096, 4096, 4096, 2e-3}, {4096, 4096, 4096, 4e-3}};
  s.attention = {{1, 2048, 128, 16, 1e-3, 4e-3}};
  s.adamw_fused_gb_per_s = {2900};
  s.copy_gb_per_s = {2500};
  s.elementwise = {{"rmsnorm", 1000, 256, "", 12e-6, 30e-6}, {"rmsnorm", 2000, 256, "", 20e-6, 50e-6}, {"embedding", 1000, 256, "32000x256", 5e-6, 40e-6}};
  auto built = planner::build_kernel_tables(s, 9e-6);
  ASSERT_TRUE(built) << built.error().message;
  nlohmann::json a = costmodel::kernel_tables_to_json(imported->tables), b = costmodel::kernel_tables_to_json(built->tables);
  a.erase("source");
  b.erase("source");
  EXPECT_EQ(a, b);
  EXPECT_NEAR(imported->tables.kernel_latency, 4e-6, 1e-12);  // 2 x 12 - 20 us
  EXPECT_TRUE(contains(imported->tables.source, "from k.csv, e.csv")) << imported->tables.source;
}

// The dgx-h100 preset's kernel tables are what importing its H100 measurements gives (copied to
// tests/data/h100-llama3.2-1b with their citation): an edit of the preset or of the import that
// parts them fails here.
TEST(ImportKernelCsv, TheMeasuredH100CsvsGiveTheDgxH100PresetsTables) {
  auto imported = planner::import_kernel_csv({testing::data_path("h100-llama3.2-1b/h100_kernels.csv"),
                                               testing::data_path("h100-llama3.2-1b/h100_elementwise.csv")}, 9e-6);
  ASSERT_TRUE(imported) << imported.error().message;
  auto preset = costmodel::find_hwprofile("dgx-h100");
  ASSERT_TRUE(preset) << preset.error().message;
  ASSERT_NE(preset->gpu.kernels, nullptr);
  nlohmann::json a = costmodel::kernel_tables_to_json(imported->tables), b = costmodel::kernel_tables_to_json(*preset->gpu.kernels);
  a.erase("source");
  b.erase("source");
  // The preset's tables were measured on its own GPU (H100 80GB HBM3: 3.35 TB/s); the CSVs name
  // none, so the import leaves it to the profile it is put in (with_kernel_tables).
  EXPECT_DOUBLE_EQ(b.at("hbm_tb_per_s").get<double>(), 3.35);
  EXPECT_FALSE(a.contains("hbm_tb_per_s"));
  b.erase("hbm_tb_per_s");
  EXPECT_EQ(a, b);
}

// Memory-bound samples follow the GPU's HBM (KernelTables::hbm_bandwidth): the dgx-h100 preset
// with Grand Teton's 2.4 TB/s of HBM2e (torchtitan's benchmark files) copies, runs its element-wise
// ops and fused AdamW 3.35 / 2.4 times slower than with the 3.35 TB/s its tables were measured at;
// a compute-bound GEMM and the kernel latency do not change. A stated bandwidth more than 10 times
// off the profile's is refused, naming the field.
TEST(KernelTables, MemoryBoundSamplesFollowTheGpusHbm) {
  auto preset = costmodel::find_hwprofile("dgx-h100");
  ASSERT_TRUE(preset) << preset.error().message;
  costmodel::HardwareProfile hbm2e = *preset;
  hbm2e.gpu.hbm_bandwidth = costmodel::BytesPerSecond(2.4e12);
  const costmodel::KernelRates h(preset->gpu, costmodel::Dtype::kBf16), e(hbm2e.gpu, costmodel::Dtype::kBf16);
  const double ratio = 3.35 / 2.4, latency = h.latency();
  EXPECT_NEAR(e.copy_bandwidth(), h.copy_bandwidth() / ratio, 1e-3);
  EXPECT_NEAR(e.stream(1e9) - latency, (h.stream(1e9) - latency) * ratio, 1e-12);
  EXPECT_NEAR(e.op(costmodel::ElementwiseOp::kRmsNorm, 67108864.0, false) - latency,
              (h.op(costmodel::ElementwiseOp::kRmsNorm, 67108864.0, false) - latency) * ratio, 1e-12);
  EXPECT_NEAR(e.adamw_fused(1e9) - latency, (h.adamw_fused(1e9) - latency) * ratio, 1e-12);
  EXPECT_DOUBLE_EQ(e.gemm(8192, 4096, 4096), h.gemm(8192, 4096, 4096));
  EXPECT_DOUBLE_EQ(e.latency(), latency);

  nlohmann::json doc = costmodel::hwprofile_to_json(*preset);
  doc["gpu"]["kernels"]["hbm_tb_per_s"] = 1e-6;
  const auto refused = costmodel::parse_hwprofile(doc, "fast.json");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("/gpu/kernels/hbm_tb_per_s"), std::string::npos) << refused.error().message;
  EXPECT_NE(refused.error().message.find("within a factor of 10"), std::string::npos) << refused.error().message;
}

TEST(ProfileCommand, RunsTheExecutorAloneOnOneRank) {
  planner::ProfileRunOptions o;
  o.executor = "/build/executor/executor";
  o.out = "/profiles/cpu.json";
  o.device = "cpu";
  o.base = "dgx-a100-80g";
  o.command = "planner profile --device cpu";
  o.threads = 1;
  const std::vector<std::string> expected = {"/build/executor/executor", "--profile", "/profiles/cpu.json", "--device", "cpu",
                                             "--base", "dgx-a100-80g", "--command", "planner profile --device cpu", "--threads", "1"};
  EXPECT_EQ(planner::profile_command(o), expected);
}

TEST(ProfileCommand, RunsSeveralRanksUnderMpirun) {
  planner::ProfileRunOptions o;
  o.executor = "/build/executor/executor";
  o.out = "/profiles/cpu.json";
  o.ranks = 4;
  o.quick = true;
  o.name = "my-cpu";
  o.allow_run_as_root = true;
  const std::vector<std::string> expected = {"mpirun", "--oversubscribe", "-n", "4", "--allow-run-as-root", "--mca",
                                             "btl_vader_single_copy_mechanism", "none", "/build/executor/executor", "--profile",
                                             "/profiles/cpu.json", "--device", "auto", "--name", "my-cpu", "--quick"};
  EXPECT_EQ(planner::profile_command(o), expected);
}

TEST(ProfileCommand, ChecksRanksAgainstTheNodeAndTheDevice) {
  planner::ProfileRunOptions o;
  o.executor = "x";
  o.out = "p.json";
  EXPECT_TRUE(planner::check_profile_run(o, 8));
  o.ranks = 9;
  auto r = planner::check_profile_run(o, 8);
  ASSERT_FALSE(r);
  EXPECT_TRUE(contains(r.error().message, "--ranks 9: must be from 1 to the base profile's GPUs per node (8)")) << r.error().message;
  o.ranks = 0;
  EXPECT_FALSE(planner::check_profile_run(o, 8));
  o.ranks = 1;
  o.device = "tpu";
  r = planner::check_profile_run(o, 8);
  ASSERT_FALSE(r);
  EXPECT_TRUE(contains(r.error().message, "--device: expected auto, cpu or cuda (got \"tpu\")")) << r.error().message;
  o.device = "cpu";
  o.threads = -1;
  r = planner::check_profile_run(o, 8);
  ASSERT_FALSE(r);
  EXPECT_TRUE(contains(r.error().message, "--threads: must be from 0 (every core) to 1024 (got -1)")) << r.error().message;
}

// `planner profile` with a fake executor that writes a prepared profile to the path after
// --profile (the dgx-h100 preset, with its measured H100 tables, and a collectives table).
class ProfileCli : public testing::PlannerCliTest {
 protected:
  void SetUp() override {
    PlannerCliTest::SetUp();
    nlohmann::json doc = costmodel::hwprofile_to_json(testing::cluster("dgx-h100"));
    doc["name"] = "measured-h100";
    doc["intra_node"]["measured"] = {{"ranks", 2}, {"columns", {"bytes", "bus_gb_per_s"}}, {"collectives", {{"all_reduce", {{65536, 10.0}, {1048576, 150.0}}}}}};
    write("prepared.json", costmodel::readable_json(doc));
    fs::create_directories(dir_ / "fake");
    const fs::path exe = dir_ / "fake" / "executor";
    std::ofstream(exe) << "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$(dirname \"$0\")/args.txt\"\nout=\"\"\nprevious=\"\"\n"
                          "for arg in \"$@\"; do\n  [ \"$previous\" = \"--profile\" ] && out=\"$arg\"\n  previous=\"$arg\"\ndone\n"
                          "echo \"fake executor: measuring\"\n[ -n \"${FAKE_NO_PROFILE:-}\" ] || cp " +
                              quote((dir_ / "prepared.json").string()) + " \"$out\"\nexit \"${FAKE_EXIT:-0}\"\n";
    fs::permissions(exe, fs::perms::owner_all, fs::perm_options::add);
  }
  std::string fake() const { return " --executor " + quote((dir_ / "fake" / "executor").string()); }
};

TEST_F(ProfileCli, RunsTheExecutorAndSummarisesTheProfileItWrote) {
  const fs::path out = dir_ / "p.json";
  const auto r = run("profile --device cpu --out " + quote(out.string()) + fake());
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_EQ(r.out.rfind("fake executor: measuring\n", 0), 0u) << r.out;  // its output streams through first
  EXPECT_TRUE(contains(r.out, "profile measured-h100: H100 SXM5 80GB")) << r.out;
  EXPECT_TRUE(contains(r.out, "rows: 201 GEMM, 12 attention, 50 element-wise (10 ops)")) << r.out;
  EXPECT_TRUE(contains(r.out, "copy 2580 GB/s")) << r.out;
  EXPECT_TRUE(contains(r.out, "collectives on 2 ranks (bus bandwidth, largest message): all-reduce 150 GB/s at 1.05 MB (2 sizes)")) << r.out;
  EXPECT_TRUE(contains(r.err, "planner: running: " + (dir_ / "fake" / "executor").string() + " --profile " + out.string() + " --device cpu")) << r.err;
  std::ifstream in(dir_ / "fake" / "args.txt");
  std::vector<std::string> args;
  for (std::string line; std::getline(in, line);) args.push_back(line);
  ASSERT_GE(args.size(), 8u);
  EXPECT_EQ(args[4], "--base");
  EXPECT_EQ(args[5], "dgx-h100");
  EXPECT_EQ(args[6], "--command");
  EXPECT_EQ(args[7].rfind("planner profile --device cpu --out ", 0), 0u) << args[7];
}

TEST_F(ProfileCli, WritesTheProfileToStandardOutputWithoutOut) {
  const auto r = run("profile" + fake());
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const auto start = r.out.find("{\n");
  ASSERT_NE(start, std::string::npos) << r.out;
  EXPECT_TRUE(costmodel::parse_hwprofile_text(r.out.substr(start), "stdout")) << r.out;
  EXPECT_TRUE(contains(r.err, "rows: 201 GEMM")) << r.err;
}

TEST_F(ProfileCli, AFailingExecutorFailsTheProfileWithItsStatus) {
  const auto r = run("profile --out " + quote((dir_ / "p.json").string()) + fake(), "FAKE_EXIT=3 ");
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_TRUE(contains(r.err, "exited with status 3: the profile run failed")) << r.err;
  const auto bad = run("profile --out " + quote((dir_ / "p.json").string()) + fake(), "FAKE_EXIT=2 ");
  EXPECT_EQ(bad.exit_code, 2) << bad.all();
}

TEST_F(ProfileCli, SuccessWithoutAProfileIsAnError) {
  const auto r = run("profile --out " + quote((dir_ / "p.json").string()) + fake(), "FAKE_NO_PROFILE=1 ");
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_TRUE(contains(r.err, "the profile run succeeded but did not write this file")) << r.err;
}

// A planner without an executor beside it, none on PATH and none named: the message says how to
// build one.
TEST_F(ProfileCli, WithoutAnExecutorSaysHowToBuildIt) {
  const fs::path lone = dir_ / "bin" / "planner";
  fs::create_directories(lone.parent_path());
  fs::copy_file(TRAINPLAN_PLANNER_BIN, lone);
  const std::string command = "env -u TRAINPLAN_EXECUTOR PATH=/usr/bin:/bin " + quote(lone.string()) + " profile --out " +
                              quote((dir_ / "p.json").string()) + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) output.append(buffer, n);
  const int status = ::pclose(pipe);
  EXPECT_EQ(WEXITSTATUS(status), 2) << output;
  EXPECT_TRUE(contains(output, "planner: error: profile: measuring this machine runs the executor's microbenchmarks: the executor was not built"))
      << output;
  EXPECT_TRUE(contains(output, "build it with `scripts/setup.sh build`")) << output;
}

TEST_F(ProfileCli, MeasuringOptionsDoNotGoWithFromCsv) {
  expect_bad_inputs({
      {"--device with --from-csv", "profile --from-csv x.csv --device cpu", "profile: --device measures this machine; it does not go with --from-csv"},
      {"--ranks with --from-csv", "profile --from-csv x.csv --ranks 2", "profile: --ranks measures this machine"},
      {"--source without --from-csv", "profile --source lab --out p.json", "profile: --source describes imported CSVs"},
      {"too many ranks", "profile --ranks 9 --out p.json", "profile: --ranks 9: must be from 1 to the base profile's GPUs per node (8)"},
      {"bad base", "profile --base nowhere.json --out p.json", "--base: "},
  });
}

}  // namespace
}  // namespace trainplan
