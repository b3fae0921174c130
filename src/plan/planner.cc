#include "plan/planner.h"

#include <algorithm>
#include <cmath>

#include "bench/cost.h"
#include "core/error.h"

namespace kiln::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// CUDA/ROCm context, NCCL/RCCL channel buffers, cuBLAS/CUTLASS workspaces: what a serving process
// holds before it allocates weights, activations or KV.
constexpr double kRuntimeReserveBytes = 2.0 * kGiB;
// Live bf16 buffers of hidden width per token during a prefill chunk (residual, normed input,
// attention output, q/kv latents, MLP input/output, all-reduce staging).
constexpr double kHiddenBuffers = 8.0;

struct Link {
  double bytes_s;
  double latency_s;
};

// A group of `n` GPUs talks over NVLink/Infinity Fabric while it fits in a node, else over the NICs.
Link link_for(const GpuSpec& g, const Layout& l, const PlanOptions& o, int64_t n) {
  if (n <= l.gpus_per_node) return {g.link_bytes_s, g.collective_latency_s};
  return {std::min(g.link_bytes_s, o.inter_node_bytes_s), std::max(g.collective_latency_s, o.inter_node_latency_s)};
}

// Ring all-reduce of `bytes` over `n` ranks: each rank sends and receives 2(n-1)/n of the buffer.
double all_reduce_s(double bytes, int64_t n, Link link) {
  if (n <= 1) return 0.0;
  const double nn = static_cast<double>(n);
  return link.latency_s + 2.0 * (nn - 1.0) / nn * bytes / link.bytes_s;
}

// Rate for matmuls whose weights are stored in `f`: FP8 weights run FP8 GEMMs, int4 (W4A16)
// dequantises to bf16, MXFP4 runs the FP4 units where the GPU has them.
double dense_rate(const GpuSpec& g, WeightFormat f) {
  return f == WeightFormat::Fp8 && g.fp8_flops > 0 ? g.fp8_flops : g.bf16_flops;
}
double expert_rate(const GpuSpec& g, WeightFormat f) {
  if (f == WeightFormat::Mxfp4Experts && g.fp4_flops > 0) return g.fp4_flops;
  return dense_rate(g, f);
}

}  // namespace

double expected_distinct_experts(int64_t num_experts, int64_t top_k, double tokens) {
  if (num_experts <= 0 || top_k <= 0 || tokens <= 0) return 0.0;
  const double e = static_cast<double>(num_experts);
  // A given expert is missed by one token with probability 1 - k/E, by B independent tokens with
  // (1 - k/E)^B; summing the hit probability over experts gives the expectation.
  return e * (1.0 - std::pow(1.0 - static_cast<double>(top_k) / e, tokens));
}

double reserve_estimate(const ModelConfig& c, int64_t prefill_chunk) {
  const double h = static_cast<double>(c.hidden_size);
  const double k = static_cast<double>(c.n_routed_experts > 0 ? c.num_experts_per_tok : 0);
  // MoE dispatch holds k copies of each token's input and the gate/up/down intermediates; a dense
  // layer holds gate/up/down of its own MLP. The larger of the two is live at a time.
  const double ffn = std::max(k * (h + 3.0 * static_cast<double>(c.moe_intermediate_size)),
                              3.0 * static_cast<double>(c.intermediate_size));
  return kRuntimeReserveBytes + static_cast<double>(prefill_chunk) * 2.0 * (kHiddenBuffers * h + ffn);
}

Layout resolve_layout(const ModelConfig& c, Layout l) {
  KILN_CHECK(l.gpus_per_node > 0, "--gpus must be positive, got {}", l.gpus_per_node);
  KILN_CHECK(l.nodes > 0, "--nodes must be positive, got {}", l.nodes);
  const int64_t world = l.world();
  KILN_CHECK(l.attn_dp > 0 && world % l.attn_dp == 0, "--attn-dp {} must divide the {} GPUs", l.attn_dp, world);
  if (l.tp == 0) l.tp = world / l.attn_dp;
  KILN_CHECK(l.tp > 0 && l.tp * l.attn_dp == world, "--tp {} x --attn-dp {} must equal the {} GPUs (--gpus x --nodes)",
             l.tp, l.attn_dp, world);
  KILN_CHECK(c.num_attention_heads % l.tp == 0, "--tp {}: the model's {} attention heads do not split evenly", l.tp,
             c.num_attention_heads);
  KILN_CHECK(l.dcp > 0 && l.tp % l.dcp == 0, "--dcp {} must divide the attention TP size {}", l.dcp, l.tp);
  if (l.ep == 0) l.ep = world;
  KILN_CHECK(l.ep > 0 && world % l.ep == 0, "--ep {} must divide the {} GPUs", l.ep, world);
  if (c.n_routed_experts > 0) {
    KILN_CHECK(c.n_routed_experts % l.ep == 0, "--ep {}: the model's {} routed experts do not split evenly", l.ep,
               c.n_routed_experts);
    const int64_t expert_tp = world / l.ep;
    KILN_CHECK(c.moe_intermediate_size % expert_tp == 0,
               "--ep {}: each expert would split {} ways, which does not divide moe_intermediate_size {}", l.ep,
               expert_tp, c.moe_intermediate_size);
  }
  return l;
}

StepCost step_cost(const ModelConfig& c, const GpuSpec& g, const Layout& l, const WeightTotals& w, const PlanOptions& o,
                   double tokens, double context, bool decode, double logit_rows) {
  StepCost s;
  s.tokens = tokens;
  const int64_t world = l.world();
  const double dworld = static_cast<double>(world);
  // In decode the step waits for the busiest attention-DP group, which holds ceil(B / attn_dp)
  // sequences; a prefill step packs a full chunk into every group.
  const double group_tokens =
      decode ? std::ceil(tokens / static_cast<double>(l.attn_dp)) : tokens / static_cast<double>(l.attn_dp);
  const double layers = static_cast<double>(c.num_hidden_layers);
  const double heads_per_rank = static_cast<double>(c.num_attention_heads / l.tp);
  const double kv_row_bytes =  // one layer's row (fp8: the scaled e4m3 c_kv and bf16 k_pe of core/kv_fp8.h)
      static_cast<double>(kv_bytes_per_token(c, o.kv_bytes_per_value)) / static_cast<double>(c.num_hidden_layers);
  const double dcp = static_cast<double>(l.dcp);
  const double k = static_cast<double>(c.num_experts_per_tok);

  // Bytes: weights every step reads, the distinct experts the batch touches (spread over all GPUs),
  // and the cache: decode reads each sequence's whole context, prefill writes the chunk's rows.
  s.distinct_experts = expected_distinct_experts(c.n_routed_experts, c.num_experts_per_tok, tokens);
  const double kv_bytes =
      decode ? group_tokens * context * layers * kv_row_bytes / dcp : 2.0 * group_tokens * layers * kv_row_bytes / dcp;
  s.bytes = w.static_read_bytes_per_gpu + s.distinct_experts * w.expert_bytes_all_layers / dworld + kv_bytes;

  // FLOPs, each part at its own tensor rate.
  const double group_flops =
      2.0 * group_tokens * w.group_matmul_params_per_gpu +
      2.0 * (decode ? group_tokens : logit_rows / static_cast<double>(l.attn_dp)) * w.logits_params_per_gpu;
  const double expert_flops = c.n_routed_experts > 0 ? 2.0 * tokens * k * w.expert_params_all_layers / dworld : 0.0;
  // Attention core. Decode (absorbed MLA): q.k over the 576-wide latent row and p.v over the
  // 512-wide c_kv, per head, for the context this rank holds. Prefill (expanded): q.k over
  // qk_head_dim and p.v over v_head_dim per head, context = the average causal span.
  const double per_ctx = decode ? static_cast<double>(c.kv_row_dim() + c.kv_lora_rank)
                                : static_cast<double>(c.qk_head_dim() + c.v_head_dim);
  const double attn_flops = 2.0 * group_tokens * heads_per_rank * (decode ? context / dcp : context) * per_ctx * layers;
  s.flops = group_flops + expert_flops + attn_flops;
  s.compute_s =
      group_flops / dense_rate(g, o.weights) + expert_flops / expert_rate(g, o.weights) + attn_flops / g.bf16_flops;
  s.mem_s = s.bytes / g.hbm_bw_bytes_s;

  // Communication per layer: the attention output all-reduce over the TP group; after the FFN an
  // all-reduce (dense layers, or MoE when every GPU sees every token) or an all-to-all dispatch +
  // combine (MoE under attention DP, each token to k experts); the DCP merge of partial outputs.
  const double act_bytes = group_tokens * static_cast<double>(c.hidden_size) * 2.0;
  const Link tp_link = link_for(g, l, o, l.tp);
  const Link world_link = link_for(g, l, o, world);
  double comm = 0;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    comm += all_reduce_s(act_bytes, l.tp, tp_link);
    if (!c.is_moe_layer(layer)) {
      comm += all_reduce_s(act_bytes, l.tp, tp_link);
    } else if (l.attn_dp == 1) {
      comm += all_reduce_s(act_bytes, world, world_link);
    } else if (world > 1) {
      const double sent =
          2.0 * (tokens / dworld) * k * static_cast<double>(c.hidden_size) * 2.0 * (dworld - 1.0) / dworld;
      comm += 2.0 * world_link.latency_s + sent / world_link.bytes_s;
    }
    if (decode && l.dcp > 1) {
      // Each rank's partial output (kv_lora wide, fp32) and log-sum-exp per head, gathered over DCP.
      const double part = group_tokens * heads_per_rank * static_cast<double>(c.kv_lora_rank + 1) * 4.0;
      comm += tp_link.latency_s + part * (dcp - 1.0) / tp_link.bytes_s;
    }
  }
  s.comm_s = comm;
  s.bound = s.mem_s >= s.compute_s ? "memory" : "compute";
  s.time_s = std::max(s.mem_s, s.compute_s) + s.comm_s;
  return s;
}

Plan make_plan(const std::string& model_name, const ModelConfig& c, const GpuSpec& gpu, const Layout& layout,
               const Workload& workload, const PlanOptions& o) {
  KILN_CHECK(o.kv_bytes_per_value == 1 || o.kv_bytes_per_value == 2, "--kv: 1 (fp8) or 2 (bf16) bytes per value");
  KILN_CHECK(workload.input_len > 0 && workload.output_len > 0, "--input-len and --output-len must be positive");
  KILN_CHECK(workload.concurrency >= 0 && workload.context >= 0 && workload.kv_pool_tokens >= 0,
             "--concurrency, --context and --kv-pool must not be negative");
  // Caps far past any deployment, so that the sums and products below stay inside int64 (a plan
  // with --input-len 2^63 - 1 once came out negative and "FITS").
  constexpr int64_t kMaxLen = int64_t{1} << 32, kMaxConcurrency = int64_t{1} << 24;
  KILN_CHECK(workload.input_len <= kMaxLen && workload.output_len <= kMaxLen && workload.context <= 2 * kMaxLen,
             "--input-len, --output-len (at most {}) and --context (at most {}) are past what a plan covers", kMaxLen,
             2 * kMaxLen);
  KILN_CHECK(workload.concurrency <= kMaxConcurrency && workload.kv_pool_tokens <= kMaxConcurrency * 2 * kMaxLen,
             "--concurrency (at most {}) or --kv-pool is past what a plan covers", kMaxConcurrency);
  KILN_CHECK(workload.context == 0 || workload.context >= workload.input_len + workload.output_len,
             "--context {} cannot hold one request of --input-len {} + --output-len {} tokens", workload.context,
             workload.input_len, workload.output_len);
  KILN_CHECK(layout.gpus_per_node > 0 && layout.gpus_per_node <= 4096 && layout.nodes > 0 && layout.nodes <= 65536,
             "--gpus (1 to 4096 per node) and --nodes (1 to 65536) must be in range, got {} and {}",
             layout.gpus_per_node, layout.nodes);
  KILN_CHECK(std::isfinite(o.usd_per_gpu_hour) && std::isfinite(o.reserve_bytes) && o.reserve_bytes < 1e18,
             "a GPU price ({}) and a memory reserve ({} bytes) must be finite numbers", o.usd_per_gpu_hour,
             o.reserve_bytes);
  KILN_CHECK(o.prefill_chunk > 0, "--prefill-chunk must be positive");
  Plan p;
  p.model = model_name;
  p.gpu = gpu.name;
  p.layout = resolve_layout(c, layout);
  const Layout& l = p.layout;
  const int64_t world = l.world();
  p.weights = o.weights;
  p.kv_bytes_per_value = o.kv_bytes_per_value;
  p.layers = c.num_hidden_layers;
  p.kv_row_values = c.kv_row_dim();
  p.w = weight_totals(c, o.weights, l.tp, world, o.include_mtp);
  p.bits_per_param = 8.0 * static_cast<double>(p.w.bytes) / static_cast<double>(p.w.params);

  // Memory per GPU.
  p.usable_bytes_per_gpu = static_cast<double>(gpu.hbm_visible_bytes);
  p.reserve_bytes_per_gpu = o.reserve_bytes >= 0 ? o.reserve_bytes : reserve_estimate(c, o.prefill_chunk);
  p.kv_bytes_per_token = kv_bytes_per_token(c, o.kv_bytes_per_value);
  p.kv_bytes_per_token_per_gpu = static_cast<double>(p.kv_bytes_per_token) / static_cast<double>(l.dcp);
  p.kv_pool_bytes_per_gpu =
      p.usable_bytes_per_gpu - p.w.bytes_per_gpu - p.w.loaded_extra_bytes_per_gpu - p.reserve_bytes_per_gpu;
  // A GPU stores whole latent rows; a token's row lives on one DCP rank of its TP group (replicated
  // over the other tp/dcp ranks), and each attention-DP group holds its own sequences.
  const double rows_per_gpu =
      std::max(0.0, std::floor(p.kv_pool_bytes_per_gpu / static_cast<double>(p.kv_bytes_per_token)));
  p.kv_capacity_tokens = static_cast<int64_t>(rows_per_gpu) * l.dcp * l.attn_dp;

  Workload wl = workload;
  if (wl.context == 0) wl.context = wl.input_len + wl.output_len;
  // A sequence stays in one attention-DP group, so each group must hold whole sequences.
  p.max_sequences = static_cast<int64_t>(rows_per_gpu) * l.dcp / wl.context * l.attn_dp;
  const bool auto_concurrency = wl.concurrency == 0;
  if (auto_concurrency) wl.concurrency = std::clamp<int64_t>(p.max_sequences, 1, kMaxAutoConcurrency);
  // The requirement: an explicit pool (many sequences, spread evenly over the attention-DP groups),
  // or `concurrency` sequences of `context` tokens (one when concurrency is automatic), each whole
  // in one group; within a group DCP spreads a sequence's tokens over dcp ranks.
  double tokens_per_group = 0;
  if (wl.kv_pool_tokens > 0) {
    p.required_kv_tokens = wl.kv_pool_tokens;
    tokens_per_group = std::ceil(static_cast<double>(wl.kv_pool_tokens) / static_cast<double>(l.attn_dp));
  } else {
    const int64_t seqs = auto_concurrency ? 1 : wl.concurrency;
    p.required_kv_tokens = seqs * wl.context;
    tokens_per_group =
        std::ceil(static_cast<double>(seqs) / static_cast<double>(l.attn_dp)) * static_cast<double>(wl.context);
  }
  p.required_kv_bytes_per_gpu =
      std::ceil(tokens_per_group / static_cast<double>(l.dcp)) * static_cast<double>(p.kv_bytes_per_token);
  p.margin_bytes_per_gpu = p.kv_pool_bytes_per_gpu - p.required_kv_bytes_per_gpu;
  p.fits = p.margin_bytes_per_gpu >= 0;
  p.workload = wl;

  // Ceilings. Decode attends over the average context of a request while it generates.
  const double in = static_cast<double>(wl.input_len), out = static_cast<double>(wl.output_len);
  const double conc = static_cast<double>(wl.concurrency);
  const double decode_ctx = in + out / 2.0;
  p.decode_single = step_cost(c, gpu, l, p.w, o, 1.0, decode_ctx, true, 1.0);
  p.decode = step_cost(c, gpu, l, p.w, o, conc, decode_ctx, true, conc);
  // A prefill chunk packs several prompts, so it sees prefill_chunk tokens per attention group.
  const double chunk_tokens = static_cast<double>(o.prefill_chunk * l.attn_dp);
  p.prefill = step_cost(c, gpu, l, p.w, o, chunk_tokens, in / 2.0, false, chunk_tokens / in);
  p.single_stream_tok_s = 1.0 / p.decode_single.time_s;
  p.per_stream_tok_s = 1.0 / p.decode.time_s;
  p.decode_aggregate_tok_s = conc / p.decode.time_s;
  p.prefill_tok_s = chunk_tokens / p.prefill.time_s;
  // Steady state with `conc` slots: every request spends out decode steps in a batch of conc and
  // its prompt costs in / prefill_tok_s of whole-deployment time (prefill and decode do not overlap).
  const double seconds_per_round = out * p.decode.time_s + conc * in / p.prefill_tok_s;
  p.aggregate_tok_s = conc * out / seconds_per_round;

  p.usd_per_gpu_hour = o.usd_per_gpu_hour >= 0 ? o.usd_per_gpu_hour : gpu.usd_per_gpu_hour;
  p.price_is_placeholder = o.usd_per_gpu_hour < 0;
  p.tok_s_per_gpu = bench::tok_s_per_gpu(p.aggregate_tok_s, world);
  p.tok_s_per_usd_gpu_hour = bench::tok_s_per_usd_gpu_hour(p.aggregate_tok_s, world, p.usd_per_gpu_hour);
  p.usd_per_million_tokens = bench::usd_per_million_tokens(p.aggregate_tok_s, world, p.usd_per_gpu_hour);
  p.facility_watts = bench::facility_watts(world, gpu.board_watts, o.pue);
  p.joules_per_token = bench::joules_per_token(p.aggregate_tok_s, world, gpu.board_watts, o.pue);
  return p;
}

}  // namespace kiln::plan
