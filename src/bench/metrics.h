// From request records to the figures of one sweep point, defined as SGLang's bench_serving and
// vLLM's `bench serve` define them (docs/benchmarking.md, "Metrics", says each one in words):
//   duration       first send to last completion
//   throughput     completed requests, input, output and total tokens over the duration
//   TTFT           send -> first token event;  E2E   send -> end of the response
//   TPOT           per request (E2E - TTFT) / (output tokens - 1), for requests with 2+ tokens
//   ITL            every gap between consecutive token events, pooled over requests
//   per-stream decode tok/s = 1000 / mean TPOT (ms)
//   concurrency achieved = sum of E2E / duration (SGLang); peak in flight alongside
//   peak output tok/s = most output tokens in any 1-second window (the whole run when shorter)
// Only successful requests enter the latency and token figures; failures are counted by kind.
// The cost columns go through bench/cost.h, the one place for that arithmetic.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench/prompt_tokenizer.h"
#include "bench/record.h"
#include "bench/stats.h"

namespace kiln::bench {

struct CostSpec {
  int64_t gpus = 0;             // GPUs behind the server; 0: unknown (no per-GPU or cost figures)
  double usd_per_gpu_hour = 0;  // price of one GPU-hour; 0: no price columns
  double kw_per_gpu = 0;        // board power while serving, kW per GPU; 0: no power columns
  double usd_per_kwh = 0;       // electricity price
  double pue = 1.0;             // facility power over IT power
};

// Fills output_tokens / prompt_tokens of every record: the server's usage when it sent one, else
// the model tokenizer's count of the text (when `tok` is exact), else the number of token events.
void count_tokens(std::vector<RequestRecord>& records, const PromptTokenizer* tok);

// The engine loop's counters as a Kiln server's /metrics reports them.
struct EnginePhases {
  double schedule_s = 0, forward_s = 0, post_s = 0;
  double device_busy_s = 0;  // the device's time on the engine's steps (CUDA events)
  double steps = 0;
  // Speculative decoding (kiln_spec_decode_*): sequence verifications, drafts, accepted drafts,
  // and the drafter's and the verify steps' time.
  double spec_verifies = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0, spec_draft_s = 0, spec_verify_s = 0;
};

struct PointSummary {
  int64_t concurrency = 0;                                        // the concurrency limit asked for; 0: none
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s asked; inf: all at once
  int64_t num_prompts = 0;                                        // requests in the point
  int64_t completed = 0, failed = 0, interrupted = 0;
  std::map<std::string, int64_t> errors;              // error_kind -> requests
  std::map<std::string, std::string> error_examples;  // error_kind -> one detail message
  double duration_s = 0;
  int64_t total_input_tokens = 0, total_output_tokens = 0;  // over completed requests
  double request_throughput = 0;                            // completed requests/s
  double input_tok_s = 0, output_tok_s = 0, total_tok_s = 0;
  double peak_output_tok_s = 0;        // busiest 1 s window (the run's average when it is shorter)
  double per_stream_decode_tok_s = 0;  // 1000 / mean TPOT (ms)
  double concurrency_achieved = 0;     // sum of E2E / duration
  int64_t max_in_flight = 0;           // most requests open at once
  double prefill_tok_s = 0;            // mean of input tokens / TTFT: prefill speed when requests run alone
  Distribution ttft_ms, tpot_ms, itl_ms, e2e_ms;
  // Cost columns (bench/cost.h) from output_tok_s.
  CostSpec cost;
  double output_tok_s_per_gpu = 0;
  double output_tok_s_per_usd_gpu_hour = 0;             // tok/s per GPU per $/GPU-hour
  double usd_per_million_output_tokens = 0;             // GPU-hours only
  double joules_per_output_token = 0;                   // facility energy (power x PUE); 0 without power
  double usd_per_million_output_tokens_with_power = 0;  // GPU-hours + electricity
  double client_cpu_s = 0;                              // the load generator's CPU time in the point
  double client_cpu_utilization = 0;                    // client_cpu_s / duration: near 1 means saturated
  // A Kiln server's engine loop over the point (its /metrics before and after): seconds per
  // phase, and the device's busy time as a share of the point's wall time.
  std::optional<EnginePhases> engine;
  double engine_busy_fraction = 0;
};

// Reads kiln_engine_phase_seconds_total and kiln_engine_steps_total from a Prometheus text page;
// nothing when the page has none of them (not a Kiln server).
std::optional<EnginePhases> parse_engine_phases(const std::string& metrics_text);
// after - before, phase by phase; nothing unless both are known.
std::optional<EnginePhases> engine_phases_between(const std::optional<EnginePhases>& before,
                                                  const std::optional<EnginePhases>& after);

// `max_in_flight`, `client_cpu_s`: from the RunResult; the rest from the records.
PointSummary summarize(const std::vector<RequestRecord>& records, double duration_s, const CostSpec& cost,
                       int64_t max_in_flight = 0, double client_cpu_s = 0);

// Fills the cost columns of `s` from s.output_tok_s and `cost` (exposed for the cost tests).
void apply_cost(PointSummary& s, const CostSpec& cost);

nlohmann::json to_json(const PointSummary& s);
// One record for the JSON output, tagged with its sweep point; the text is left out.
nlohmann::json to_json(const RequestRecord& r, int64_t point);

}  // namespace kiln::bench
