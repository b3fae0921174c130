#include "bench/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "bench/cost.h"

namespace kiln::bench {

const char* token_source_name(TokenSource s) {
  switch (s) {
    case TokenSource::kUsage: return "usage";
    case TokenSource::kTokenizer: return "tokenizer";
    case TokenSource::kEvents: return "events";
  }
  return "?";
}

void count_tokens(std::vector<RequestRecord>& records, const PromptTokenizer* tok) {
  for (auto& r : records) {
    if (r.usage_prompt_tokens >= 0) r.prompt_tokens = r.usage_prompt_tokens;
    if (r.usage_completion_tokens >= 0) {
      r.output_tokens = r.usage_completion_tokens;
      r.output_source = TokenSource::kUsage;
    } else if (tok && tok->exact()) {
      r.output_tokens = tok->count(r.text);
      r.output_source = TokenSource::kTokenizer;
    } else {
      // Streaming servers send one chunk per decode step, so events are tokens (one per step).
      r.output_tokens = static_cast<int64_t>(r.event_ms.size());
      r.output_source = TokenSource::kEvents;
    }
  }
}

void apply_cost(PointSummary& s, const CostSpec& c) {
  s.cost = c;
  // With no GPU count there is no per-GPU figure: NaN reads "-" in the table and null in the JSON.
  s.output_tok_s_per_gpu = c.gpus > 0 ? tok_s_per_gpu(s.output_tok_s, c.gpus) : std::nan("");
  s.output_tok_s_per_usd_gpu_hour = tok_s_per_usd_gpu_hour(s.output_tok_s, c.gpus, c.usd_per_gpu_hour);
  s.usd_per_million_output_tokens = usd_per_million_tokens(s.output_tok_s, c.gpus, c.usd_per_gpu_hour);
  const double watts = c.kw_per_gpu * 1000.0;
  s.joules_per_output_token = joules_per_token(s.output_tok_s, c.gpus, watts, c.pue);
  s.usd_per_million_output_tokens_with_power =
      usd_per_million_tokens(s.output_tok_s, CostInputs{c.gpus, c.usd_per_gpu_hour, watts, c.pue, c.usd_per_kwh});
}

PointSummary summarize(const std::vector<RequestRecord>& records, double duration_s, const CostSpec& cost,
                       int64_t max_in_flight, double client_cpu_s) {
  PointSummary s;
  s.num_prompts = static_cast<int64_t>(records.size());
  s.duration_s = duration_s;
  s.max_in_flight = max_in_flight;
  s.client_cpu_s = client_cpu_s;
  std::vector<double> ttft, tpot, itl, e2e, prefill;
  std::vector<std::pair<double, double>> token_times;  // (s since the point started, tokens)
  double e2e_sum_s = 0;
  for (const auto& r : records) {
    if (!r.success) {
      ++(r.error_kind == "interrupted" ? s.interrupted : s.failed);
      ++s.errors[r.error_kind];
      s.error_examples.emplace(r.error_kind, r.error);
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.prompt_tokens;
    s.total_output_tokens += r.output_tokens;
    ttft.push_back(r.ttft_ms);
    e2e.push_back(r.e2e_ms);
    e2e_sum_s += r.e2e_ms / 1000.0;
    if (r.output_tokens > 1) tpot.push_back((r.e2e_ms - r.ttft_ms) / static_cast<double>(r.output_tokens - 1));
    for (size_t i = 1; i < r.event_ms.size(); ++i) itl.push_back(r.event_ms[i] - r.event_ms[i - 1]);
    if (r.ttft_ms > 0) prefill.push_back(static_cast<double>(r.prompt_tokens) / (r.ttft_ms / 1000.0));
    // A chunk may carry several tokens (speculative decoding): spread the request's tokens evenly
    // over its events for the windowed peak.
    const double per_event = r.event_ms.empty() ? 0.0 : static_cast<double>(r.output_tokens) / r.event_ms.size();
    for (double t : r.event_ms) token_times.emplace_back(r.start_s + t / 1000.0, per_event);
  }
  if (duration_s > 0) {
    s.request_throughput = static_cast<double>(s.completed) / duration_s;
    s.input_tok_s = static_cast<double>(s.total_input_tokens) / duration_s;
    s.output_tok_s = static_cast<double>(s.total_output_tokens) / duration_s;
    s.total_tok_s = s.input_tok_s + s.output_tok_s;
    s.concurrency_achieved = e2e_sum_s / duration_s;
    s.client_cpu_utilization = client_cpu_s / duration_s;
  }
  // The busiest second; a run shorter than a second is its own window (its average rate), not a
  // second that is partly empty.
  const double window_s = duration_s > 0 ? std::min(1.0, duration_s) : 1.0;
  s.peak_output_tok_s = peak_window_sum(std::move(token_times), window_s) / window_s;
  s.ttft_ms = describe(std::move(ttft));
  s.tpot_ms = describe(std::move(tpot));
  s.itl_ms = describe(std::move(itl));
  s.e2e_ms = describe(std::move(e2e));
  s.prefill_tok_s = describe(std::move(prefill)).mean;
  s.per_stream_decode_tok_s = s.tpot_ms.mean > 0 ? 1000.0 / s.tpot_ms.mean : 0.0;
  apply_cost(s, cost);
  return s;
}

nlohmann::json to_json(const PointSummary& s) {
  auto num_or_null = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  const nlohmann::json gpus = s.cost.gpus > 0 ? nlohmann::json(s.cost.gpus) : nlohmann::json(nullptr);  // 0: unknown
  nlohmann::json j = {{"concurrency", s.concurrency > 0 ? nlohmann::json(s.concurrency) : nlohmann::json(nullptr)},
                      {"request_rate", num_or_null(s.request_rate)},
                      {"num_prompts", s.num_prompts},
                      {"completed", s.completed},
                      {"failed", s.failed},
                      {"interrupted", s.interrupted},
                      {"errors", s.errors},
                      {"error_examples", s.error_examples},
                      {"duration_s", s.duration_s},
                      {"total_input_tokens", s.total_input_tokens},
                      {"total_output_tokens", s.total_output_tokens},
                      {"request_throughput", s.request_throughput},
                      {"input_tok_s", s.input_tok_s},
                      {"output_tok_s", s.output_tok_s},
                      {"total_tok_s", s.total_tok_s},
                      {"peak_output_tok_s", s.peak_output_tok_s},
                      {"per_stream_decode_tok_s", s.per_stream_decode_tok_s},
                      {"concurrency_achieved", s.concurrency_achieved},
                      {"max_in_flight", s.max_in_flight},
                      {"prefill_tok_s", s.prefill_tok_s},
                      {"ttft_ms", to_json(s.ttft_ms)},
                      {"tpot_ms", to_json(s.tpot_ms)},
                      {"itl_ms", to_json(s.itl_ms)},
                      {"e2e_ms", to_json(s.e2e_ms)},
                      {"gpus", gpus},
                      {"output_tok_s_per_gpu", num_or_null(s.output_tok_s_per_gpu)},
                      {"output_tok_s_per_usd_gpu_hour", s.output_tok_s_per_usd_gpu_hour},
                      {"usd_per_million_output_tokens", s.usd_per_million_output_tokens},
                      {"client_cpu_s", s.client_cpu_s},
                      {"client_cpu_utilization", s.client_cpu_utilization}};
  if (s.engine) {
    const double steps = std::max(1.0, s.engine->steps);
    j["engine"] = {{"steps", s.engine->steps},
                   {"schedule_s", s.engine->schedule_s},
                   {"forward_s", s.engine->forward_s},
                   {"post_s", s.engine->post_s},
                   {"device_busy_s", s.engine->device_busy_s},
                   {"ms_per_step",
                    {{"schedule", 1e3 * s.engine->schedule_s / steps},
                     {"forward", 1e3 * s.engine->forward_s / steps},
                     {"post", 1e3 * s.engine->post_s / steps}}},
                   {"busy_fraction", s.engine_busy_fraction}};
    if (s.engine->spec_verifies > 0)
      j["engine"]["speculative"] = {
          {"verifies", s.engine->spec_verifies},
          {"draft_tokens", s.engine->spec_draft_tokens},
          {"accepted_tokens", s.engine->spec_accepted_tokens},
          {"acceptance_rate",
           s.engine->spec_draft_tokens > 0 ? s.engine->spec_accepted_tokens / s.engine->spec_draft_tokens : 0.0},
          {"mean_accepted_length",
           (s.engine->spec_accepted_tokens + s.engine->spec_verifies) / s.engine->spec_verifies},
          {"draft_s", s.engine->spec_draft_s},
          {"verify_s", s.engine->spec_verify_s}};
  }
  if (s.cost.kw_per_gpu > 0) {
    j["joules_per_output_token"] = s.joules_per_output_token;
    j["usd_per_million_output_tokens_with_power"] = s.usd_per_million_output_tokens_with_power;
  }
  return j;
}

std::optional<EnginePhases> parse_engine_phases(const std::string& text) {
  EnginePhases p;
  bool any = false;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t space = line.rfind(' ');
    if (line.empty() || line[0] == '#' || space == std::string::npos) continue;
    const std::string name = line.substr(0, space);
    double* field = name == "kiln_engine_phase_seconds_total{phase=\"schedule\"}"  ? &p.schedule_s
                    : name == "kiln_engine_phase_seconds_total{phase=\"forward\"}" ? &p.forward_s
                    : name == "kiln_engine_phase_seconds_total{phase=\"post\"}"    ? &p.post_s
                    : name == "kiln_engine_device_busy_seconds_total"              ? &p.device_busy_s
                    : name == "kiln_engine_steps_total"                            ? &p.steps
                    : name == "kiln_spec_decode_verifies_total"                    ? &p.spec_verifies
                    : name == "kiln_spec_decode_draft_tokens_total"                ? &p.spec_draft_tokens
                    : name == "kiln_spec_decode_accepted_tokens_total"             ? &p.spec_accepted_tokens
                    : name == "kiln_spec_decode_seconds_total{phase=\"draft\"}"    ? &p.spec_draft_s
                    : name == "kiln_spec_decode_seconds_total{phase=\"verify\"}"   ? &p.spec_verify_s
                                                                                   : nullptr;
    if (!field) continue;
    char* end = nullptr;
    const std::string value = line.substr(space + 1);
    const double v = std::strtod(value.c_str(), &end);
    if (end == value.c_str() || !std::isfinite(v)) continue;
    *field = v;
    any = true;
  }
  if (!any) return std::nullopt;
  return p;
}

std::optional<EnginePhases> engine_phases_between(const std::optional<EnginePhases>& before,
                                                  const std::optional<EnginePhases>& after) {
  if (!before || !after) return std::nullopt;
  return EnginePhases{after->schedule_s - before->schedule_s,
                      after->forward_s - before->forward_s,
                      after->post_s - before->post_s,
                      after->device_busy_s - before->device_busy_s,
                      after->steps - before->steps,
                      after->spec_verifies - before->spec_verifies,
                      after->spec_draft_tokens - before->spec_draft_tokens,
                      after->spec_accepted_tokens - before->spec_accepted_tokens,
                      after->spec_draft_s - before->spec_draft_s,
                      after->spec_verify_s - before->spec_verify_s};
}

nlohmann::json to_json(const RequestRecord& r, int64_t point) {
  // Milliseconds to the microsecond keep the file small without losing anything measurable.
  auto us = [](double ms) { return std::round(ms * 1000.0) / 1000.0; };
  nlohmann::json itl = nlohmann::json::array();
  for (size_t i = 1; i < r.event_ms.size(); ++i) itl.push_back(us(r.event_ms[i] - r.event_ms[i - 1]));
  nlohmann::json j = {
      {"point", point},
      {"index", r.index},
      {"success", r.success},
      {"start_s", std::round(r.start_s * 1e6) / 1e6},
      {"ttft_ms", us(r.ttft_ms)},
      {"e2e_ms", us(r.e2e_ms)},
      {"prompt_tokens", r.prompt_tokens},
      {"workload_prompt_tokens", r.workload_prompt_tokens},
      {"output_tokens", r.output_tokens},
      {"output_tokens_source", token_source_name(r.output_source)},
      {"max_tokens", r.max_tokens},
      {"usage_prompt_tokens",
       r.usage_prompt_tokens >= 0 ? nlohmann::json(r.usage_prompt_tokens) : nlohmann::json(nullptr)},
      {"usage_completion_tokens",
       r.usage_completion_tokens >= 0 ? nlohmann::json(r.usage_completion_tokens) : nlohmann::json(nullptr)},
      {"token_events", r.event_ms.size()},
      {"itl_ms", std::move(itl)},
      {"finish_reason", r.finish_reason},
      {"http_status", r.http_status}};
  if (r.group >= 0) j["group"] = r.group;
  if (!r.success) {
    j["error_kind"] = r.error_kind;
    j["error"] = r.error;
  }
  return j;
}

}  // namespace kiln::bench
