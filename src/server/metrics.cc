#include "server/metrics.h"

#include <fmt/format.h>

#include <utility>

namespace kiln::server {
namespace {

std::string escape_label(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\\' || c == '"') o.push_back('\\');
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o.push_back(c);
  }
  return o;
}

void gauge(std::string& out, const char* name, const char* help, double v, const std::string& labels = {}) {
  out += fmt::format("# HELP {0} {1}\n# TYPE {0} gauge\n{0}{2} {3}\n", name, help, labels, v);
}
void counter(std::string& out, const char* name, const char* help, double v) {
  out += fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n{0} {2}\n", name, help, v);
}

std::vector<double> latency_buckets() {
  return {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}

void Histogram::observe(double s) {
  size_t i = 0;
  while (i < bounds_.size() && s > bounds_[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_us_.fetch_add(static_cast<uint64_t>(std::max(0.0, s) * 1e6), std::memory_order_relaxed);
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  out += fmt::format("# HELP {0} {1}\n# TYPE {0} histogram\n", name, help);
  uint64_t cum = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    cum += counts_[i].load(std::memory_order_relaxed);
    const std::string le = i < bounds_.size() ? fmt::format("{}", bounds_[i]) : "+Inf";
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, le, cum);
  }
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, static_cast<double>(sum_us_.load()) / 1e6, name, cum);
}

Metrics::Metrics() : ttft(latency_buckets()), itl(latency_buckets()), e2e(latency_buckets()) {}

void Metrics::request_done(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> l(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::tokens(int64_t prompt, int64_t generated) {
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

std::string Metrics::render(const EngineStats& s, const std::string& model) const {
  std::string out;
  out += "# HELP kiln_requests_total HTTP requests answered, by endpoint and status code\n";
  out += "# TYPE kiln_requests_total counter\n";
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& [k, v] : requests_)
      out +=
          fmt::format("kiln_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", escape_label(k.first), k.second, v);
  }
  counter(out, "kiln_prompt_tokens_total", "Prompt tokens of finished requests", prompt_tokens_.load());
  counter(out, "kiln_generation_tokens_total", "Generated tokens of finished requests", generated_tokens_.load());
  ttft.render(out, "kiln_time_to_first_token_seconds", "Time from request arrival to its first token");
  itl.render(out, "kiln_inter_token_latency_seconds", "Time between consecutive output chunks of a request");
  e2e.render(out, "kiln_e2e_request_latency_seconds", "Time from request arrival to its last token");
  gauge(out, "kiln_num_requests_running", "Sequences the engine is running", s.running);
  gauge(out, "kiln_num_requests_waiting", "Sequences waiting for KV blocks or a batch slot", s.waiting);
  gauge(out, "kiln_http_requests_inflight", "Generation requests the server is answering", inflight.load());
  gauge(out, "kiln_kv_blocks_total", "KV cache blocks", s.blocks_total);
  // Free means allocatable now: a prefix-cache block no request holds is evicted on demand.
  const int64_t blocks_free = s.blocks_free + s.blocks_cached_evictable;
  gauge(out, "kiln_kv_blocks_free", "KV cache blocks free (including evictable prefix-cache blocks)", blocks_free);
  gauge(out, "kiln_kv_blocks_used", "KV cache blocks held by requests (total - free)", s.blocks_total - blocks_free);
  gauge(out, "kiln_kv_blocks_cached", "KV cache blocks held by the prefix cache", s.blocks_cached);
  gauge(out, "kiln_kv_blocks_cached_evictable", "Prefix-cache blocks no request holds", s.blocks_cached_evictable);
  gauge(out, "kiln_kv_block_size", "Tokens per KV block", s.block_size);
  counter(out, "kiln_prefix_cache_queries_tokens_total", "Prompt tokens looked up in the prefix cache",
          s.prefix_query_tokens);
  counter(out, "kiln_prefix_cache_hits_tokens_total", "Prompt tokens served from the prefix cache",
          s.prefix_hit_tokens);
  gauge(out, "kiln_prefix_cache_hit_rate", "Prefix-cache hits / queries, in tokens",
        s.prefix_query_tokens ? static_cast<double>(s.prefix_hit_tokens) / s.prefix_query_tokens : 0.0);
  counter(out, "kiln_preemptions_total", "Sequences preempted for KV blocks (recomputed later)", s.preemptions);
  counter(out, "kiln_engine_steps_total", "Engine steps", s.steps);
  // The engine loop's time by phase; forward (inputs up, the model, sampled tokens down) bounds
  // how long the device was busy, so its rate is the device's busy fraction.
  out += "# HELP kiln_engine_phase_seconds_total Engine loop time by phase: schedule, forward (with sampling), post\n";
  out += "# TYPE kiln_engine_phase_seconds_total counter\n";
  for (const auto& [phase, v] : {std::pair{"schedule", s.schedule_seconds}, std::pair{"forward", s.forward_seconds},
                                 std::pair{"post", s.post_seconds}})
    out += fmt::format("kiln_engine_phase_seconds_total{{phase=\"{}\"}} {}\n", phase, v);
  counter(out, "kiln_engine_device_busy_seconds_total",
          "Device time from each engine step's first queued op to its last (its rate: the busy fraction)",
          s.device_seconds);
  counter(out, "kiln_requests_aborted_total", "Requests the engine aborted (cancelled or failed)", s.requests_aborted);
  // Speculative decoding (all 0 without --speculative-algorithm).
  const SpecDecodeStats& sd = s.spec;
  counter(out, "kiln_spec_decode_draft_tokens_total", "Draft tokens proposed", sd.draft_tokens);
  counter(out, "kiln_spec_decode_accepted_tokens_total", "Draft tokens accepted", sd.accepted_tokens);
  gauge(out, "kiln_spec_decode_acceptance_rate", "Accepted / proposed draft tokens", sd.acceptance_rate());
  counter(out, "kiln_spec_decode_verifies_total", "Sequence verifications (speculating rows of engine steps)",
          sd.verifies);
  gauge(out, "kiln_spec_decode_mean_accepted_length", "Tokens emitted per verification (accepted drafts + 1)",
        sd.mean_accepted_length());
  out += "# HELP kiln_spec_decode_position_accepted_total Drafts accepted at each draft position (0-based)\n";
  out += "# TYPE kiln_spec_decode_position_accepted_total counter\n";
  for (size_t i = 0; i < sd.accepted_at.size(); ++i)
    out += fmt::format("kiln_spec_decode_position_accepted_total{{position=\"{}\"}} {}\n", i, sd.accepted_at[i]);
  out += "# HELP kiln_spec_decode_position_proposed_total Drafts proposed at each draft position (0-based)\n";
  out += "# TYPE kiln_spec_decode_position_proposed_total counter\n";
  for (size_t i = 0; i < sd.proposed_at.size(); ++i)
    out += fmt::format("kiln_spec_decode_position_proposed_total{{position=\"{}\"}} {}\n", i, sd.proposed_at[i]);
  out +=
      "# HELP kiln_spec_decode_seconds_total Speculative decoding time: draft (the drafter), verify (target steps)\n";
  out += "# TYPE kiln_spec_decode_seconds_total counter\n";
  out += fmt::format("kiln_spec_decode_seconds_total{{phase=\"draft\"}} {}\n", sd.draft_seconds);
  out += fmt::format("kiln_spec_decode_seconds_total{{phase=\"verify\"}} {}\n", sd.verify_seconds);
  // What the speculation policy decided (engine/spec_policy.h): its last step, and every step's.
  const SpecPolicyStats& sp = sd.policy;
  gauge(out, "kiln_spec_decode_policy_speculating", "1 when the last decode step verified drafts, else 0",
        sp.speculating ? 1 : 0);
  gauge(out, "kiln_spec_decode_policy_draft_tokens", "Drafts per decode row the last step verified (its mean K)",
        sp.drafts_per_row);
  gauge(out, "kiln_spec_decode_policy_expected_speedup",
        "The last decision's expected throughput of speculating over plain decoding (adaptive policy)",
        sp.expected_speedup);
  counter(out, "kiln_spec_decode_policy_switches_total", "Changes of the adaptive policy's preferred mode",
          sp.switches);
  out += "# HELP kiln_spec_decode_policy_decisions_total Decode steps by the policy's decision (probes included)\n";
  out += "# TYPE kiln_spec_decode_policy_decisions_total counter\n";
  for (const auto& [d, v] :
       {std::pair{"speculate", sp.speculate_steps}, std::pair{"plain", sp.plain_steps},
        std::pair{"probe_speculate", sp.probe_speculate}, std::pair{"probe_plain", sp.probe_plain}})
    out += fmt::format("kiln_spec_decode_policy_decisions_total{{decision=\"{}\"}} {}\n", d, v);
  out += "# HELP kiln_kernel_plan_info The implementation serving each op (value is always 1)\n";
  out += "# TYPE kiln_kernel_plan_info gauge\n";
  for (const auto& [op, impl] : plan_)
    out += fmt::format("kiln_kernel_plan_info{{model=\"{}\",op=\"{}\",impl=\"{}\"}} 1\n", escape_label(model),
                       escape_label(op), escape_label(impl));
  return out;
}

}  // namespace kiln::server
