#include "trainplan/planner/report.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include <nlohmann/json.hpp>

#include "text_table.hpp"
#include "trainplan/planner/launch.hpp"

namespace trainplan::planner {

using namespace trainplan::costmodel;
using detail::fmt;
using detail::Row;
using detail::table;
using detail::wrap_text;

namespace {

double gib(Bytes b) { return b.in_gib(); }

std::string duration_text(double seconds) {
  if (seconds < 120) return fmt("%.0f s", seconds);
  if (seconds < 7200) return fmt("%.0f min", seconds / 60);
  if (seconds < 172800) return fmt("%.1f h", seconds / 3600);
  return bounded_number(seconds / 86400, 1) + " days";
}

std::string plan_line(const ParallelConfig& p) {
  std::string s = fmt("tp=%d pp=%d dp=%d cp=%d", p.tp, p.pp, p.dp, p.cp);
  if (p.ep > 1) s += fmt(" ep=%d", p.ep);
  s += fmt(" zero=%d", p.zero_stage);
  if (p.shard_group) s += fmt(" shard_group=%d", p.shard_group);
  s += fmt(" micro_batch=%d recompute=%s", p.micro_batch, recompute_name(p.recompute));
  if (p.pp > 1) s += fmt(" schedule=%s", schedule_name(p.schedule));
  if (p.virtual_stages > 1) s += fmt(" virtual_stages=%d", p.virtual_stages);
  if (p.ends_in_split) s += " ends_in_split=on";
  if (p.tp > 1) s += p.sequence_parallel ? " sp=on" : " sp=off";
  if (p.offload_optimizer != Offload::kNone) s += fmt(" offload_optimizer=%s", offload_name(p.offload_optimizer));
  return s;
}

// In the words of the stack that runs it: FSDP's sharding strategies, DeepSpeed's stages (its
// hybrid shard is MiCS), the ZeRO stages with their FSDP names elsewhere.
const char* sharding_name(const ParallelConfig& p, Stack stack) {
  if (p.dp * p.cp == 1) return "none";
  const bool fsdp = is_fsdp1(stack) || stack == Stack::kFsdp2 || stack == Stack::kFsdp2Compile || stack == Stack::kHfFsdp2;
  const bool deepspeed = stack == Stack::kDeepspeed || stack == Stack::kDeepspeedV03;
  switch (p.zero_stage) {
    case 0: return fsdp ? "NO_SHARD (DDP)" : "DDP";
    case 1: return "ZeRO-1";
    case 2: return fsdp ? "SHARD_GRAD_OP" : deepspeed ? "ZeRO-2" : "ZeRO-2 (FSDP grad-op)";
    default:
      if (deepspeed) return p.shard_group ? "ZeRO-3 within shard groups (DeepSpeed MiCS)" : "ZeRO-3";
      if (fsdp) return p.shard_group ? "HYBRID_SHARD" : "FULL_SHARD";
      return p.shard_group ? "FSDP hybrid shard" : "ZeRO-3 (FSDP full shard)";
  }
}

std::string model_line(const ModelSpec& m) {
  const double params = count_parameters(m).total(m.layers);
  std::string s = fmt("%s: %s parameters (%s; %d layers, hidden %lld, %d heads", m.name.c_str(), si(params).c_str(),
                      architecture_name(m.architecture), m.layers, static_cast<long long>(m.hidden), m.heads);
  if (m.mla) {
    s += fmt(" with MLA (kv rank %lld", static_cast<long long>(m.mla->kv_lora_rank));
    if (m.mla->q_lora_rank > 0) s += fmt(", q rank %lld", static_cast<long long>(m.mla->q_lora_rank));
    s += ")";
  } else if (m.kv_heads != m.heads) {
    s += fmt(" / %d kv", m.kv_heads);
  }
  if (m.head_size > 0) s += fmt(" of %lld", static_cast<long long>(m.head_size));
  if (m.sliding_window > 0) s += fmt(", window %lld", static_cast<long long>(m.sliding_window));
  s += fmt(", ffn %lld, vocab %lld", static_cast<long long>(m.ffn_hidden), static_cast<long long>(m.vocab));
  if (m.moe) {
    s += fmt(", %d experts top-%d", m.moe->experts, m.moe->top_k);
    if (m.moe->shared_ffn_hidden > 0) s += fmt(" + shared %lld", static_cast<long long>(m.moe->shared_ffn_hidden));
    if (m.moe->dense_layers > 0) s += fmt(" after %d dense layers", m.moe->dense_layers);
    s += fmt(", %s active", si(count_parameters(m).active(m.layers)).c_str());
  }
  return s + ")";
}

std::string cluster_line(const HardwareProfile& hw, int gpus, bool is_default) {
  const int nodes = (gpus + hw.gpus_per_node - 1) / hw.gpus_per_node;
  std::string s = fmt("%s: %d node%s x %d %s (%.0f GiB HBM, %.0f TFLOP/s bf16 dense), %s %.0f GB/s per GPU, %d x %.0f Gb/s %s per node",
                      hw.name.c_str(), nodes, nodes == 1 ? "" : "s", std::min(gpus, hw.gpus_per_node), hw.gpu.name.c_str(),
                      hw.gpu.hbm_capacity.in_gib(), hw.gpu.peak_for(Dtype::kBf16).in_tflops(), hw.intra_node.kind.c_str(),
                      hw.intra_node.bandwidth.in_gb_per_s(), hw.inter_node.nics_per_node,
                      hw.inter_node.bandwidth.value() * 8 / 1e9, hw.inter_node.kind.c_str());
  if (hw.nvlink_domain_gpus() > hw.gpus_per_node) s += fmt(", NVLink domain of %d GPUs", hw.nvlink_domain_gpus());
  if (hw.gpu.clock_slowdown() > 1.0) {
    s += fmt(", sustained clock %.0f of %.0f MHz", hw.gpu.sustained_clock_mhz, hw.gpu.peak_clock_mhz);
    if (hw.gpu.power_limit_w > 0) s += fmt(" at %.0f W", hw.gpu.power_limit_w);
  }
  if (is_default) s += "  [default cluster; choose another with --cluster]";
  return s;
}

std::string training_line(const TrainingConfig& t, const std::string& tokens_note, const std::string& batch_note) {
  std::string s = fmt("seq_len %lld, global batch %lld sequences (%s tokens%s), %s, %s, %s", static_cast<long long>(t.seq_len),
                      static_cast<long long>(t.global_batch), si(static_cast<double>(t.global_batch) * t.seq_len).c_str(),
                      batch_note.empty() ? "" : ("; " + batch_note).c_str(), precision_name(t.precision), optimizer_name(t.optimizer),
                      mode_name(t.mode));
  if (t.mode == TrainingMode::kLora || t.mode == TrainingMode::kQlora) s += fmt(" (rank %d)", t.lora.rank);
  s += fmt(", %s tokens to train", si(t.train_tokens).c_str());
  if (!tokens_note.empty()) s += " (" + tokens_note + ")";
  return s;
}

// `plan`: the layer setting of the one plan reported (whether its weights are gathered in fp8,
// whether it trains under autocast); null for a search's request.
std::string stack_line(const TrainingConfig& t, const LayerSetting* plan = nullptr) {
  std::string s = std::string(stack_name(t.stack)) + ": " + stack_spec(t.stack).summary + " [choose with --stack]";
  // What the plan changes in the stack (--loss, --attention-kernel, --attention-mask, --pure-16bit, --fp8-all-gather).
  std::string changes;
  const auto add = [&](const std::string& what) { changes += (changes.empty() ? "" : "; ") + what; };
  if (t.loss && *t.loss != stack_spec(t.stack).loss) add(std::string("loss ") + loss_kernel_name(*t.loss));
  if (t.attention_kernel && *t.attention_kernel != stack_spec(t.stack).attention_kernel) {
    add(std::string("attention kernel ") + attention_impl_name(*t.attention_kernel));
  }
  if (t.attention_mask == AttentionMask::kExplicit) add("explicit attention mask (the whole seq x seq rectangle computed)");
  if (!t.master_weights) add("pure 16-bit: no fp32 master weights, 16-bit optimizer states");
  if (t.precision == Precision::kFp8 && t.fp8_recipe && *t.fp8_recipe != stack_spec(t.stack).fp8_recipe) {
    add(*t.fp8_recipe == Fp8Recipe::kCurrent ? "fp8 current scaling (each tensor's amax taken before its cast)" : "fp8 delayed scaling");
  }
  if (t.fp8_all_gather) {
    const std::string gathered = "fp8 all-gather of the linear layers' weights, scales precomputed once a step";
    if (plan == nullptr) {
      add(gathered + " (where FSDP shards them over data-parallel ranks)");
    } else {
      add(plan->fp8_gathered_weights ? gathered : "fp8 all-gather asked, but no parameters are sharded over data-parallel ranks: nothing gathered");
    }
  }
  if (t.allocator != Allocator::kCaching) add(std::string("PYTORCH_ALLOC_CONF=") + allocator_conf(t.allocator));
  if (plan && plan->autocast) {
    add("the fp32 module under torch.autocast, no FSDP sharding (fp32 weights, gradients and optimizer states; each weight and input cast at "
        "every use; an fp32 residual stream)");
  }
  if (!changes.empty()) s += "; this plan: " + changes;
  return s;
}

// One row of the ranked table; `variants`: how many variants of its layout fit (0: not folded).
Row ranked_row(const std::string& rank, const Candidate& c, std::int64_t variants) {
  const auto& p = c.plan.parallel;
  const auto& e = c.estimate;
  return Row{{rank, std::to_string(p.tp), std::to_string(p.pp), std::to_string(p.dp), std::to_string(p.cp),
              std::to_string(p.ep), std::to_string(p.zero_stage) + (p.shard_group ? fmt("/h%d", p.shard_group) : ""),
              std::to_string(p.micro_batch), std::to_string(e.micro_batches), recompute_name(p.recompute),
              p.pp == 1 ? "-" : (p.virtual_stages > 1 ? fmt("int.v%d", p.virtual_stages) : schedule_name(p.schedule)),
              bounded_number(gib(e.memory.required), 1) + " / " + bounded_number(gib(e.memory.capacity), 0) + (e.tight ? " tight" : ""),
              bounded_number(e.time.step.value(), 2), si(e.throughput.tokens_per_second), fmt("%.1f%%", 100 * e.throughput.mfu),
              bounded_number(e.run.wall_time.in_days(), 1), si(e.run.gpu_hours), variants > 1 ? std::to_string(variants - 1) : ""}};
}

const std::vector<std::string> kRankedHeader = {"#", "TP", "PP", "DP", "CP", "EP", "ZeRO", "MB", "GA", "recompute", "schedule",
                                                "GiB/GPU (of)", "step s", "tokens/s", "MFU", "days", "GPU-h", "+variants"};
const std::vector<bool> kRankedRight = {true, true, true, true, true, true, true, true, true, false, false, true, true, true, true, true, true, true};

std::int64_t variant_count(const SearchResult& result, std::size_t i) {
  return i < result.variants.size() ? result.variants[i].count : 0;
}

std::string memory_table(const Estimate& e, const TrainingConfig& t, bool md) {
  const auto& m = e.memory;
  std::vector<Row> rows;
  const auto add = [&](const char* name, Bytes b, const std::string& note) {
    rows.push_back(Row{{name, bounded_number(gib(b), 2), bounded_number(100 * b.value() / m.capacity.value(), 0) + "%", note}});
  };
  const char* verdict = !e.fits ? "DOES NOT FIT" : e.tight ? "fits, but tight (within the memory headroom)" : "fits";
  add("weights", m.weights, "");
  add("gradients", m.gradients,
      m.gradients_step_end.value() > m.gradients.value()
          ? "alive at the peak; " + bounded_number(gib(m.gradients_step_end), 2) + " by the step's end (zero_grad freed them; backward makes them)"
          : "");
  add("optimizer states", m.optimizer,
      e.autocast ? "fp32 module under autocast: no master copy"
                 : state_widths(t.precision, t.optimizer, t.master_weights).master ? "incl. fp32 master weights" : "");
  add("activations", m.activations,
      "peak; " + count_text(m.micro_batches_in_flight, "micro-batch", "micro-batches") + " in flight, logits and gradients included" +
          (m.autocast_copies.value() > 0 ? ", and " + bounded_number(gib(m.autocast_copies), 2) + " of autocast's 16-bit weight copies" : ""));
  add("comm buffers, workspaces", m.buffers, "");
  add("= allocated", m.total, "peak of the tensors alive at once");
  add("allocator cache", m.reserved - m.total,
      t.allocator == Allocator::kExpandableSegments ? "expandable segments: each stream's part-used last page (empty pages unmapped when short)"
                                                    : "freed blocks PyTorch's caching allocator keeps");
  add("= reserved", m.reserved, "");
  add("CUDA context", m.overhead, "and workspaces outside the allocator");
  add("= required", m.required, verdict);
  add("capacity", m.capacity, "");
  return table({"memory per GPU" + std::string(e.pipeline.stages > 1 ? fmt(" (stage %d)", m.worst_stage) : ""), "GiB", "of HBM", ""},
               rows, md, {false, true, true, false});
}

// How the plan's context parallelism moves K/V, for the time table (stack.hpp ContextAttention).
const char* cp_comm_note(const Plan& plan) {
  switch (plan.parallel.cp_comm.value_or(stack_spec(plan.training.stack).context_attention)) {
    case ContextAttention::kRing: return "exposed part of the ring";
    case ContextAttention::kAllGatherKv: return "K/V all-gathered, their gradients reduce-scattered: not overlapped";
    case ContextAttention::kAllGatherRotate: return "K/V all-gathered, their gradients passed round the ring";
  }
  return "";
}

std::string time_table(const Plan& plan, const Estimate& e, bool md) {
  const auto& t = e.time;
  std::vector<Row> rows;
  const auto add = [&](const char* name, Seconds s, const std::string& note) {
    if (s.value() <= 0 && std::string(name) != "step") return;
    rows.push_back(Row{{name, bounded_number(s.value(), 3), bounded_number(100 * s.value() / t.step.value(), 1) + "%", note}});
  };
  add("compute", t.compute,
      count_text(e.micro_batches, "micro-batch", "micro-batches") +
          (t.autocast_casts.value() > 0 ? "; autocast's casts " + bounded_number(t.autocast_casts.value(), 3) + " s of it and of recompute" : ""));
  add("recompute", t.recompute, "");
  add("tensor-parallel comm", t.tp_comm,
      t.tp_copies.value() > 0 ? "exposed, incl. " + bounded_number(t.tp_copies.value(), 3) + " s of DTensor's sequence-shard copies" : "exposed");
  add("context-parallel comm", t.cp_comm, cp_comm_note(plan));
  add("expert-parallel comm", t.ep_comm, "all-to-all");
  add("pipeline p2p", t.pp_comm, "");
  add("pipeline bubble", t.bubble, "");
  add("data-parallel comm", t.dp_comm_exposed, "exposed, of " + bounded_number(t.dp_comm_total.value(), 3) + " s total");
  add("sharding copies", t.dp_copies, "the stack's gather/reduce buffer copies");
  add("host-bound wait", t.host_wait, "the GPU waits for the host: kernel launches, the stack's loops over ranks");
  add("optimizer step", t.optimizer, "");
  add("offload transfers", t.offload, "");
  add("step", t.step, "benchmark: every GPU at its own pace");
  if (t.clock.value() > 0) add("sustained clock", t.clock, "tensor-core work at the clock the GPUs hold under load (profile gpu.clocks)");
  add("wait for the slowest GPU", t.straggler, "GPUs' speed and step-time spread, largest of all GPUs");
  add("sustained step", t.sustained_step, "what a long run sees; days and cost below use it");
  return table({"time per step", "s", "share", ""}, rows, md, {false, true, true, false});
}

std::string run_lines(const Plan& plan, const Estimate& e) {
  const auto& r = e.run;
  std::ostringstream out;
  out << fmt("  Checkpoint %s, written in %s at %.0f GB/s; optimal interval %s (Young/Daly) for a job MTBF of %s.\n",
             decimal_bytes_text(r.checkpoint_bytes.value()).c_str(), duration_text(r.checkpoint_write_time.value()).c_str(),
             plan.cluster.checkpoint_write_bandwidth.in_gb_per_s(), duration_text(r.checkpoint_interval.value()).c_str(),
             duration_text(r.job_mtbf.value()).c_str());
  out << fmt("  Training %s tokens: %s of compute, %s with checkpoints and failures (goodput %.1f%%), %s GPU-hours, $%s at $%.2f per GPU-hour.\n",
             si(r.train_tokens).c_str(), duration_text(r.compute_time.value()).c_str(), duration_text(r.wall_time.value()).c_str(),
             100 * r.goodput, si(r.gpu_hours).c_str(), si(r.cost_usd).c_str(), plan.cluster.price_per_gpu_hour_usd);
  return out.str();
}

std::string why_line(const Candidate& best, const SearchResult& result) {
  const auto& e = best.estimate;
  std::string s = fmt("highest throughput of the %lld plans that fit (of %lld evaluated): %s tokens/s, MFU %.1f%%, %.1f of %.0f GiB per GPU.",
                      static_cast<long long>(result.fitting), static_cast<long long>(result.evaluated),
                      si(e.throughput.tokens_per_second).c_str(), 100 * e.throughput.mfu, gib(e.memory.required), gib(e.memory.capacity));
  if (result.ranked.size() > 1) {
    const auto& second = result.ranked[1].estimate;
    s += fmt(" The runner-up is %.1f%% slower.", 100 * (e.throughput.tokens_per_second / second.throughput.tokens_per_second - 1));
  }
  const auto& p = best.plan.parallel;
  s += fmt(" Sharding: %s.", sharding_name(p, best.plan.training.stack));
  if (e.tight) s += " Tight: no plan keeps the memory headroom, so this one may run out of memory; " + e.reasons.front() + ".";
  return s;
}

}  // namespace

std::string si(double x, int precision) {
  const char* suffix[] = {"", " K", " M", " B", " T", " P", " E"};
  int i = 0;
  double v = x;
  while (std::fabs(v) >= 1000 && i < 6) { v /= 1000; ++i; }
  if (std::fabs(v) >= 1000 || !std::isfinite(v)) return fmt("%.*g", precision, x);  // past E: scientific
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g%s", precision, v, suffix[i]);
  // "%g" switches to an exponent when rounding reaches 10^precision ("1e+03"): one unit up instead.
  if (std::strchr(buf, 'e') != nullptr && i < 6) std::snprintf(buf, sizeof buf, "%.*g%s", precision, v / 1000, suffix[i + 1]);
  return buf;
}

std::string decimal_bytes_text(double bytes) {
  const char* unit[] = {"bytes", "kB", "MB", "GB", "TB", "PB", "EB"};
  int i = 0;
  double v = bytes;
  while (std::fabs(v) >= 999.5 && i < 6) { v /= 1000; ++i; }
  if (std::fabs(v) >= 999.5 || !std::isfinite(v)) return fmt("%.3g bytes", bytes);
  return fmt("%.3g %s", v, unit[i]);
}

std::string bounded_number(double x, int decimals, std::size_t max_width) {
  const std::string fixed = fmt("%.*f", decimals, x);
  return fixed.size() <= max_width && std::isfinite(x) ? fixed : fmt("%.3g", x);
}

std::string count_text(double count, const std::string& noun, const std::string& plural_noun) {
  const std::string number = count == std::floor(count) && std::fabs(count) < 1e15 ? fmt("%.0f", count) : fmt("%.3g", count);
  return number + " " + (count == 1 ? noun : plural_noun);
}

std::string full_precision(double x) {
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, result.ptr);
}

namespace {

// Fine-tuning a Llama-style model: the executor starts from a Hugging Face checkpoint.
bool finetunes_a_checkpoint(const Plan& plan) {
  return plan.training.mode != TrainingMode::kPretrain && plan.model.architecture == Architecture::kLlama && !plan.model.moe;
}

}  // namespace

std::string executor_command(const Plan& plan, const std::string& plan_path) {
  const int gpn = plan.cluster.gpus_per_node;
  const int nodes = (plan.gpus + gpn - 1) / gpn;
  std::string s = fmt("torchrun --nnodes %d --nproc-per-node %d --no-python executor --plan %s", nodes, std::min(plan.gpus, gpn), plan_path.c_str());
  // Fine-tuning starts from the user's checkpoint (executor --init-from, a Hugging Face Llama one).
  if (finetunes_a_checkpoint(plan)) s += " --init-from HF_CHECKPOINT_DIR --export finetuned --export-format hf";
  return s;
}

std::string render_evaluation(const Candidate& c, const ReportContext& ctx, Format format) {
  const Plan& plan = c.plan;
  const Estimate& e = c.estimate;
  if (format == Format::kHtml) {
    return markdown_to_html(render_evaluation(c, ctx, Format::kMarkdown), "trainplan estimate" + (plan.name.empty() ? "" : ": " + plan.name));
  }
  if (format == Format::kJson) return estimate_to_json(plan, e).dump(2) + "\n";
  if (format == Format::kCsv) {
    std::ostringstream out;
    out << "stack,fits,tight,tp,pp,dp,cp,ep,zero_stage,micro_batch,micro_batches,recompute,schedule,virtual_stages,memory_total_bytes,memory_reserved_bytes,memory_required_bytes,capacity_bytes,step_seconds,tokens_per_second,mfu,hfu,wall_days,gpu_hours,cost_usd\n";
    const auto& p = plan.parallel;
    out << stack_name(plan.training.stack) << "," << (e.fits ? "true" : "false") << "," << (e.tight ? "true" : "false") << "," << p.tp << "," << p.pp << "," << p.dp << "," << p.cp << "," << p.ep << "," << p.zero_stage
        << "," << p.micro_batch << "," << e.micro_batches << "," << recompute_name(p.recompute) << "," << schedule_name(p.schedule) << ","
        << p.virtual_stages;
    // Machine-read: every number in full precision (a stream's default 6 digits lose bytes and seconds).
    for (double x : {e.memory.total.value(), e.memory.reserved.value(), e.memory.required.value(), e.memory.capacity.value(), e.time.step.value(),
                     e.throughput.tokens_per_second, e.throughput.mfu, e.throughput.hfu, e.run.wall_time.in_days(), e.run.gpu_hours, e.run.cost_usd}) {
      out << "," << full_precision(x);
    }
    out << "\n";
    return out.str();
  }
  const bool md = format == Format::kMarkdown;
  std::ostringstream out;
  out << (md ? "# " : "") << "trainplan estimate" << (plan.name.empty() ? "" : ": " + plan.name) << "\n\n";
  out << (md ? "- " : "") << "Model     " << model_line(plan.model) << "\n";
  out << (md ? "- " : "") << "Cluster   " << cluster_line(plan.cluster, plan.gpus, false) << "\n";
  out << (md ? "- " : "") << "Training  " << training_line(plan.training, ctx.train_tokens_note, ctx.batch_note) << "\n";
  const LayerSetting setting = layer_setting(plan);
  out << (md ? "- " : "") << "Stack     " << stack_line(plan.training, &setting) << "\n";
  out << (md ? "- " : "") << "Plan      " << plan_line(plan.parallel) << "\n\n";
  if (!e.fits || e.tight) {
    out << (e.fits ? "TIGHT:\n" : "DOES NOT FIT:\n");
    for (const auto& r : e.reasons) out << "  " << r << "\n";
    out << "\n";
  }
  out << fmt("%s tokens/s (%s per GPU), model %.0f TFLOP/s per GPU (MFU %.1f%%), hardware %.0f TFLOP/s (HFU %.1f%%)\n\n",
             si(e.throughput.tokens_per_second).c_str(), si(e.throughput.tokens_per_second_per_gpu).c_str(),
             e.throughput.model_tflops_per_gpu, 100 * e.throughput.mfu, e.throughput.hardware_tflops_per_gpu, 100 * e.throughput.hfu);
  out << (md ? "```\n" : "") << memory_table(e, plan.training, false) << "\n" << time_table(plan, e, false) << (md ? "```\n" : "") << "\n";
  out << run_lines(plan, e);
  return out.str();
}

std::string render_search(const PlanRequest& req, const SearchResult& result, const ReportContext& ctx, Format format) {
  const Candidate* best = result.ranked.empty() ? nullptr : &result.ranked.front();
  if (format == Format::kHtml) {
    return markdown_to_html(render_search(req, result, ctx, Format::kMarkdown),
                            "trainplan: " + req.model.name + " on " + std::to_string(req.gpus) + " GPUs");
  }
  if (format == Format::kJson) {
    nlohmann::json j = {
        {"schema", "trainplan/search/v1"},
        {"model", model_to_json(req.model)},
        {"cluster", req.cluster.name},
        {"default_cluster", ctx.default_cluster},
        {"gpus", req.gpus},
        {"training", training_to_json(req.training)},
        {"evaluated", result.evaluated},
        {"fitting", result.fitting},
        {"search_seconds", result.seconds},
        {"recommended", best ? estimate_to_json(best->plan, best->estimate) : nlohmann::json(nullptr)},
    };
    // A ranked plan's estimate, and with distinct layouts its layout's other variants (micro-batch,
    // virtual stages, schedule), best first.
    const auto ranked_entry = [&](std::size_t i) {
      const auto& c = result.ranked[i];
      nlohmann::json entry = estimate_to_json(c.plan, c.estimate);
      if (i < result.variants.size() && result.variants[i].count > 0) {
        entry["layout"] = layout_text(c.plan.parallel);
        entry["variants_fitting"] = result.variants[i].count;
        entry["variants"] = nlohmann::json::array();
        for (const auto& v : result.variants[i].best) {
          entry["variants"].push_back({{"parallel", parallel_to_json(v.plan.parallel)}, {"step_seconds", v.estimate.time.step.value()},
                                       {"tokens_per_second", v.estimate.throughput.tokens_per_second},
                                       {"memory_required_bytes", v.estimate.memory.required.value()}, {"tight", v.estimate.tight}});
        }
      }
      return entry;
    };
    j["distinct_layouts"] = std::any_of(result.variants.begin(), result.variants.end(), [](const FoldedVariants& v) { return v.count > 0; });
    if (best) j["recommended"] = ranked_entry(0);
    j["ranked"] = nlohmann::json::array();
    for (std::size_t i = 0; i < result.ranked.size(); ++i) j["ranked"].push_back(ranked_entry(i));
    j["alternatives"] = nlohmann::json::array();
    for (const auto& a : result.alternatives) {
      j["alternatives"].push_back({{"shape", a.shape}, {"fits", a.candidate.estimate.fits}, {"tight", a.candidate.estimate.tight}, {"reason", a.reason},
                                   {"parallel", parallel_to_json(a.candidate.plan.parallel)}});
    }
    if (best) j["executor_command"] = executor_command(best->plan, ctx.plan_path.empty() ? "plan.json" : ctx.plan_path);
    return j.dump(2) + "\n";
  }
  if (format == Format::kCsv) {
    std::ostringstream out;
    out << "rank,stack,tight,tp,pp,dp,cp,ep,zero_stage,shard_group,micro_batch,micro_batches,recompute,schedule,virtual_stages,memory_total_bytes,memory_reserved_bytes,memory_required_bytes,capacity_bytes,step_seconds,tokens_per_second,tokens_per_second_per_gpu,mfu,hfu,wall_days,gpu_hours,cost_usd,variants_fitting\n";
    int rank = 1;
    for (const auto& c : result.ranked) {
      const std::int64_t variants = variant_count(result, static_cast<std::size_t>(rank - 1));
      const auto& p = c.plan.parallel;
      const auto& e = c.estimate;
      out << rank++ << "," << stack_name(c.plan.training.stack) << "," << (e.tight ? "true" : "false") << "," << p.tp << "," << p.pp << "," << p.dp << "," << p.cp << "," << p.ep << "," << p.zero_stage << "," << p.shard_group
          << "," << p.micro_batch << "," << e.micro_batches << "," << recompute_name(p.recompute) << "," << schedule_name(p.schedule) << ","
          << p.virtual_stages;
      for (double x : {e.memory.total.value(), e.memory.reserved.value(), e.memory.required.value(), e.memory.capacity.value(), e.time.step.value(),
                       e.throughput.tokens_per_second, e.throughput.tokens_per_second_per_gpu, e.throughput.mfu, e.throughput.hfu,
                       e.run.wall_time.in_days(), e.run.gpu_hours, e.run.cost_usd}) {
        out << "," << full_precision(x);
      }
      out << "," << variants << "\n";
    }
    return out.str();
  }

  const bool md = format == Format::kMarkdown;
  std::ostringstream out;
  const std::string h1 = md ? "# " : "", h2 = md ? "## " : "", li = md ? "- " : "";
  out << h1 << "trainplan: " << req.model.name << " on " << req.gpus << " GPUs\n\n";
  out << li << "Model     " << model_line(req.model) << "\n";
  out << li << "Cluster   " << cluster_line(req.cluster, req.gpus, ctx.default_cluster) << "\n";
  out << li << "Training  " << training_line(req.training, ctx.train_tokens_note, ctx.batch_note) << "\n";
  out << li << "Stack     " << stack_line(req.training) << "\n";
  out << li << fmt("Searched  %s plans in %.3f s (%s plans/s); %s fit in memory", si(static_cast<double>(result.evaluated)).c_str(),
                   result.seconds, si(result.evaluated / std::max(result.seconds, 1e-9)).c_str(), si(static_cast<double>(result.fitting)).c_str());
  out << (result.offload_considered ? "; nothing fit without optimizer offload, so CPU offload was searched too" : "") << "\n\n";

  if (!best) {
    out << h2 << "No plan fits.\n\n";
    out << "The closest shapes, and what they need:\n";
    int shown = 0;
    for (const auto& a : result.alternatives) {
      if (shown++ >= 8) break;
      out << "  " << a.shape << ": " << a.reason << "\n";
    }
    out << "\nTry more GPUs, a larger-memory cluster (--cluster dgx-h200), a shorter --seq-len, or --mode lora.\n";
    return out.str();
  }

  out << h2 << "Recommended: " << plan_line(best->plan.parallel) << "\n";
  out << "  Why: " << why_line(*best, result) << "\n\n";

  out << h2 << "Top plans\n" << (md ? "\n" : "");
  std::vector<Row> rows;
  bool folded = false;
  for (std::size_t i = 0; i < result.ranked.size(); ++i) {
    const std::int64_t variants = variant_count(result, i);
    folded = folded || variants > 0;
    rows.push_back(ranked_row(std::to_string(i + 1), result.ranked[i], variants));
  }
  std::vector<std::string> header = kRankedHeader;
  std::vector<bool> right = kRankedRight;
  if (!folded) {  // every variant ranked on its own (--all-variants): no column to fill
    header.pop_back();
    right.pop_back();
    for (Row& r : rows) r.cells.pop_back();
  }
  out << table(header, rows, md, right) << "\n";
  out << wrap_text(fmt("%sGA = micro-batches per step (gradient accumulation); ZeRO 3/hN = hybrid shard over N; GiB/GPU = memory required (allocator reserve + CUDA "
             "context), \"tight\" = within the %.0f%% memory headroom (--memory-headroom), ranked after plans with room; days and GPU-hours include "
             "checkpoints and failures.\n",
             folded ? "Each row is a distinct layout (tp, pp, dp, cp, ep, ZeRO, recompute) at its best variant; +variants = its other fitting "
                      "variants (micro-batch, virtual stages, schedule), folded (--all-variants lists every variant, --format json has the best of them); "
                    : "",
             100 * ctx.memory_headroom), md ? 0 : 100, "  ");

  out << h2 << "Where the memory and time go (recommended plan)\n\n" << (md ? "```\n" : "");
  out << memory_table(best->estimate, best->plan.training, false) << "\n" << time_table(best->plan, best->estimate, false) << (md ? "```\n" : "") << "\n";

  if (!result.alternatives.empty()) {
    out << h2 << "Alternatives that lose\n\n";
    int shown = 0;
    for (const auto& a : result.alternatives) {
      if (shown++ >= 8) break;
      out << li << "  " << a.shape << ": " << a.reason << "\n";
    }
    out << "\n";
  }

  out << h2 << "Run\n\n" << run_lines(best->plan, best->estimate) << "\n";
  out << h2 << "Run it\n\n";
  const std::string path = ctx.plan_path.empty() ? "plan.json" : ctx.plan_path;
  if (ctx.plan_path.empty()) out << "  " << ctx.command << " --save-plan plan.json\n";
  else out << "  (plan saved to " << ctx.plan_path << ")\n";
  out << "  " << executor_command(best->plan, path) << "\n";
  if (finetunes_a_checkpoint(best->plan)) {
    out << "  (HF_CHECKPOINT_DIR: the Hugging Face checkpoint to fine-tune, config.json and *.safetensors;\n"
        << "   finetuned/ receives the result in the same layout" << (best->plan.training.mode == TrainingMode::kFull ? "" : ", adapters merged") << ")\n";
  }
  const std::vector<std::string> limitations = executor_limitations(best->plan);
  if (!limitations.empty()) out << "  note: the executor cannot run this plan yet:\n";
  for (const std::string& why : limitations) out << "    - " << why << "\n";
  const int gpus = best->plan.gpus, per_node = best->plan.cluster.gpus_per_node;
  if (gpus % per_node == 0 || gpus < per_node) {
    out << "  planner launch " << path << " --nodes " << std::max(1, gpus / per_node)
        << (gpus < per_node ? " --gpus-per-node " + std::to_string(gpus) : "") << " --slurm   # as a SLURM batch script\n";
  }
  out << "  planner evaluate " << path << "        # the full breakdown of this plan\n";
  return out.str();
}

}  // namespace trainplan::planner
