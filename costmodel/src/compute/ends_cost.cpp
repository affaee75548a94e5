// The first and last pipeline stages' own work: the embedding, the final norm, the output layer
// and the loss, per stack (compute.hpp ends_cost).

#include <algorithm>
#include <cmath>

#include "compute_pass.hpp"
#include "trainplan/costmodel/compute.hpp"

namespace trainplan::costmodel {

using namespace compute_detail;

EndsCost ends_cost(const ModelSpec& mdl, const HardwareProfile& hw, const LayerSetting& s) {
  const StackSpec& stack = stack_spec(s.stack);
  const Dtype act_dtype = activation_dtype(s.precision);
  const KernelRates rates(hw.gpu, act_dtype);
  const double e = dtype_bytes(act_dtype);
  const double t = s.tp;
  const double T = s.micro_batch * s.seq_len / s.cp;
  const double Tn = s.sequence_parallel ? T / t : T;
  const double h = static_cast<double>(mdl.hidden);
  const double pad = stack.vocab_pad_multiple * t;
  const double vocab = std::ceil(static_cast<double>(mdl.vocab) / pad) * pad;
  const double v_local = vocab / t;
  const double logits = T * v_local;  // elements of this rank's logits
  const bool frozen = s.mode == TrainingMode::kLora || s.mode == TrainingMode::kQlora;
  const ModelFeatures feat = mdl.features();

  EndsCost c;
  c.padded_vocab = vocab;
  // The vocab-parallel embedding sums its partial lookups across the TP group: an all-reduce, or
  // under sequence parallelism a reduce-scatter, whose backward is nothing (the all-reduce's
  // conjugate is the identity) or an all-gather. The output layer (column-parallel) takes its
  // input whole: without sequence parallelism the identity forward and an all-reduce of its
  // input's gradient backward; under it the final norm's output all-gathered and that gradient
  // reduce-scattered (Megatron-Core's VocabParallelEmbedding and ColumnParallelLinear,
  // mappings.py; torchtitan's RowwiseParallel embedding and ColwiseParallel output with
  // input_layouts=Shard(1)). DTensor's stacks copy around these as around a layer's
  // (StackSpec::sequence_parallel_rearranges): the embedding's reduce-scatter input forward and its
  // backward all-gather's output, the output layer's all-gather output forward and its
  // reduce-scatter input backward (a gathered output is a view at one sequence).
  double tp_reduce = 0, embedding_tp_backward = 0, head_gather = 0, head_scatter = 0;
  // Learned positions added to the whole sequence before its split (StackSpec::embedding_all_reduces_before_positions).
  const bool split_after_positions = s.tp > 1 && s.sequence_parallel && feat.learned_positions && stack.embedding_all_reduces_before_positions;
  if (s.tp > 1) {
    const Bytes block(T * h * e);
    if (s.sequence_parallel) {
      head_scatter = collective_time(hw, Collective::kReduceScatter, block, s.tp_group).value();
      tp_reduce = split_after_positions ? collective_time(hw, Collective::kAllReduce, block, s.tp_group).value() + rates.stream(2.0 * Tn * h * e)
                                        : head_scatter;
      head_gather = collective_time(hw, Collective::kAllGather, block, s.tp_group).value();
      embedding_tp_backward = head_gather;
      if (stack.sequence_parallel_rearranges) {
        const double copy = rates.stream(2.0 * T * h * e);
        const double gathered_copy = s.micro_batch > 1 ? copy : 0.0;
        tp_reduce += copy;
        embedding_tp_backward += gathered_copy;
        head_gather += gathered_copy;
        head_scatter += copy;
      }
    } else {
      tp_reduce = collective_time(hw, Collective::kAllReduce, block, s.tp_group).value();
      head_scatter = tp_reduce;
    }
  }
  // Under torch.autocast (LayerSetting::autocast) the table, its output (the residual stream) and
  // its gradient are float32: the embedding is no autocast op.
  const double es = s.autocast ? 4.0 : e;
  Pass emb{rates, rates, stack, e, e};  // the ends' GEMMs stay in the activation dtype
  emb.elementwise(ElementwiseOp::kEmbedding, T * h, 2 * es, 0, !frozen, es);
  // The executor's fused path scatters the rows' gradients straight into the fp32 gradient
  // (fused_ops.cpp EmbeddingIntoFn: the gradient widened to fp32, then a sorted accumulating
  // index_put_ reading and writing the rows): no table-sized gradient, no sum with the output
  // layer's (the loss adds that one into the same fp32 table).
  const bool embedding_in_gemm = gradients_in_gemm(stack, s);
  if (embedding_in_gemm) {
    c.fused_embedding_params = v_local * h;
    emb.backward += rates.stream((e + 4.0 + 4.0 + 8.0) * T * h, 4);
    emb.kernels += 4;
  } else if (stack.fused_elementwise && !frozen) {  // zero-fill of the table's gradient, then the scatter-add
    emb.backward += rates.stream(v_local * h * es) + rates.stream(2.0 * es * T * h);
    emb.kernels += 2;
  }
  if (feat.learned_positions) emb.elementwise(ElementwiseOp::kResidualAdd, (split_after_positions ? T : Tn) * h, 3 * e, 0, false);  // learned positions
  if (mdl.tied_embeddings && !frozen && !embedding_in_gemm) {  // the output layer's and the embedding's gradients summed
    emb.backward += rates.stream(3.0 * v_local * h * es);
    emb.kernels += 1;
  }
  c.embedding_forward = emb.forward + tp_reduce;
  c.embedding_backward = emb.backward + (frozen ? 0.0 : embedding_tp_backward);
  // The embedding's output is the first layer's input, kept there; only a dropout mask is its own.
  c.embedding_activation_bytes = s.dropout ? Tn * h : 0.0;
  // An explicit attention mask is built once per micro-batch in the activation dtype, [batch, 1,
  // seq, seq] (transformers 4.51.3 modeling_llama.py _prepare_4d_causal_attention_mask_with_cache_position:
  // torch.full((seq, seq), min_dtype, dtype=dtype)), and every layer's attention keeps it for its
  // backward; it lives from the first layer's forward to the last one's backward.
  if (s.attention_mask == AttentionMask::kExplicit) c.embedding_activation_bytes += s.micro_batch * (s.seq_len / s.cp) * mdl.attended_keys(s.seq_len) * e;

  Pass p{rates, rates, stack, e, e};
  p.autocast = s.autocast;  // the output layer's weight cast (Pass::autocast)
  // torchtitan compiles its blocks and the loss (apply_compile, components/loss.py), not the final
  // norm and the output layer: their autocast casts are eager.
  p.casts_eager = s.stack == Stack::kFsdp2Compile;
  const NormWidths nw = norm_widths(feat, stack, e, es);
  p.elementwise(norm_op(feat, stack), Tn * h, es + e, e + 2 * es, true, nw.forward, nw.backward);  // final norm
  // Under TP the executor's chunked loss gives way to its vocab-parallel fp32 cross-entropy.
  // The plan's loss kernel, else the stack's. Under TP the chunked loss (the executor's, Liger's:
  // whole-vocabulary rows) gives way to the vocab-parallel fp32 cross-entropy.
  const LossKernel chosen = s.loss.value_or(stack.loss);
  const LossKernel loss = chosen == LossKernel::kChunkedFused && s.tp > 1 ? LossKernel::kFp32Copy : chosen;
  if (loss != LossKernel::kChunkedFused) {
    p.linear_unquantised(T, v_local, h, frozen);  // output projection (vocab-parallel), never fp8
    p.autocast_inputs(1.0, T * h);                // eager autocast: its input cast from the fp32 norm
  }
  double loss_saved = 0;
  switch (loss) {
    case LossKernel::kFp32Copy:
      // logits.float(), log_softmax and nll_loss (the eager op's measured rate includes the cast);
      // kept: the fp32 log-softmax; backward: its gradient, the logits' fp32 gradient, the cast.
      p.forward += rates.op(ElementwiseOp::kCrossEntropyFp32, logits, false, e);
      p.backward += rates.op(ElementwiseOp::kCrossEntropyFp32, logits, true, e);
      p.kernels += 6;
      loss_saved = 4.0 * logits;
      c.head_backward_transient_bytes = 8.0 * logits;
      c.largest_head_block_bytes = 4.0 * logits;
      if (e < 4.0) {  // 16-bit logits, their fp32 copy; the 16-bit block is idle at the backward's peak
        c.head_forward_transient_bytes = (e + 4.0) * logits;
        c.head_idle_bytes = e * logits;
      } else {  // fp32 training: .float() is the logits themselves
        c.head_forward_transient_bytes = 4.0 * logits;
      }
      break;
    case LossKernel::kFused:
      // Online-softmax kernels over the 16-bit logits: two reads forward, read and write backward.
      p.forward += rates.stream(2.0 * e * logits, 2);
      p.backward += rates.stream(2.0 * e * logits, 1);
      p.kernels += 3;
      loss_saved = e * logits + 4.0 * T;  // the logits and the log-sum-exp
      c.head_backward_transient_bytes = e * logits;
      c.largest_head_block_bytes = e * logits;
      break;
    case LossKernel::kChunkedFused: {
      // executor/src/model/fused_ops.cpp LinearCrossEntropyFn: chunks of rows sized to 1 GiB of logits
      // in the compute dtype (cross_entropy_chunk_tokens), a multiple of 64. Per chunk, all in
      // the forward: the logits GEMM, one kernel reading the logits twice (online softmax) and
      // overwriting them with their 16-bit gradient, the
      // input-gradient GEMM and the weight-gradient GEMM accumulating (cuBLAS beta = 1: 8 more
      // bytes per element per chunk) into an fp32 [vocab x h] sum: under ZeRO-0/1 the weight's
      // own fp32 gradient (engine.cpp output_weight_grad_sum: no buffer, no scaling, cast or
      // accumulation pass), else a buffer of the loss's own.
      const double bytes_per_logit = e;
      const double rows = std::floor(1024.0 * kMiB / (v_local * bytes_per_logit) / 64.0) * 64.0;
      const double chunk = std::min(T, std::max(64.0, rows));
      // fp16 has no CUDA kernel: its logits go through float32 blocks of up to 256 MiB
      // (fused_ops.cpp cross_entropy_row_block).
      const double fp32_block = s.precision == Precision::kFp16 ? 4.0 * v_local * std::min(chunk, std::max(16.0, std::floor(256.0 * kMiB / (4.0 * v_local)))) : 0.0;
      const double full = std::floor(T / chunk);
      const double rest = T - full * chunk;
      const bool into_gradient = !frozen && !s.sharded_gradients;
      const auto run_chunk = [&](double tokens, double count) {
        if (tokens <= 0 || count <= 0) return;
        Pass q{rates, rates, stack, e, e};
        q.linear_unquantised(tokens, v_local, h, frozen);  // logits, then (in this forward) dX and dW
        q.forward += q.backward + rates.stream(3.0 * e * tokens * v_local, 3);  // + the loss sum and its add
        if (!frozen) q.forward += rates.stream(8.0 * v_local * h);  // the fp32 sum read and written
        p.forward += count * q.forward;
        p.kernels += count * (q.kernels + 3);
      };
      run_chunk(chunk, full);
      run_chunk(rest, 1.0);
      // Backward: the input's gradient scaled by the loss multiplier in place; without the fused
      // accumulation also the weight's, scaled and cast to its dtype in one pass.
      p.backward += rates.stream(2.0 * e * T * h, 1);
      p.kernels += 1;
      if (!frozen && !into_gradient) {
        p.backward += rates.stream((4.0 + e) * v_local * h, 1);
        p.kernels += 1;
      }
      // The output weight: its own, or the last stage's copy of a tied table (pp > 1), or the table
      // itself on one stage (estimate.cpp counts that one once, with the embedding's).
      if (into_gradient) c.fused_accumulation_params = v_local * h;
      // Kept to the backward: the input's gradient, and the fp32 weight gradient when it is the
      // loss's own buffer (the output layer's input, counted below, is alive only in the forward).
      // One chunk of logits at a time; at the backward's peak the weight gradient's cast.
      const bool own_buffer = !frozen && !into_gradient;
      loss_saved = e * T * h + (own_buffer ? 4.0 * v_local * h : 0.0);
      c.head_forward_transient_bytes = bytes_per_logit * chunk * v_local + fp32_block;
      c.head_backward_transient_bytes = own_buffer && e < 4.0 ? e * v_local * h : 0.0;
      c.largest_head_block_bytes = std::max({bytes_per_logit * chunk * v_local, fp32_block, own_buffer ? 4.0 * v_local * h : 0.0});
      break;
    }
    case LossKernel::kMegatronFp32:
      // .float() (e + 4), max (4), subtract and exp in place (8), sum (4); backward: softmax minus
      // one-hot in place (8) and the cast back (4 + e).
      p.forward += rates.stream((e + 20.0) * logits, 5);
      p.backward += rates.stream((12.0 + e) * logits, 2);
      p.kernels += 7;
      loss_saved = 4.0 * logits;
      c.head_forward_transient_bytes = e * logits;
      c.head_backward_transient_bytes = e * logits;
      c.largest_head_block_bytes = 4.0 * logits;
      break;
  }
  if (s.tp > 1) {  // max, sum and target logit all-reduced over the vocab-parallel group
    p.forward += 3.0 * collective_time(hw, Collective::kAllReduce, Bytes(4.0 * T), s.tp_group).value();
  }
  p.forward += head_gather;    // the final norm's output gathered for the output layer (sequence parallel)
  p.backward += head_scatter;  // its gradient reduced back (scattered to the sequence shards)
  c.head_forward = p.forward;
  c.head_backward = p.backward;
  c.head_autocast_casts = p.autocast_seconds;
  c.kernels = emb.kernels + p.kernels;
  c.head_model_flops = (frozen ? 4.0 : 6.0) * static_cast<double>(mdl.vocab) / t * h * T;
  // The final norm's input (LlamaRMSNorm: its float32 copy and the normalised tensor, stack.hpp) and
  // the output layer's input: bf16 in every precision.
  c.head_activation_bytes = Tn * h * norm_saved_bytes(feat, stack, es) + T * h * e + loss_saved;
  // Under autocast the output layer's GEMM keeps its weight's bf16 copy for the input gradient.
  if (s.autocast && loss != LossKernel::kChunkedFused) c.head_activation_bytes += 2.0 * v_local * h;
  return c;
}

}  // namespace trainplan::costmodel
