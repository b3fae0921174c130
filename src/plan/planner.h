// The deployment model: does a model fit a layout of GPUs (weights + reserve + KV pool, per GPU),
// and what throughput can that hardware give at best (a roofline ceiling per decode step), at what
// price and power. Pure arithmetic over the config, the catalog entry and the layout; no I/O.
// docs/planning.md states every assumption.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "plan/hardware.h"
#include "plan/weight_bytes.h"

namespace kiln::plan {

struct Layout {
  int64_t gpus_per_node = 8;
  int64_t nodes = 1;
  int64_t tp = 0;       // attention tensor-parallel group size; 0: world / attn_dp
  int64_t attn_dp = 1;  // attention data-parallel groups (each holds its own sequences' KV)
  int64_t ep = 0;       // expert-parallel size; 0: world. world / ep GPUs split each expert (expert TP)
  int64_t dcp = 1;      // decode context parallelism: one sequence's KV split over dcp ranks of a TP group
  int64_t world() const { return gpus_per_node * nodes; }
};

struct Workload {
  int64_t input_len = 1024;    // prompt tokens per request
  int64_t output_len = 400;    // generated tokens per request
  int64_t concurrency = 0;     // concurrent sequences; 0: as many as the KV pool holds at `context`, <= 1024
  int64_t context = 0;         // tokens one sequence may hold; 0: input_len + output_len
  int64_t kv_pool_tokens = 0;  // KV pool the deployment must hold (all sequences); 0: context x concurrency
};

struct PlanOptions {
  WeightFormat weights = WeightFormat::Bf16;
  int64_t kv_bytes_per_value = 2;    // 2: bf16 latent, 1: fp8
  bool include_mtp = false;          // load the NextN layers (speculative decoding)
  double reserve_bytes = -1;         // per-GPU runtime + activation reserve; < 0: estimated (reserve_estimate)
  int64_t prefill_chunk = 8192;      // tokens per prefill chunk (activation reserve, prefill ceiling)
  double usd_per_gpu_hour = -1;      // < 0: the catalog's price
  double inter_node_bytes_s = 50e9;  // per GPU across nodes, one direction (a 400 Gb/s NIC per GPU)
  double inter_node_latency_s = 20e-6;
  double pue = 1.0;  // power per token is board power x pue
};

inline constexpr int64_t kMaxAutoConcurrency = 1024;

// Expected number of distinct experts B tokens touch when each picks k of E uniformly without
// replacement: E (1 - (1 - k/E)^B). B may be fractional (an average).
double expected_distinct_experts(int64_t num_experts, int64_t top_k, double tokens);

// Runtime reserve (context, NCCL buffers, library workspaces) plus activations of one prefill chunk.
double reserve_estimate(const ModelConfig& c, int64_t prefill_chunk);

// The cost of one forward step on one GPU (all GPUs are alike in this model).
struct StepCost {
  double tokens = 0;            // tokens in the step, whole deployment
  double distinct_experts = 0;  // expected distinct routed experts per MoE layer
  double bytes = 0;             // HBM bytes one GPU reads
  double flops = 0;             // FLOPs one GPU does
  double mem_s = 0;             // bytes / bandwidth
  double compute_s = 0;         // FLOPs / tensor rate (each part at its own rate)
  double comm_s = 0;            // all-reduce / all-to-all / DCP merge, latency included
  double time_s = 0;            // max(mem_s, compute_s) + comm_s
  const char* bound = "";       // "memory" or "compute"
};

struct Plan {
  std::string model, gpu;
  Layout layout;  // resolved: tp, ep filled in
  WeightFormat weights = WeightFormat::Bf16;
  int64_t kv_bytes_per_value = 2;
  int64_t layers = 0;         // decoder layers holding KV
  int64_t kv_row_values = 0;  // latent values per token per layer (kv_lora_rank + qk_rope_head_dim)
  Workload workload;          // resolved: context and concurrency filled in
  WeightTotals w;
  double bits_per_param = 0;
  // Memory per GPU, bytes.
  double usable_bytes_per_gpu = 0;  // driver-visible HBM
  double reserve_bytes_per_gpu = 0;
  int64_t kv_bytes_per_token = 0;         // one token of one sequence, all layers (the whole latent row)
  double kv_bytes_per_token_per_gpu = 0;  // what one GPU holds of it: / dcp, replicated over the rest of TP
  double kv_pool_bytes_per_gpu = 0;       // usable - weights - reserve (negative: the weights do not fit)
  int64_t kv_capacity_tokens = 0;         // tokens the whole deployment holds (per GPU x dcp x attn_dp)
  int64_t max_sequences = 0;              // sequences of `context` tokens that fit
  int64_t required_kv_tokens = 0;
  double required_kv_bytes_per_gpu = 0;
  bool fits = false;                // weights + reserve + required KV <= usable
  double margin_bytes_per_gpu = 0;  // usable - (weights + reserve + required KV); negative = short by
  // Ceilings.
  StepCost decode_single;             // batch 1
  StepCost decode;                    // batch = concurrency
  StepCost prefill;                   // one chunk per attention group
  double single_stream_tok_s = 0;     // decode, batch 1
  double per_stream_tok_s = 0;        // decode, at the workload's concurrency
  double decode_aggregate_tok_s = 0;  // decode only
  double prefill_tok_s = 0;           // prompt tokens per second, whole deployment
  double aggregate_tok_s = 0;         // output tokens per second with each request's prefill paid
  // Cost and power (bench/cost.h).
  double usd_per_gpu_hour = 0;
  bool price_is_placeholder = false;  // the catalog's default, not a price the user gave
  double tok_s_per_gpu = 0;
  double tok_s_per_usd_gpu_hour = 0;
  double usd_per_million_tokens = 0;
  double facility_watts = 0;
  double joules_per_token = 0;
};

// Checks the layout against the model (divisibility, head and expert split) and fills defaults; an
// inconsistent layout is an error naming the flag at fault.
Layout resolve_layout(const ModelConfig& c, Layout l);

// The whole plan. `model_name` and the GPU's name are carried into the result for reports.
Plan make_plan(const std::string& model_name, const ModelConfig& c, const GpuSpec& gpu, const Layout& layout,
               const Workload& workload, const PlanOptions& opts);

// One step of `tokens` tokens (whole deployment) attending over `context` tokens each; `decode` picks
// the absorbed MLA form that reads the cache, otherwise the expanded prefill form.
StepCost step_cost(const ModelConfig& c, const GpuSpec& gpu, const Layout& l, const WeightTotals& w,
                   const PlanOptions& opts, double tokens, double context, bool decode, double logit_rows);

}  // namespace kiln::plan
