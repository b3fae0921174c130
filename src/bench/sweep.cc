#include "bench/sweep.h"

#include <spdlog/spdlog.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <thread>

#include "bench/arrivals.h"
#include "bench/progress.h"
#include "bench/report.h"

namespace kiln::bench {
namespace {

std::string point_name(const SweepPointSpec& p) {
  std::string s = p.concurrency > 0 ? fmt::format("c={}", p.concurrency) : "c=unlimited";
  if (std::isfinite(p.request_rate)) s += fmt::format(" rate={:g}/s", p.request_rate);
  return s;
}

std::string first_line_of(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) {
      auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return {};
}

}  // namespace

BenchResult run_bench(BenchConfig& cfg, const PromptTokenizer& tok) {
  BenchResult out;
  out.models = fetch_models(cfg.client.base_url, cfg.client.api_key);
  if (cfg.client.model.empty()) {
    const auto& data = out.models.contains("data") ? out.models["data"] : nlohmann::json();
    if (data.is_array() && !data.empty() && data[0].contains("id") && data[0]["id"].is_string()) {
      cfg.client.model = data[0]["id"].get<std::string>();
    } else {
      spdlog::warn("no model name from {}/v1/models ({}); sending \"default\" (use --model NAME)",
                   normalize_base_url(cfg.client.base_url), out.models.dump().substr(0, 200));
      cfg.client.model = "default";
    }
  }
  out.model = cfg.client.model;
  Workload workload(cfg.workload, tok);

  if (cfg.warmup > 0 && !stop_requested()) {
    const auto prompts = workload.take(cfg.warmup);
    RunOptions opt;
    opt.max_concurrency = cfg.warmup;
    ProgressBar bar("warmup", cfg.progress);
    RunProgress last;
    opt.on_progress = [&](const RunProgress& p) {
      last = p;
      bar.update(p);
    };
    RunResult r = run_requests(cfg.client, prompts, opt);
    bar.finish(last);
    const RequestRecord* first_failure = nullptr;
    for (const auto& rec : r.records)
      if (!rec.success) {
        ++out.warmup_failed;
        if (!first_failure) first_failure = &rec;
      }
    if (first_failure)
      spdlog::warn("warmup: {} of {} requests failed (first: {}: {})", out.warmup_failed, r.records.size(),
                   first_failure->error_kind, first_failure->error);
  }

  for (size_t i = 0; i < cfg.points.size() && !stop_requested(); ++i) {
    const SweepPointSpec& spec = cfg.points[i];
    const std::vector<Prompt> prompts = workload.take(spec.num_prompts);
    RunOptions opt;
    opt.max_concurrency = spec.concurrency;
    // Each point gets its own arrival stream, derived from the workload seed.
    opt.send_at_s =
        arrival_times(spec.num_prompts, spec.request_rate, cfg.burstiness, cfg.workload.seed * 1000003ULL + i + 1);
    ProgressBar bar(fmt::format("[{}/{}] {}", i + 1, cfg.points.size(), point_name(spec)), cfg.progress);
    RunProgress last;
    opt.on_progress = [&](const RunProgress& p) {
      last = p;
      bar.update(p);
    };
    PointResult pr;
    pr.spec = spec;
    const auto before = parse_engine_phases(fetch_metrics(cfg.client.base_url, cfg.client.api_key));
    pr.run = run_requests(cfg.client, prompts, opt);
    const auto after = parse_engine_phases(fetch_metrics(cfg.client.base_url, cfg.client.api_key));
    bar.finish(last);
    count_tokens(pr.run.records, &tok);
    pr.summary = summarize(pr.run.records, pr.run.duration_s, cfg.cost, pr.run.max_in_flight, pr.run.client_cpu_s);
    if ((pr.summary.engine = engine_phases_between(before, after)) && pr.run.duration_s > 0)
      pr.summary.engine_busy_fraction = pr.summary.engine->device_busy_s / pr.run.duration_s;
    pr.summary.concurrency = spec.concurrency;
    pr.summary.request_rate = spec.request_rate;
    out.interrupted |= pr.run.interrupted;
    out.points.push_back(std::move(pr));
  }
  out.interrupted |= stop_requested();
  return out;
}

nlohmann::json environment(const std::vector<std::string>& argv) {
  nlohmann::json env;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  env["hostname"] = host;
  utsname u{};
  if (uname(&u) == 0) env["os"] = fmt::format("{} {} {}", u.sysname, u.release, u.machine);
  env["cpu"] = first_line_of("/proc/cpuinfo", "model name");
  env["cpu_cores"] = std::thread::hardware_concurrency();
  env["memory"] = first_line_of("/proc/meminfo", "MemTotal");
  env["http_client"] = http_client_version();
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  env["time_utc"] = buf;
  env["argv"] = argv;
  return env;
}

nlohmann::json bench_json(const BenchConfig& cfg, const BenchResult& r, const PromptTokenizer& tok,
                          const nlohmann::json& env) {
  nlohmann::json summary = nlohmann::json::array(), requests = nlohmann::json::array();
  for (size_t i = 0; i < r.points.size(); ++i) {
    summary.push_back(to_json(r.points[i].summary));
    for (const auto& rec : r.points[i].run.records) requests.push_back(to_json(rec, static_cast<int64_t>(i)));
  }
  nlohmann::json workload = to_json(cfg.workload);
  workload["tokenizer"] = tok.describe();
  workload["endpoint"] = endpoint_path(cfg.client);
  workload["ignore_eos"] = cfg.client.ignore_eos;
  workload["temperature"] = cfg.client.temperature;
  workload["extra_body"] = cfg.client.extra_body;
  workload["warmup"] = cfg.warmup;
  workload["burstiness"] = cfg.burstiness;
  nlohmann::json points = nlohmann::json::array();
  for (const auto& p : cfg.points)
    points.push_back(
        {{"concurrency", p.concurrency > 0 ? nlohmann::json(p.concurrency) : nlohmann::json(nullptr)},
         {"request_rate", std::isfinite(p.request_rate) ? nlohmann::json(p.request_rate) : nlohmann::json(nullptr)},
         {"num_prompts", p.num_prompts}});
  workload["points"] = std::move(points);
  return {{"format", "kiln-bench-serve/1"},
          {"label", cfg.label},
          {"interrupted", r.interrupted},
          {"server",
           {{"base_url", normalize_base_url(cfg.client.base_url)},
            {"model", r.model},
            {"models", r.models},
            {"request_timeout_s", cfg.client.request_timeout_s}}},
          {"workload", std::move(workload)},
          {"cost",
           {{"gpus", cfg.cost.gpus > 0 ? nlohmann::json(cfg.cost.gpus) : nlohmann::json()},
            {"usd_per_gpu_hour", cfg.cost.usd_per_gpu_hour},
            {"power_kw_per_gpu", cfg.cost.kw_per_gpu},
            {"usd_per_kwh", cfg.cost.usd_per_kwh},
            {"pue", cfg.cost.pue}}},
          {"environment", env},
          {"warmup_failed", r.warmup_failed},
          {"summary", std::move(summary)},
          {"requests", std::move(requests)}};
}

std::string chart_title(const BenchConfig& cfg, const BenchResult& r) {
  return cfg.label.empty() ? fmt::format("{} at {}", r.model, normalize_base_url(cfg.client.base_url))
                           : fmt::format("{} ({})", cfg.label, r.model);
}

std::string chart_subtitle(const BenchConfig& cfg, const PromptTokenizer& tok) {
  const WorkloadSpec& w = cfg.workload;
  std::string s = workload_kind_name(w.kind);
  if (w.kind == WorkloadKind::kDataset)
    s += " " + w.dataset_path;
  else
    s += fmt::format(", {} in / {} out tokens", w.input_len, w.output_len);
  if (w.kind == WorkloadKind::kSharedPrefix)
    s += fmt::format(", {} x {}-token prefixes", w.prefix_groups, w.prefix_len);
  s += cfg.cost.gpus > 0 ? fmt::format(", {} GPU(s)", cfg.cost.gpus) : ", accelerators unknown (no --gpus)";
  if (cfg.cost.usd_per_gpu_hour > 0) s += fmt::format(" at ${:.2f}/GPU-hr", cfg.cost.usd_per_gpu_hour);
  if (!tok.exact()) s += ", approximate token counts";
  return s;
}

std::string format_report(const BenchConfig& cfg, const BenchResult& r, const PromptTokenizer& tok) {
  std::vector<PointSummary> sums;
  for (const auto& p : r.points) sums.push_back(p.summary);
  std::string out = fmt::format("{}\n{}{}\n\n", chart_title(cfg, r), chart_subtitle(cfg, tok),
                                r.interrupted ? " (interrupted: partial results)" : "");
  out += format_table(sums);
  if (cfg.workload.kind == WorkloadKind::kLongPrefill)
    for (const auto& s : sums)
      out += fmt::format("\nlong prefill: {} input tokens per request, TTFT mean {:.2f} s, {} prefill tok/s\n",
                         s.completed ? s.total_input_tokens / s.completed : 0, s.ttft_ms.mean / 1000.0,
                         format_figure(s.prefill_tok_s));
  const std::string notes = format_notes(sums);
  if (!notes.empty()) out += "\n" + notes;
  return out;
}

}  // namespace kiln::bench
