// The published tables of tests/data reproduced by the cost model: each function sets up the
// paper's configuration, fixes what the paper gives, searches what it does not, and predicts the
// published figure. No table value is fed back into the model.

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "text_table.hpp"
#include "trainplan/costmodel/estimate.hpp"
#include "trainplan/costmodel/network.hpp"
#include "trainplan/costmodel/presets.hpp"
#include "trainplan/planner/published_data.hpp"
#include "trainplan/planner/search.hpp"
#include "trainplan/planner/validate.hpp"

namespace trainplan::planner {

using costmodel::Error;
using costmodel::Result;
using detail::fmt;

namespace {

// Thrown inside a table's reproduction, turned into a Result at the public boundary.
class TableError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An embedded table and its name for messages ("megatron2021_table1.csv").
struct PublishedTable {
  std::string file;
  std::vector<CsvRow> rows;

  [[noreturn]] void fail(const CsvRow& row, const std::string& what) const {
    throw TableError(file + ": line " + std::to_string(row.line) + ": " + what);
  }
  [[nodiscard]] const std::string& text(const CsvRow& row, const std::string& column) const {
    const auto it = row.cells.find(column);
    if (it == row.cells.end()) fail(row, "no column \"" + column + "\"");
    return it->second;
  }
  // The number at the start of the cell ("8 (derived from 16k tok/GPU)" reads 8).
  [[nodiscard]] double number(const CsvRow& row, const std::string& column) const {
    const std::string& cell = text(row, column);
    char* end = nullptr;
    const double x = std::strtod(cell.c_str(), &end);
    if (end == cell.c_str() || !std::isfinite(x)) fail(row, column + ": not a number (got \"" + cell + "\")");
    return x;
  }
  [[nodiscard]] int integer(const CsvRow& row, const std::string& column) const {
    const double x = number(row, column);
    if (x < 1 || x > (1 << 30)) fail(row, column + ": must be a positive integer (got \"" + text(row, column) + "\")");
    return static_cast<int>(x);
  }
};

PublishedTable load_table(const std::string& name) {
  auto text = published_data_text(name);
  if (!text) throw TableError(text.error().message);
  const std::string file = name + ".csv";
  auto rows = parse_csv(*text, file);
  if (!rows) throw TableError(rows.error().message);
  return PublishedTable{file, std::move(rows).value()};
}

template <typename T>
T checked(Result<T> result) {
  if (!result) throw TableError(result.error().message);
  return std::move(result).value();
}

template <typename Fill>
Result<ValidationTable> reproduce(Fill fill) {
  try {
    ValidationTable table = fill();
    summarise(table);
    return table;
  } catch (const TableError& e) {
    return Error{e.what()};
  }
}

// The GPT model of a table row (costmodel::gpt_model: ffn 4h, tied embeddings).
costmodel::ModelSpec gpt_model(const PublishedTable& t, const CsvRow& row, const std::string& name) {
  const auto whole = [&](const char* column) { return static_cast<std::int64_t>(t.number(row, column)); };
  return costmodel::gpt_model(name, t.integer(row, "layers"), whole("hidden"), t.integer(row, "heads"), whole("seq"), whole("vocab"));
}

// The best plan the search finds, or, when none fits, the one that needs the least memory.
struct Found {
  Candidate candidate;
  std::string why_not;  // empty when it fits: "does not fit: stage 0 needs 91.3 GiB > 80.0 GiB"
  [[nodiscard]] bool fits() const { return why_not.empty(); }
  [[nodiscard]] const costmodel::Plan& plan() const { return candidate.plan; }
  [[nodiscard]] const costmodel::Estimate& estimate() const { return candidate.estimate; }
  // The note of a row: `plan_note`, and why the plan does not fit when it does not.
  [[nodiscard]] std::string note(const std::string& plan_note) const { return fits() ? plan_note : plan_note + "; " + why_not; }
};

Found best_plan(const costmodel::PlanRequest& request, const std::string& what) {
  auto result = search(request);
  if (!result) throw TableError(what + ": " + result.error().message);
  if (!result->ranked.empty()) return Found{result->ranked.front(), ""};
  if (result->alternatives.empty()) throw TableError(what + ": no plan to estimate");
  const Alternative& least_memory = result->alternatives.front();
  return Found{least_memory.candidate, "does not fit: " + least_memory.reason};
}

// A Megatron-LM style request: GPT with dropout and materialised attention, fp16, no ZeRO.
Found best_megatron_plan(const costmodel::ModelSpec& model, int gpus, long long global_batch, int tp, int pp,
                             costmodel::Recompute recompute, bool sequence_parallel, std::optional<int> micro_batch,
                             std::optional<int> virtual_stages, const std::string& what) {
  costmodel::PlanRequest req;
  req.model = model;
  req.cluster = checked(costmodel::find_hwprofile("dgx-a100-80g"));  // Selene: DGX A100 80GB, 8x HDR 200 Gb/s per node
  req.gpus = gpus;
  req.training.seq_len = model.max_seq_len;
  req.training.global_batch = global_batch;
  req.training.precision = costmodel::Precision::kFp16;
  req.training.dropout = true;
  req.training.attention = costmodel::AttentionKernel::kStandard;
  req.training.stack = costmodel::Stack::kMegatronTe;  // Megatron-LM's fused kernels (scaled masked softmax, bias-GeLU, bias-dropout-add)
  costmodel::resolve_training_defaults(req.model, req.training);
  auto& c = req.parallel;
  c.tp = tp;
  c.pp = pp;
  c.cp = 1;
  c.ep = 1;
  c.zero_stage = 0;
  c.shard_group = 0;
  c.recompute = recompute;
  c.sequence_parallel = sequence_parallel;
  c.offload_optimizer = costmodel::Offload::kNone;
  c.micro_batch = micro_batch;
  c.overlap_grad_reduce = false;  // Megatron-LM of 2021-22 reduced gradients after the backward pass
  if (pp == 1) {
    c.schedule = costmodel::Schedule::kOneFOneB;
    c.virtual_stages = 1;
  } else if (virtual_stages) {
    c.virtual_stages = *virtual_stages;
    c.schedule = *virtual_stages > 1 ? costmodel::Schedule::kInterleaved : costmodel::Schedule::kOneFOneB;
  }
  return best_plan(req, what);
}

std::string layout_note(const costmodel::ParallelConfig& p) {
  return fmt("tp=%d pp=%d dp=%d mb=%d v=%d", p.tp, p.pp, p.dp, p.micro_batch, p.virtual_stages);
}

// The recompute of an FSDP-style run as a note: "none", "selective", "full", "full on 12 of 40 layers".
std::string recompute_note(const costmodel::Plan& plan) {
  const auto& p = plan.parallel;
  std::string s = costmodel::recompute_name(p.recompute);
  if (p.recompute == costmodel::Recompute::kFull && p.recompute_layers > 0) {
    s += fmt(" on %d of %d layers", p.recompute_layers, plan.model.layers);
  }
  return s + fmt(", mb=%d", p.micro_batch);
}

// A table's model name as its preset is named ("Llama3-8B" is llama3-8b).
std::string lowercase(std::string name) {
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

// The FSDP-style request shared by the FSDP and torchtitan tables: every GPU in data
// parallelism with ZeRO-3 (FULL_SHARD), bf16, the rest at the search's defaults.
costmodel::PlanRequest fsdp_request(costmodel::ModelSpec model, costmodel::HardwareProfile cluster, int gpus, long long seq_len,
                                    long long global_batch, costmodel::Stack stack, costmodel::Recompute recompute, int micro_batch) {
  costmodel::PlanRequest req;
  req.model = std::move(model);
  req.cluster = std::move(cluster);
  req.gpus = gpus;
  req.training.seq_len = seq_len;
  req.training.global_batch = global_batch;
  req.training.precision = costmodel::Precision::kBf16;
  req.training.stack = stack;
  costmodel::resolve_training_defaults(req.model, req.training);
  auto& c = req.parallel;
  c.tp = 1;
  c.pp = 1;
  c.cp = 1;
  c.ep = 1;
  c.dp = gpus;
  c.zero_stage = 3;
  c.shard_group = 0;
  c.recompute = recompute;
  c.offload_optimizer = costmodel::Offload::kNone;
  c.micro_batch = micro_batch;
  return req;
}

// A published run on DGX-H100 predicted for the megatron-te stack: `row`'s gpus, tp, cp and pp as
// published, its sequence length and batch as given, no expert parallelism or offload.
costmodel::PlanRequest megatron_h100_request(const PublishedTable& t, const CsvRow& row, costmodel::ModelSpec model,
                                             const costmodel::HardwareProfile& h100, long long seq_len, long long global_batch,
                                             costmodel::Precision precision) {
  costmodel::PlanRequest req;
  req.model = std::move(model);
  req.cluster = h100;
  req.gpus = t.integer(row, "gpus");
  req.training.seq_len = seq_len;
  req.training.global_batch = global_batch;
  req.training.precision = precision;
  req.training.stack = costmodel::Stack::kMegatronTe;
  costmodel::resolve_training_defaults(req.model, req.training);
  auto& c = req.parallel;
  c.tp = t.integer(row, "tp");
  c.cp = t.integer(row, "cp");
  c.pp = t.integer(row, "pp");
  c.ep = 1;
  c.offload_optimizer = costmodel::Offload::kNone;
  return req;
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

ValidationRow validation_row(std::string label, double published, double predicted, std::string note, bool fits) {
  return ValidationRow{std::move(label), published, predicted, predicted / published - 1, std::move(note), fits};
}

void summarise(ValidationTable& table) {
  double sum = 0, worst = 0;
  for (const ValidationRow& row : table.rows) {
    sum += std::fabs(row.error);
    worst = std::max(worst, std::fabs(row.error));
  }
  table.mape = table.rows.empty() ? 0 : sum / static_cast<double>(table.rows.size());
  table.max_abs_error = worst;
}

Result<ValidationTable> validate_megatron2021_table1() {
  return reproduce([] {
    const PublishedTable t = load_table("megatron2021_table1");
    ValidationTable table;
    table.id = "megatron2021_table1";
    table.title = "Megatron-LM 2021, Table 1";
    table.quantity = "hardware TFLOP/s per GPU";
    table.source = "Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM, Table 1 "
                   "(GPT on A100-80GB, full recompute; micro-batch and interleaving searched)";
    for (const CsvRow& row : t.rows) {
      const std::string params = t.text(row, "params_b") + "B";
      const int gpus = t.integer(row, "gpus"), tp = t.integer(row, "tp"), pp = t.integer(row, "pp");
      const long long batch = static_cast<long long>(t.number(row, "global_batch"));
      const std::string label = fmt("%s, %d GPUs, tp%d pp%d, batch %lld", params.c_str(), gpus, tp, pp, batch);
      const Found best = best_megatron_plan(gpt_model(t, row, params), gpus, batch, tp, pp, costmodel::Recompute::kFull, false,
                                            std::nullopt, std::nullopt, t.file + ": " + label);
      table.rows.push_back(validation_row(label, t.number(row, "tflops_per_gpu"), best.estimate().throughput.hardware_tflops_per_gpu,
                                          best.note(fmt("mb=%d v=%d", best.plan().parallel.micro_batch, best.plan().parallel.virtual_stages)),
                                          best.fits()));
    }
    return table;
  });
}

Result<ValidationTable> validate_korthikanti2022_table3() {
  return reproduce([] {
    const PublishedTable t = load_table("korthikanti2022");
    ValidationTable table;
    table.id = "korthikanti2022_table3";
    table.title = "Korthikanti 2022, Table 3";
    table.quantity = "iteration seconds";
    table.source = "Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models, Table 3 "
                   "(GPT on A100-80GB at the paper's batch and micro-batch)";
    for (const CsvRow& row : t.rows) {
      if (t.text(row, "iter_s_full_recompute").empty()) continue;  // the dp=8 row has no Table 3 entry
      const std::string model = t.text(row, "model");
      const costmodel::ModelSpec m = gpt_model(t, row, model);
      const int v = t.text(row, "interleave_stages").empty() ? 1 : t.integer(row, "interleave_stages");
      const auto run = [&](costmodel::Recompute r, bool sp, const std::string& label, const char* column) {
        const Found best = best_megatron_plan(m, t.integer(row, "gpus"), static_cast<long long>(t.number(row, "global_batch")),
                                              t.integer(row, "tp"), t.integer(row, "pp"), r, sp, t.integer(row, "micro_batch"), v,
                                              t.file + ": " + label);
        table.rows.push_back(validation_row(label, t.number(row, column), best.estimate().time.step.value(),
                                            best.note(layout_note(best.plan().parallel)), best.fits()));
      };
      run(costmodel::Recompute::kFull, false, model + " full recompute", "iter_s_full_recompute");
      run(costmodel::Recompute::kSelective, true, model + " SP + selective", "iter_s_sp_plus_selective");
    }
    return table;
  });
}

Result<ValidationTable> validate_korthikanti2022_table4() {
  return reproduce([] {
    const PublishedTable layers = load_table("korthikanti2022_table4_layer");
    const PublishedTable models = load_table("korthikanti2022");
    // Table 4 times one transformer layer of Table 3's 22B model (tp 8 on one DGX A100, micro-batch 4).
    const CsvRow* row22 = nullptr;
    for (const CsvRow& row : models.rows) {
      if (models.text(row, "model") == "22B") row22 = &row;
    }
    if (row22 == nullptr) throw TableError(models.file + ": no 22B row (Table 4 times one layer of it)");
    const CsvRow& m = *row22;
    ValidationTable table;
    table.id = "korthikanti2022_table4";
    table.title = "Korthikanti 2022, Table 4";
    table.quantity = "milliseconds per layer";
    table.source = "Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models, Table 4 "
                   "(forward and backward time of one transformer layer of the 22B GPT, tp 8 on 8 A100-80GB, micro-batch 4, seq 2048; "
                   "predicted: the layer the step estimate prices, tensor-parallel communication included, the backward with its recompute)";
    const costmodel::ModelSpec model = gpt_model(models, m, "22B");
    struct Setting {
      const char* experiment;
      const char* label;
      costmodel::Recompute recompute;
      bool sequence_parallel;
    };
    const Setting settings[] = {
        {"baseline_no_recompute", "no recompute", costmodel::Recompute::kNone, false},
        {"sequence_parallel", "sequence parallelism", costmodel::Recompute::kNone, true},
        {"full_recompute", "full recompute", costmodel::Recompute::kFull, false},
        {"selective_recompute", "selective recompute", costmodel::Recompute::kSelective, false},
        {"selective_plus_sequence", "selective + sequence parallelism", costmodel::Recompute::kSelective, true},
    };
    for (const CsvRow& row : layers.rows) {
      const std::string experiment = layers.text(row, "experiment");
      const Setting* setting = nullptr;
      for (const Setting& candidate : settings) {
        if (experiment == candidate.experiment) setting = &candidate;
      }
      if (setting == nullptr) layers.fail(row, "unknown experiment \"" + experiment + "\"");
      const Found best = best_megatron_plan(model, models.integer(m, "gpus"), static_cast<long long>(models.number(m, "global_batch")),
                                            models.integer(m, "tp"), models.integer(m, "pp"), setting->recompute, setting->sequence_parallel,
                                            models.integer(m, "micro_batch"), 1, layers.file + ": " + setting->label);
      // The paper timed one layer, not the whole model: whether all 48 layers fit at this setting
      // (without recompute they do not) is no part of the row.
      const costmodel::LayerCost layer = costmodel::plan_layer_cost(best.plan());
      const std::string note = layout_note(best.plan().parallel);
      table.rows.push_back(validation_row(std::string(setting->label) + ": forward", layers.number(row, "fwd_ms"), layer.forward_total() * 1e3, note));
      table.rows.push_back(validation_row(std::string(setting->label) + ": backward", layers.number(row, "bwd_ms"), layer.backward_total() * 1e3, note));
    }
    return table;
  });
}

Result<ValidationTable> validate_zero2020_table1() {
  return reproduce([] {
    const PublishedTable t = load_table("zero2020_table1");
    ValidationTable table;
    table.id = "zero2020_table1";
    table.run_kind = "analytic";
    table.title = "ZeRO 2020, Table 1";
    table.quantity = "model-state GB (1e9 bytes) per device";
    table.source = "Rajbhandari et al. 2020, ZeRO: Memory Optimizations Toward Training Trillion Parameter Models, Table 1 "
                   "(mixed-precision Adam, K = 12; the paper rounds to 3 significant digits)";
    const std::pair<const char*, double> models[] = {{"7_5B", 7.5e9}, {"128B", 128e9}, {"1T", 1e12}};
    const std::pair<const char*, int> stages[] = {{"_Pos", 1}, {"_Pos_g", 2}, {"_Pos_g_p", 3}};
    const char* stage_names[] = {"", "P_os", "P_os+g", "P_os+g+p"};
    for (const CsvRow& row : t.rows) {
      const int dp = t.integer(row, "dp");
      for (const auto& [model, params] : models) {
        for (const auto& [suffix, stage] : stages) {
          const costmodel::ModelStateBytes b =
              costmodel::zero_model_states(params, costmodel::Precision::kBf16, costmodel::OptimizerKind::kAdamW, stage, dp);
          std::string name = model;
          if (name == "7_5B") name = "7.5B";
          table.rows.push_back(validation_row(fmt("%s %s, dp=%d", name.c_str(), stage_names[stage], dp),
                                              t.number(row, std::string("m") + model + suffix), (b.weights + b.gradients + b.optimizer) / 1e9,
                                              fmt("ZeRO-%d", stage)));
        }
      }
    }
    return table;
  });
}

Result<ValidationTable> validate_fsdp_runs_a100() {
  return reproduce([] {
    const PublishedTable t = load_table("fsdp_runs_a100");
    ValidationTable table;
    table.id = "fsdp_runs_a100";
    table.title = "FSDP runs on A100";
    table.quantity = "tokens/s per GPU";
    table.source = "TinyLlama README (jzhang38/TinyLlama); PyTorch/IBM blog \"Maximizing training throughput using PyTorch FSDP\", "
                   "Table 1 (FULL_SHARD, bf16, predicted for the fsdp1 stack with a bf16 reduce-scatter; cluster IBM Vela, "
                   "tests/data/ibm-vela-a100-80g.json; their Llama's norms are foundation-model-stack's LayerNormParameterized, "
                   "fms/modules/layernorm.py: float32 ATen ops like transformers' LlamaRMSNorm, which fsdp1 prices); the tokens per "
                   "second per GPU they measured, as published, rounded (700 may be "
                   "650 to 750). Their MFUs follow no one FLOP count the published pairs show: the 13B row's fits 6 N + 12 L h s per "
                   "token (attention non-causal), the 7B row's is above it, the 70B row's below even a causal count, the 34B row's "
                   "too coarse to tell";
    const auto vela_text = checked(published_data_text("ibm-vela-a100-80g"));
    const costmodel::HardwareProfile vela = checked(costmodel::parse_hwprofile_text(vela_text, "ibm-vela-a100-80g.json"));
    for (const CsvRow& row : t.rows) {
      const std::string run = t.text(row, "run");
      const bool tinyllama = starts_with(run, "TinyLlama");
      costmodel::ModelSpec model;
      costmodel::HardwareProfile cluster;
      if (tinyllama) {
        model = checked(costmodel::find_model("tinyllama-1.1b"));
        cluster = checked(costmodel::find_hwprofile("dgx-a100-40g"));
      } else {
        const double b = t.number(row, "params_b");
        model = checked(costmodel::find_model(b < 10 ? "llama2-7b" : b < 20 ? "llama2-13b" : b < 50 ? "llama2-7b" : "llama2-70b"));
        if (b > 20 && b < 50) {  // Llama 2 34B architecture (Touvron et al. 2023, Table 1 / Code Llama 34B config)
          model.name = "llama2-34b";
          model.layers = 48;
          model.hidden = 8192;
          model.heads = 64;
          model.kv_heads = 8;
          model.ffn_hidden = 22016;
        }
        cluster = vela;
      }
      const std::string ac = t.text(row, "act_recompute");
      const costmodel::Recompute r = starts_with(ac, "full")        ? costmodel::Recompute::kFull
                                     : starts_with(ac, "selective") ? costmodel::Recompute::kSelective
                                                                    : costmodel::Recompute::kNone;
      // TinyLlama used fused kernels (flash-attn rotary, RMSNorm and cross-entropy, xformers SwiGLU,
      // a fused QKV; per its README): the fused stack. The PyTorch/IBM runs used FSDP1 on plain
      // PyTorch modules (no torch.compile) with every dtype bf16 (the blog's mixed-precision
      // policy: parameters, reduction and buffers in bf16).
      costmodel::PlanRequest req = fsdp_request(std::move(model), std::move(cluster), t.integer(row, "gpus"),
                                                static_cast<long long>(t.number(row, "seq")),
                                                static_cast<long long>(t.number(row, "global_batch")),
                                                tinyllama ? costmodel::Stack::kMegatronTe : costmodel::Stack::kFsdp1, r,
                                                t.integer(row, "micro_batch"));
      if (!tinyllama) req.parallel.reduce_dtype = costmodel::Dtype::kBf16;
      if (ac.find("every n blocks") != std::string::npos) {
        // "Selective" here checkpoints every n-th block fully; n is not given, but the published
        // HFU/MFU ratio (59/51) fixes the recomputed fraction: a full forward is 1/3 of a layer's
        // FLOPs, so f = 3 * (HFU/MFU - 1).
        const double hfu_over_mfu = 59.0 / 51.0;
        const double fraction = 3 * (hfu_over_mfu - 1);
        req.parallel.recompute = costmodel::Recompute::kFull;
        req.parallel.recompute_layers = static_cast<int>(std::lround(fraction * req.model.layers));
      }
      const std::string label = fmt("%s, %d GPUs", run.c_str(), req.gpus);
      const Found best = best_plan(req, t.file + ": " + label);
      table.rows.push_back(validation_row(label, t.number(row, "tokens_per_s_per_gpu"), best.estimate().throughput.tokens_per_second_per_gpu,
                                          best.note(recompute_note(best.plan())), best.fits()));
    }
    return table;
  });
}

// The attention kernel a torchtitan row ran (its "attention" column; each CSV's header says why):
// SDPA's choice at the row's torchtitan commit and PyTorch, which the fsdp2 stacks of today's
// torchtitan (cuDNN first, models/attention.py since 6a3a9da95) need not share.
static costmodel::AttentionImpl row_attention(const PublishedTable& t, const CsvRow& row) {
  const auto impl = costmodel::attention_impl_from_name(t.text(row, "attention"));
  if (!impl) t.fail(row, "attention: must be " + std::string(costmodel::attention_impl_choices()) + " (got \"" + t.text(row, "attention") + "\")");
  return *impl;
}

Result<ValidationTable> validate_torchtitan_a100() {
  return reproduce([] {
    const PublishedTable t = load_table("torchtitan_a100");
    ValidationTable table;
    table.id = "torchtitan_a100";
    table.title = "torchtitan on A100";
    table.quantity = "tokens/s per GPU";
    table.source = "torchtitan docs/performance.md (older version): Llama 3 and Llama 2 with FSDP2 on 64 A100-80GB, bf16, eager "
                   "modules, predicted for the fsdp2 stack (fp32 reduce-scatter, torchtitan's default); activation checkpointing \"selective(layer)\" taken as full recompute of every 2nd layer (torchtitan's "
                   "default frequency), \"selective(op)\" as selective recompute, which for the fsdp2 stack is torchtitan's op-level policy "
                   "(SDPA and every other matmul saved, the rest recomputed); the tokens per second per GPU it measured (its MFU "
                   "column counts 6 N + 12 L h s FLOPs per token, N every parameter and attention non-causal: 2904 tokens/s is 56.8% "
                   "for Llama 3 8B at 8K, where the model's count, attention non-causal too, leaves out the embedding lookup, which does "
                   "no matmul: 5.2% fewer FLOPs there, about 1% for the other models)";
    const costmodel::HardwareProfile a100 = checked(costmodel::find_hwprofile("dgx-a100-80g"));
    for (const CsvRow& row : t.rows) {
      const std::string name = t.text(row, "model");
      const std::string ac = t.text(row, "act_ckpt");
      if (t.text(row, "gpu") != "A100-80GB") t.fail(row, "gpu: only A100-80GB runs are reproduced (got \"" + t.text(row, "gpu") + "\")");
      if (!starts_with(t.text(row, "parallelism"), "FSDP")) t.fail(row, "parallelism: only FSDP runs are reproduced");
      costmodel::ModelSpec model = checked(costmodel::find_model(lowercase(name)));
      costmodel::Recompute r = costmodel::Recompute::kNone;
      int recompute_layers = 0;
      if (ac == "full") {
        r = costmodel::Recompute::kFull;
      } else if (ac == "selective(op)") {
        r = costmodel::Recompute::kSelective;
      } else if (ac == "selective(layer)") {
        r = costmodel::Recompute::kFull;
        recompute_layers = model.layers / 2;
      } else if (ac != "none") {
        t.fail(row, "act_ckpt: must be none | full | selective(op) | selective(layer) (got \"" + ac + "\")");
      }
      costmodel::PlanRequest req = fsdp_request(std::move(model), a100, t.integer(row, "gpus"), static_cast<long long>(t.number(row, "seq")),
                                                static_cast<long long>(t.number(row, "global_batch")), costmodel::Stack::kFsdp2, r,
                                                t.integer(row, "local_batch"));
      req.parallel.recompute_layers = recompute_layers;
      req.training.attention_kernel = row_attention(t, row);
      const std::string label = fmt("%s, %d GPUs, seq %lld, %s", name.c_str(), req.gpus, static_cast<long long>(req.training.seq_len), ac.c_str());
      const Found best = best_plan(req, t.file + ": " + label);
      table.rows.push_back(validation_row(label, t.number(row, "tokens_per_s_per_gpu"), best.estimate().throughput.tokens_per_second_per_gpu,
                                          best.note(recompute_note(best.plan())), best.fits()));
    }
    return table;
  });
}

// The rows of a torchtitan benchmark table (tests/data/torchtitan_h100_h200.csv and the same
// columns in torchao_float8_h100.csv) predicted for the fsdp2-compile stack with the published
// layout, local batch, activation checkpointing ("op" as selective, TP with sequence-parallel
// norms), fp8 as tensorwise current scaling with or without the fp8 all-gather, the allocator the
// launcher set and the loss (compiled or eager) of the torchtitan commit; `gpus` maps the table's
// gpu column to a profile.
void torchtitan_rows(const PublishedTable& t, ValidationTable& table, const std::map<std::string, costmodel::HardwareProfile>& gpus) {
  for (const CsvRow& row : t.rows) {
    const std::string gpu = t.text(row, "gpu");
    const auto profile = gpus.find(gpu);
    if (profile == gpus.end()) {
      std::string known;
      for (const auto& [name, hw] : gpus) known += (known.empty() ? "" : " or ") + name;
      t.fail(row, "gpu: must be " + known + " (got \"" + gpu + "\")");
    }
    const std::string ac = t.text(row, "act_ckpt");
    if (ac != "full" && ac != "selective(op)") t.fail(row, "act_ckpt: must be full or selective(op) (got \"" + ac + "\")");
    const std::string precision = t.text(row, "precision");
    if (precision != "bf16" && precision != "fp8") t.fail(row, "precision: must be bf16 or fp8 (got \"" + precision + "\")");
    const std::string fp8_all_gather = t.text(row, "fp8_all_gather");
    if (fp8_all_gather != "true" && fp8_all_gather != "false") t.fail(row, "fp8_all_gather: must be true or false (got \"" + fp8_all_gather + "\")");
    const auto allocator = costmodel::allocator_from_name(t.text(row, "allocator"));
    if (!allocator) t.fail(row, "allocator: must be caching or expandable-segments (got \"" + t.text(row, "allocator") + "\")");
    // Whether torchtitan compiled its loss (fused) or ran it eagerly on fp32 logits depends on its
    // commit (components/loss.py; each CSV's header says which).
    const auto loss = costmodel::loss_kernel_from_name(t.text(row, "loss"));
    if (!loss || (*loss != costmodel::LossKernel::kFused && *loss != costmodel::LossKernel::kFp32Copy)) {
      t.fail(row, "loss: must be fused or fp32-logits (got \"" + t.text(row, "loss") + "\")");
    }
    const int n = t.integer(row, "gpus"), tp = t.integer(row, "tp"), dp = t.integer(row, "dp");
    if (tp * dp != n) t.fail(row, "tp x dp must be gpus");
    // torchtitan's local batch is per data-parallel rank: the global batch is local_batch x dp.
    if (static_cast<long long>(t.number(row, "global_batch")) != static_cast<long long>(t.integer(row, "local_batch")) * dp) {
      t.fail(row, "global_batch must be local_batch x dp");
    }
    costmodel::PlanRequest req =
        fsdp_request(checked(costmodel::find_model(lowercase(t.text(row, "model")))), profile->second, n, static_cast<long long>(t.number(row, "seq")),
                     static_cast<long long>(t.number(row, "global_batch")), costmodel::Stack::kFsdp2Compile,
                     ac == "full" ? costmodel::Recompute::kFull : costmodel::Recompute::kSelective, t.integer(row, "local_batch"));
    if (precision == "fp8") {
      req.training.precision = costmodel::Precision::kFp8;
      req.training.fp8_recipe = costmodel::Fp8Recipe::kCurrent;  // torchao's tensorwise dynamic scaling
      req.training.fp8_all_gather = fp8_all_gather == "true";
    } else if (fp8_all_gather == "true") {
      t.fail(row, "fp8_all_gather: true needs precision fp8");
    }
    req.training.allocator = *allocator;
    req.training.loss = *loss;
    req.training.attention_kernel = row_attention(t, row);
    req.parallel.tp = tp;
    req.parallel.dp = dp;
    if (tp > 1) req.parallel.sequence_parallel = true;  // torchtitan's TP plan: SequenceParallel norms
    const std::string label = fmt("%s, %d %s, tp%d dp%d, mb %d, %s, %s%s", t.text(row, "model").c_str(), n, profile->first.c_str(), tp, dp,
                                  t.integer(row, "local_batch"), ac.c_str(), precision.c_str(), req.training.fp8_all_gather ? " (fp8 all-gather)" : "");
    const Found best = best_plan(req, t.file + ": " + label);
    const std::string note = best.note(recompute_note(best.plan()));
    table.rows.push_back(validation_row(label + ": tokens/s", t.number(row, "tokens_per_s_per_gpu"),
                                        best.estimate().throughput.tokens_per_second_per_gpu, note, best.fits()));
    if (!t.text(row, "peak_reserved_GiB").empty()) {
      table.rows.push_back(validation_row(label + ": reserved GiB", t.number(row, "peak_reserved_GiB"), best.estimate().memory.reserved.in_gib(),
                                          note, best.fits()));
    }
  }
}

Result<ValidationTable> validate_torchtitan_h100_h200() {
  return reproduce([] {
    const PublishedTable t = load_table("torchtitan_h100_h200");
    ValidationTable table;
    table.id = "torchtitan_h100_h200";
    table.title = "torchtitan on H100 and H200";
    table.quantity = "tokens/s per GPU, peak reserved GiB";
    table.missing = "the clock the 500 W H100s hold (none published; at the 700 W preset's they run +10% to +17%); on H200 (+17%, "
                    "+19%) most of it is in the compiled step itself: torchtitan's compiled fp8 step on one of our H200s runs 5.4% slower "
                    "than predicted (h200_stack_runs), not yet attributed kernel by kernel; peak memory within 6%";
    table.source = "torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (vanilla TP; Grand Teton H100 96GB HBM2e at "
                   "2.4 TB/s, 500 W power limit: dgx-h100 with that memory) and benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md "
                   "(dgx-h200; fp8 all-gather with precomputed scales), pytorch/torchtitan b5bcd76c6; predicted for the fsdp2-compile "
                   "stack with the published layout, local batch and activation checkpointing (\"op\" as selective, TP with "
                   "sequence-parallel norms), fp8 as tensorwise current scaling; not used to build the model";
    costmodel::HardwareProfile teton = checked(costmodel::find_hwprofile("dgx-h100"));
    // Grand Teton's H100 (the benchmark file): 96 GB of HBM2e at 2.4 TB/s per GPU, 400 Gb/s RDMA
    // per GPU as DGX H100's; its 500 W power limit's clock is not published, so none is set. The
    // preset's kernel tables were measured at 3.35 TB/s: their memory-bound samples run at 2.4
    // (KernelTables::hbm_bandwidth).
    teton.name = "grand-teton-h100-96g";
    teton.gpu.hbm_capacity = costmodel::Bytes(96.0 * 1024 * 1024 * 1024);
    teton.gpu.hbm_bandwidth = costmodel::BytesPerSecond(2.4e12);
    torchtitan_rows(t, table, {{"H100-96GB-500W", teton}, {"H200", checked(costmodel::find_hwprofile("dgx-h200"))}});
    return table;
  });
}

Result<ValidationTable> validate_torchao_float8_h100() {
  return reproduce([] {
    const PublishedTable t = load_table("torchao_float8_h100");
    ValidationTable table;
    table.id = "torchao_float8_h100";
    table.title = "torchao float8 on 8 H100";
    table.quantity = "tokens/s per GPU, peak reserved GiB";
    table.missing = "tokens/s +34% (bf16) and +43% (fp8) on one node, where the network plays no part; part of it is the compiled step "
                    "itself: torchtitan's compiled bf16 and fp8 steps on one of our H200s run 2% and 5.4% slower than predicted "
                    "(h200_stack_runs); the rest not found, and the file states no power limit; peak reserved -4% and -6%: the "
                    "gradients zero_grad freed leave blocks the forward reuses only in part (counted as reused)";
    table.source = "pytorch/ao torchao/float8/README.md (b79503772^), e2e training benchmarks on 8 H100: torchtitan Llama 3 8B, "
                   "seq 8192, local batch 1, FSDP2, torch.compile, per-op selective checkpointing, bf16 and tensorwise fp8 with the "
                   "fp8 all-gather, launched through run_train.sh (expandable segments), the loss run eagerly on fp32 logits (torchtitan "
                   "between e8977b007 and bbb1b616e, which compiled it again); predicted for the fsdp2-compile stack on dgx-h100 (memory "
                   "and power limit not stated); not used to build the model";
    torchtitan_rows(t, table, {{"H100", checked(costmodel::find_hwprofile("dgx-h100"))}});
    return table;
  });
}

Result<ValidationTable> validate_llama3_405b_h100() {
  return reproduce([] {
    const PublishedTable t = load_table("llama3_405b_h100");
    ValidationTable table;
    table.id = "llama3_405b_h100";
    table.run_kind = "production";
    table.title = "Llama 3 405B on H100 (held out)";
    table.missing = "a measured sustained clock of these H100s under months of load; Table 4's attention-FLOP convention at 131K "
                    "tokens (counted here as non-causal)";
    table.quantity = "MFU, %";
    table.source = "Dubey et al. 2024, The Llama 3 Herd of Models, Table 4 (bf16 MFU on 8K and 16K H100, tp/cp/pp/dp as published; "
                   "a production run, so the sustained step, which waits for the slowest GPU, is predicted); "
                   "predicted for the megatron-te stack on dgx-h100 with the fabric the paper describes (Sec. 3.3.1: pods of 3,072 "
                   "GPUs with full bisection, 1:7 oversubscription above them) and the published layout and 16M-token batches, "
                   "its pipeline (Sec. 3.3.2: 8 model chunks per stage, the first holding only the embedding and the last only the "
                   "loss); micro-batch, ZeRO stage and recompute searched; not used to build the model";
    const costmodel::ModelSpec model = checked(costmodel::find_model("llama3-405b"));
    costmodel::HardwareProfile h100 = checked(costmodel::find_hwprofile("dgx-h100"));
    // Meta's 24K-GPU clusters (Dubey et al. 2024, Sec. 3.3.1): 192 racks of 16 GPUs form a pod of
    // 3,072 with full bisection bandwidth; the aggregation layer joining 8 pods is 1:7 oversubscribed.
    h100.inter_node.pod_gpus = 3072;
    h100.inter_node.oversubscription = 7;
    for (const CsvRow& row : t.rows) {
      const auto seq = static_cast<long long>(t.number(row, "seq_len"));
      costmodel::PlanRequest req = megatron_h100_request(t, row, model, h100, seq, static_cast<long long>(t.number(row, "global_batch_tokens")) / seq,
                                                         costmodel::Precision::kBf16);
      auto& c = req.parallel;
      c.dp = t.integer(row, "dp");
      // Llama 3's context parallelism all-gathers K/V and reduce-scatters their gradients (Dubey et
      // al. 2024, Sec. 3.3.2), Megatron-Core's --cp-comm-type all_gather.
      c.cp_comm = costmodel::ContextAttention::kAllGatherKv;
      // Its pipeline (Sec. 3.3.2): interleaved, one layer less on the first and the last stage, "the
      // first model chunk on the first stage has only the embedding, and the last model chunk on the
      // last stage has only output projection and loss calculation": 126 layers + 2 in 16 x 8
      // chunks of one.
      c.schedule = costmodel::Schedule::kInterleaved;
      c.virtual_stages = 8;
      c.ends_in_split = true;
      const std::string label = fmt("%d GPUs, tp%d cp%d pp%d dp%d, seq %lld", req.gpus, *c.tp, *c.cp, *c.pp, *c.dp,
                                    static_cast<long long>(req.training.seq_len));
      const Found best = best_plan(req, t.file + ": " + label);
      const auto& p = best.plan().parallel;
      const std::string note = fmt("zero%d mb=%d v=%d, %s", p.zero_stage, p.micro_batch, p.virtual_stages, costmodel::recompute_name(p.recompute));
      // A production run (54 days of Llama 3 405B): its steps wait for the slowest GPU.
      const auto& tm = best.estimate().time;
      const double sustained_mfu = best.estimate().throughput.mfu * tm.step.value() / tm.sustained_step.value();
      table.rows.push_back(validation_row(label, t.number(row, "mfu_pct"), sustained_mfu * 100, best.note(note), best.fits()));
    }
    return table;
  });
}

Result<ValidationTable> validate_nemo_h100_fp8() {
  return reproduce([] {
    const PublishedTable t = load_table("nemo_h100_fp8");
    ValidationTable table;
    table.id = "nemo_h100_fp8";
    table.title = "NeMo on H100 in FP8 (held out)";
    table.quantity = "tokens/s per GPU";
    table.source = "NVIDIA's NeMo 24.07 and Megatron-Bridge 25.11 / 26.02 performance summaries (DGX-H100, FP8; layouts as "
                   "published); predicted for the megatron-te stack on dgx-h100 in fp8 with ZeRO-1 (the distributed optimizer; "
                   "ZeRO-3 where FSDP is on), sequence parallelism with TP, recompute searched, fp8 in the published recipe "
                   "(delayed scaling for 24.07, current scaling for 25.11 and 26.02); not used to build the model";
    const costmodel::HardwareProfile h100 = checked(costmodel::find_hwprofile("dgx-h100"));
    for (const CsvRow& row : t.rows) {
      costmodel::PlanRequest req =
          megatron_h100_request(t, row, checked(costmodel::find_model(t.text(row, "model"))), h100, static_cast<long long>(t.number(row, "seq")),
                                static_cast<long long>(t.number(row, "global_batch")), costmodel::Precision::kFp8);
      req.training.fp8_recipe = costmodel::fp8_recipe_from_name(t.text(row, "fp8_recipe"));
      if (!req.training.fp8_recipe) t.fail(row, "fp8_recipe: must be delayed | current");
      auto& c = req.parallel;
      const int model_parallel = *c.tp * *c.cp * *c.pp;
      if (req.gpus % model_parallel != 0) t.fail(row, "gpus: not a multiple of tp * cp * pp");
      c.dp = req.gpus / model_parallel;
      c.micro_batch = t.integer(row, "micro_batch");
      c.zero_stage = t.number(row, "fsdp") != 0 ? 3 : 1;
      c.shard_group = 0;
      c.sequence_parallel = *c.tp > 1;
      const int vp = t.integer(row, "vp");
      c.virtual_stages = vp;
      c.schedule = vp > 1 ? costmodel::Schedule::kInterleaved : costmodel::Schedule::kOneFOneB;
      const std::string label = fmt("%s %s, %d GPUs, tp%d pp%d cp%d vp%d", t.text(row, "source").c_str(), t.text(row, "model").c_str(),
                                    req.gpus, *c.tp, *c.pp, *c.cp, vp);
      const Found best = best_plan(req, t.file + ": " + label);
      const auto& p = best.plan().parallel;
      const std::string note = fmt("zero%d mb=%d, %s", p.zero_stage, p.micro_batch, costmodel::recompute_name(p.recompute));
      table.rows.push_back(validation_row(label, t.number(row, "tokens_per_s_per_gpu"), best.estimate().throughput.tokens_per_second_per_gpu,
                                          best.note(note), best.fits()));
    }
    return table;
  });
}

Result<ValidationTable> validate_nccl_tests() {
  return reproduce([] {
    const PublishedTable t = load_table("nccl_tests_published");
    ValidationTable table;
    table.id = "nccl_tests_published";
    table.run_kind = "microbenchmark";
    table.title = "nccl-tests, published";
    table.missing = "latency at small sizes: EFA's per-step latency (aws-ofi-nccl's 75 us is a tuning value, two p5 nodes measure "
                    "less), NVLS at mid sizes, the A100 node's older NCCL from 32 KiB to 256 MiB; every bandwidth-bound row is within 10%";
    table.quantity = "time per collective, us";
    table.source = "nccl-tests output printed by stas00/ml-engineering (network/README.md: 8xA100 all_reduce; 8xH200 with NVLS off) and "
                   "aws-samples/awsome-distributed-training (2x p4de, 2x p5 and 1x p5 all_reduce); predicted by network.hpp's NCCL "
                   "model (algorithm and protocol chosen as NCCL's tuning.cc chooses them, NVLS where the profile measured it and the "
                   "run left it on, the network plugin's reported latency on every network step) on the profile named in each row";
    for (const CsvRow& row : t.rows) {
      costmodel::HardwareProfile hw = checked(costmodel::find_hwprofile(t.text(row, "profile")));
      // A run made with NCCL_NVLS_ENABLE=0 is predicted without NVLS.
      if (t.text(row, "algo").find("NVLS_ENABLE=0") != std::string::npos) hw.intra_node.nvls_bus_bandwidth = costmodel::BytesPerSecond(0);
      const int gpus = t.integer(row, "gpus"), nodes = t.integer(row, "nodes");
      if (gpus % nodes != 0) t.fail(row, "gpus: not a multiple of nodes");
      const std::string kind = t.text(row, "collective");
      const costmodel::Collective c = kind == "all_reduce"   ? costmodel::Collective::kAllReduce
                                      : kind == "all_gather" ? costmodel::Collective::kAllGather
                                      : kind == "reduce_scatter" ? costmodel::Collective::kReduceScatter
                                                                 : (t.fail(row, "collective: must be all_reduce | all_gather | reduce_scatter"),
                                                                    costmodel::Collective::kAllReduce);
      const double bytes = t.number(row, "bytes");
      const costmodel::CollectiveCost cost = costmodel::collective_cost(hw, c, costmodel::Bytes(bytes), {gpus, gpus / nodes});
      const std::string size = bytes >= 1073741824.0 ? fmt("%.0f GiB", bytes / 1073741824.0)
                               : bytes >= 1048576.0  ? fmt("%.0f MiB", bytes / 1048576.0)
                               : bytes >= 1024.0     ? fmt("%.0f KiB", bytes / 1024.0)
                                                     : fmt("%.0f B", bytes);
      const std::string label = fmt("%s, %d GPUs / %d nodes, %s %s", t.text(row, "profile").c_str(), gpus, nodes, kind.c_str(), size.c_str());
      const std::string note = fmt("%s/%s, latency %.1f us", costmodel::nccl_algorithm_name(cost.algorithm),
                                   costmodel::nccl_protocol_name(cost.protocol), cost.latency.value() * 1e6);
      table.rows.push_back(validation_row(label, t.number(row, "time_us"), cost.time.value() * 1e6, note));
    }
    return table;
  });
}

Result<std::vector<ValidationTable>> validate_published() {
  std::vector<ValidationTable> tables;
  for (auto validate : {validate_h100_runs, validate_h100_stacks, validate_h200_stack_runs, validate_megatron2021_table1, validate_korthikanti2022_table3,
                        validate_korthikanti2022_table4,
                        validate_zero2020_table1, validate_fsdp_runs_a100, validate_torchtitan_a100, validate_torchtitan_h100_h200,
                        validate_torchao_float8_h100,
                        validate_llama3_405b_h100,
                        validate_nemo_h100_fp8, validate_nccl_tests}) {
    auto table = validate();
    if (!table) return table.error();
    tables.push_back(std::move(table).value());
  }
  return tables;
}

}  // namespace trainplan::planner
