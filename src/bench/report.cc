#include "bench/report.h"

#include <fmt/format.h>

#include <cmath>

namespace kiln::bench {

std::string format_figure(double v) {
  if (!std::isfinite(v)) return "-";
  // Decide on the rounded value, so that 99.97 prints as "100", not "100.0".
  const double a = std::fabs(v);
  if (a >= 99.95 || a == 0) return fmt::format("{:.0f}", v);
  if (a >= 9.995) return fmt::format("{:.1f}", v);
  return fmt::format("{:.2f}", v);
}

namespace {

struct Column {
  std::string head;
  std::vector<std::string> cells;
};

std::string usd(double v) {
  return v > 0 ? fmt::format("${:.2f}", v) : "-";
}

}  // namespace

std::string format_table(const std::vector<PointSummary>& points) {
  if (points.empty()) return "(no sweep point completed)\n";
  bool any_rate = false, any_price = false, any_power = false;
  for (const auto& p : points) {
    any_rate |= std::isfinite(p.request_rate);
    any_price |= p.cost.usd_per_gpu_hour > 0;
    any_power |= p.cost.kw_per_gpu > 0;
  }
  std::vector<Column> cols;
  cols.reserve(16);  // col() hands out references into it: no reallocation
  auto col = [&](std::string head) -> std::vector<std::string>& {
    cols.push_back({std::move(head), {}});
    return cols.back().cells;
  };
  auto& conc = col("concurrency");
  std::vector<std::string>* rate = any_rate ? &col("req/s") : nullptr;
  auto& done = col("done");
  auto& failed = col("failed");
  auto& per_stream = col("decode tok/s per stream");
  auto& agg = col("output tok/s");
  auto& peak = col("peak tok/s");
  // Per-GPU figures only where the GPU count was given (--gpus): a server's accelerators are unknown.
  const int64_t gpus = points.front().cost.gpus;
  std::vector<std::string>* per_gpu = gpus > 0 ? &col(fmt::format("tok/s per GPU ({})", gpus)) : nullptr;
  std::vector<std::string>* per_usd = any_price ? &col("tok/s per $/GPU-hr") : nullptr;
  std::vector<std::string>* usd_m = any_price ? &col("$/M output tok") : nullptr;
  std::vector<std::string>* joules = any_power ? &col("J/output tok") : nullptr;
  std::vector<std::string>* usd_m_power = any_power ? &col("$/M with power") : nullptr;
  auto& ttft = col("TTFT p50/p99 ms");
  auto& tpot = col("TPOT p50/p99 ms");
  auto& itl = col("ITL p99 ms");
  for (const auto& p : points) {
    conc.push_back(p.concurrency > 0 ? std::to_string(p.concurrency) : "unlimited");
    if (rate) rate->push_back(std::isfinite(p.request_rate) ? format_figure(p.request_rate) : "inf");
    done.push_back(std::to_string(p.completed));
    failed.push_back(std::to_string(p.failed) + (p.interrupted ? fmt::format(" (+{} cut)", p.interrupted) : ""));
    per_stream.push_back(format_figure(p.per_stream_decode_tok_s));
    agg.push_back(format_figure(p.output_tok_s));
    peak.push_back(format_figure(p.peak_output_tok_s));
    if (per_gpu) per_gpu->push_back(format_figure(p.output_tok_s_per_gpu));
    if (per_usd) per_usd->push_back(p.cost.usd_per_gpu_hour > 0 ? format_figure(p.output_tok_s_per_usd_gpu_hour) : "-");
    if (usd_m) usd_m->push_back(usd(p.usd_per_million_output_tokens));
    if (joules) joules->push_back(format_figure(p.joules_per_output_token));
    if (usd_m_power) usd_m_power->push_back(usd(p.usd_per_million_output_tokens_with_power));
    ttft.push_back(format_figure(p.ttft_ms.median) + " / " + format_figure(p.ttft_ms.p99));
    tpot.push_back(format_figure(p.tpot_ms.median) + " / " + format_figure(p.tpot_ms.p99));
    itl.push_back(format_figure(p.itl_ms.p99));
  }
  std::vector<size_t> width;
  for (const auto& c : cols) {
    size_t w = c.head.size();
    for (const auto& s : c.cells) w = std::max(w, s.size());
    width.push_back(w);
  }
  std::string out = "|";
  for (size_t i = 0; i < cols.size(); ++i) out += fmt::format(" {:<{}} |", cols[i].head, width[i]);
  out += "\n|";
  for (size_t i = 0; i < cols.size(); ++i) out += std::string(width[i] + 2, '-') + "|";
  out += "\n";
  for (size_t r = 0; r < points.size(); ++r) {
    out += "|";
    for (size_t i = 0; i < cols.size(); ++i) out += fmt::format(" {:>{}} |", cols[i].cells[r], width[i]);
    out += "\n";
  }
  return out;
}

std::string format_notes(const std::vector<PointSummary>& points) {
  std::string out;
  for (const auto& p : points) {
    const std::string at = p.concurrency > 0 ? fmt::format("concurrency {}", p.concurrency)
                                             : fmt::format("{} req/s", format_figure(p.request_rate));
    for (const auto& [kind, n] : p.errors) {
      auto ex = p.error_examples.find(kind);
      out += fmt::format("{}: {} request(s) failed with {}{}\n", at, n, kind,
                         ex != p.error_examples.end() && !ex->second.empty() ? " (" + ex->second + ")" : "");
    }
    if (p.engine && p.engine->steps > 0)
      out += fmt::format(
          "{}: Kiln device busy {:.0f}% of the wall time; per step {:.2f} ms on the device, host {:.2f} ms in the "
          "forward (launch and wait), {:.2f} ms schedule, {:.2f} ms post-processing over {:.0f} steps\n",
          at, p.engine_busy_fraction * 100, 1e3 * p.engine->device_busy_s / p.engine->steps,
          1e3 * p.engine->forward_s / p.engine->steps, 1e3 * p.engine->schedule_s / p.engine->steps,
          1e3 * p.engine->post_s / p.engine->steps, p.engine->steps);
    if (p.engine && p.engine->spec_verifies > 0)
      out += fmt::format(
          "{}: speculative decoding accepted {:.0f} of {:.0f} drafts ({:.1f}%), mean accepted length {:.2f} tokens "
          "per verify; draft {:.2f} s, verify steps {:.2f} s\n",
          at, p.engine->spec_accepted_tokens, p.engine->spec_draft_tokens,
          p.engine->spec_draft_tokens > 0 ? 100 * p.engine->spec_accepted_tokens / p.engine->spec_draft_tokens : 0.0,
          (p.engine->spec_accepted_tokens + p.engine->spec_verifies) / p.engine->spec_verifies, p.engine->spec_draft_s,
          p.engine->spec_verify_s);
    if (p.client_cpu_utilization > 0.9)
      out += fmt::format(
          "{}: the load generator used {:.0f}% of a core; these figures may be its limit, not the server's\n", at,
          p.client_cpu_utilization * 100);
  }
  return out;
}

}  // namespace kiln::bench
