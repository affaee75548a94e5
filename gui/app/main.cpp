// trainplan-gui: the interactive planning app. With no export option it opens the window; with
// --screenshot or --export-* it fills the inputs, waits for the search, writes the files and
// exits (run it with QT_QPA_PLATFORM=offscreen where there is no display).
// Exit codes: 0 success, 2 bad input (the message names the field), 3 the search did not finish
// in time or a file could not be written.

#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <QApplication>
#include <QElapsedTimer>
#include <QThread>

#include "trainplan/costmodel/presets.hpp"
#include "trainplan/costmodel/stack.hpp"
#include "trainplan/gui/main_window.hpp"

namespace gui = trainplan::gui;

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitFailed = 3;

int fail(int code, const std::string& message) {
  std::fprintf(stderr, "trainplan-gui: error: %s\n", message.c_str());
  return code;
}

// planner's --fix keys to the input panel's field names.
std::string fix_field(const std::string& key) {
  static const std::map<std::string, std::string> kAliases = {{"zero_stage", "zero"}, {"micro_batch", "mb"}, {"virtual_stages", "v"},
                                                             {"sequence_parallel", "sp"}, {"offload_optimizer", "offload"},
                                                             {"cp_comm_type", "cp_comm"}, {"ends_in_pipeline_split", "ends_in_split"}};
  const auto it = kAliases.find(key);
  return "fix/" + (it == kAliases.end() ? key : it->second);
}

// The on/off fields take the planner's spellings too (planner/src/inputs.cpp: true, 1, false, 0).
std::string fix_value(const std::string& field, const std::string& value) {
  if (field != "fix/sp" && field != "fix/ends_in_split") return value;
  if (value == "true" || value == "1") return "on";
  if (value == "false" || value == "0") return "off";
  return value;
}

// Processes events until the newest input has been searched (and its scaling curve computed).
bool wait_for_results(gui::MainWindow& window, int timeout_ms) {
  QElapsedTimer clock;
  clock.start();
  while (clock.elapsed() < timeout_ms) {
    QCoreApplication::processEvents(QEventLoop::AllEvents, 10);
    gui::PlanningSession* s = window.session();
    if (!s->input_errors().empty()) return true;
    if (s->generation() > 0 && !s->searching() && !s->scaling_pending()) {
      QCoreApplication::processEvents();
      return true;
    }
    QThread::msleep(2);
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  // The options are defined before Qt starts: --help needs no display (QApplication exits where
  // none can be opened). Qt's own arguments (-platform ...) are taken out by QApplication before
  // the options are parsed.
  CLI::App cli{"trainplan-gui: plan distributed LLM training interactively (Qt)"};
  std::map<std::string, std::string> fields;
  const auto field_option = [&](const std::string& name, const std::string& field, const std::string& help) {
    cli.add_option_function<std::string>(name, [&fields, field](const std::string& v) { fields[field] = v; }, help);
  };
  field_option("--model", "model", "Model preset (e.g. llama3-70b)");
  field_option("--cluster", "cluster", "Cluster preset (e.g. dgx-h100)");
  field_option("--gpus", "gpus", "Number of GPUs");
  field_option("--seq-len", "seq_len", "Tokens per sequence");
  field_option("--global-batch", "global_batch", "Sequences per optimizer step");
  field_option("--train-tokens", "train_tokens", "Tokens to train (K/M/B/T decimal)");
  field_option("--precision", "precision", "fp32 | bf16 | fp16 | fp8");
  field_option("--optimizer", "optimizer", "adamw | sgd | adafactor | adam8bit");
  field_option("--mode", "mode", "pretrain | full | lora | qlora");
  field_option("--objective", "objective", "throughput | time | cost");
  field_option("--stack", "stack", std::string("Software stack to predict for: ") + trainplan::costmodel::stack_choices());
  field_option("--memory-headroom", "memory_headroom", "Percent of HBM kept free: plans needing more are \"tight\", ranked after the others");
  field_option("--loss", "loss", "Loss kernel: stack | fp32-logits | fused | chunked-linear | vocab-parallel-fp32");
  field_option("--attention-mask", "attention_mask", "causal | explicit");
  field_option("--attention-kernel", "attention_kernel", "Fused attention kernel: stack | profile | flash2 | flash3");
  field_option("--fp8-recipe", "fp8_recipe", "fp8 scaling: stack | delayed | current");
  field_option("--allocator", "allocator", "PyTorch's CUDA allocator: caching | expandable-segments");
  std::string batch_tokens, plan_file, model_file, measurement_file, tab = "breakdown", screenshot, export_plan, export_launch,
              export_slurm, export_report, size = "1600x1000";
  std::vector<std::string> fixes, charts;
  int timeout_ms = 120000;
  cli.add_option("--global-batch-tokens", batch_tokens, "Tokens per optimizer step (K/M/G binary: 16M = 16*2^20)");
  cli.add_option("--fix", fixes, "Fix a parallel setting, e.g. --fix tp=8 --fix pp=8");
  cli.add_option("--plan", plan_file, "Open a plan file (trainplan/plan/v1): its inputs, and its layout selected");
  cli.add_option("--model-file", model_file, "Use a model document (trainplan/model/v1)");
  cli.add_option("--measurement", measurement_file, "Overlay an executor measurement (trainplan/measurement/v1)");
  cli.add_option("--tab", tab, "View shown: breakdown | pipeline | scaling | compare | launch")
      ->check(CLI::IsMember({"breakdown", "pipeline", "scaling", "compare", "launch"}));
  cli.add_option("--size", size, "Window size WIDTHxHEIGHT")->capture_default_str();
  cli.add_option("--screenshot", screenshot, "Render the window to this PNG or SVG file and exit");
  cli.add_option("--export-chart", charts, "KIND=FILE (.png or .svg): memory, time, pipeline, measured-pipeline, scaling, comparison, window");
  cli.add_option("--export-plan", export_plan, "Write the selected plan (trainplan/plan/v1) and exit");
  cli.add_option("--export-launch", export_launch, "Write the torchrun command of the selected plan and exit");
  cli.add_option("--export-slurm", export_slurm, "Write the SLURM script of the selected plan and exit");
  cli.add_option("--export-report", export_report, "Write the report (.md Markdown or .html) and exit");
  cli.add_option("--timeout-ms", timeout_ms, "Longest wait for the search in batch mode")->capture_default_str();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::cout << cli.help();
      return 0;
    }
  }
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("trainplan-gui"));
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = cli.exit(e);
    return code == 0 ? 0 : kExitBadInput;
  }

  int width = 1600, height = 1000;
  if (std::sscanf(size.c_str(), "%dx%d", &width, &height) != 2 || width < 200 || height < 200) {
    return fail(kExitBadInput, "--size: expected WIDTHxHEIGHT (e.g. 1600x1000), got \"" + size + "\"");
  }

  gui::MainWindow window;
  window.resize(width, height);
  if (!plan_file.empty() && !window.open_plan(QString::fromStdString(plan_file))) return fail(kExitBadInput, window.last_error().toStdString());
  if (!model_file.empty() && !window.load_model_file(QString::fromStdString(model_file))) return fail(kExitBadInput, window.last_error().toStdString());
  gui::InputPanel* input = window.input_panel();
  for (auto [field, value] : fields) {
    if (field == "model") value = trainplan::costmodel::resolve_model_alias(value);  // "70b" as on the CLI
    if (!input->set_field(QString::fromStdString(field), QString::fromStdString(value))) {
      return fail(kExitBadInput, "--" + field + ": unknown value \"" + value + "\"");
    }
  }
  if (!batch_tokens.empty()) {
    input->set_field(QStringLiteral("batch_unit"), QStringLiteral("tokens"));
    input->set_field(QStringLiteral("global_batch"), QString::fromStdString(batch_tokens));
  }
  for (const auto& f : fixes) {
    const auto eq = f.find('=');
    const std::string field = eq == std::string::npos ? std::string() : fix_field(f.substr(0, eq));
    if (eq == std::string::npos || !input->set_field(QString::fromStdString(field), QString::fromStdString(fix_value(field, f.substr(eq + 1))))) {
      return fail(kExitBadInput, "--fix " + f +
                                     ": expected key=value with a known key (tp, pp, dp, cp, ep, zero, shard_group, mb, v, sp, schedule, recompute, "
                                     "offload, first_stage_layers, last_stage_layers, ends_in_split, cp_comm)");
    }
  }
  static const std::map<std::string, gui::MainWindow::Tab> kTabs = {{"breakdown", gui::MainWindow::kBreakdownTab},
                                                                   {"pipeline", gui::MainWindow::kPipelineTab},
                                                                   {"scaling", gui::MainWindow::kScalingTab},
                                                                   {"compare", gui::MainWindow::kCompareTab},
                                                                   {"launch", gui::MainWindow::kLaunchTab}};
  window.show();
  const bool batch = !screenshot.empty() || !charts.empty() || !export_plan.empty() || !export_launch.empty() || !export_slurm.empty() ||
                     !export_report.empty();
  if (!batch) {
    if (!measurement_file.empty()) window.load_measurement(QString::fromStdString(measurement_file));
    window.show_tab(kTabs.at(tab));
    return QApplication::exec();
  }

  if (!wait_for_results(window, timeout_ms)) return fail(kExitFailed, "the search did not finish within " + std::to_string(timeout_ms) + " ms");
  const auto& errors = window.session()->input_errors();
  if (!errors.empty()) return fail(kExitBadInput, errors.front().field + ": " + errors.front().message);
  if (!window.session()->result()) return fail(kExitBadInput, window.session()->search_error().toStdString());
  if (!measurement_file.empty() && !window.load_measurement(QString::fromStdString(measurement_file))) {
    return fail(kExitBadInput, window.last_error().toStdString());
  }
  window.show_tab(kTabs.at(tab));
  QCoreApplication::processEvents();

  const auto check = [&](bool ok) { return ok ? 0 : fail(kExitFailed, window.last_error().toStdString()); };
  for (const auto& c : charts) {
    const auto eq = c.find('=');
    const auto kind = eq == std::string::npos ? std::nullopt : gui::chart_kind(QString::fromStdString(c.substr(0, eq)));
    if (!kind) return fail(kExitBadInput, "--export-chart " + c + ": expected KIND=FILE with KIND memory, time, pipeline, measured-pipeline, scaling, comparison or window");
    if (int code = check(window.export_chart(*kind, QString::fromStdString(c.substr(eq + 1))))) return code;
  }
  if (!export_plan.empty()) {
    if (int code = check(window.export_plan_json(QString::fromStdString(export_plan)))) return code;
  }
  if (!export_launch.empty()) {
    if (int code = check(window.export_launch(QString::fromStdString(export_launch), false))) return code;
  }
  if (!export_slurm.empty()) {
    if (int code = check(window.export_launch(QString::fromStdString(export_slurm), true))) return code;
  }
  if (!export_report.empty()) {
    const bool html = QString::fromStdString(export_report).endsWith(QStringLiteral(".html"), Qt::CaseInsensitive);
    if (int code = check(window.export_report(QString::fromStdString(export_report), html ? trainplan::planner::Format::kHtml
                                                                                          : trainplan::planner::Format::kMarkdown))) {
      return code;
    }
  }
  if (!screenshot.empty()) {
    window.show_tab(kTabs.at(tab));
    QCoreApplication::processEvents();
    if (int code = check(window.export_chart(gui::ChartKind::kWindow, QString::fromStdString(screenshot)))) return code;
  }
  return 0;
}
