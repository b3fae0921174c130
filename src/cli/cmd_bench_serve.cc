// `kiln bench serve --base-url URL [--input-len 1024 --output-len 400] [--concurrency 1,4,16,..]
// [--num-prompts N] [--gpus N --gpu-price USD_PER_GPU_HOUR] [--out FILE.json]` and more: measures
// any OpenAI-compatible server (Kiln, vLLM, SGLang, llama.cpp) the same way. The work is in
// src/bench; this file maps flags onto it, handles Ctrl-C and writes the files.
#include <nlohmann/json.hpp>

#include <sys/resource.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "bench/client.h"
#include "bench/prompt_tokenizer.h"
#include "bench/svg.h"
#include "bench/sweep.h"
#include "cli/command.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/log.h"

namespace kiln::cli {
namespace {

struct BenchServeArgs {
  std::string base_url, endpoint = "completions", model, api_key, label;
  std::string workload = "random", dataset, tokenizer;
  int64_t input_len = 1024, output_len = 400, prefix_groups = 4, prefix_len = 512;
  double range_ratio = 0;
  std::string concurrency, request_rate;
  int64_t num_prompts = 0, warmup = 1;
  double burstiness = 1.0;
  uint64_t seed = 0;
  bool ignore_eos = true, no_progress = false;
  double temperature = 0, request_timeout = 600;
  std::string extra_body;
  int64_t gpus = 0;  // 0: not given; a server's accelerators are unknown to its client
  double gpu_price = 0, power_kw = 0, usd_per_kwh = 0, pue = 1.0;
  std::string out, svg;
  CLI::Option *output_len_opt = nullptr, *num_prompts_opt = nullptr, *gpus_opt = nullptr;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::vector<int64_t> parse_concurrency(const std::string& s) {
  std::vector<int64_t> out;
  for (const auto& item : split_list(s)) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KILN_CHECK(used == item.size() && v >= 1, "--concurrency {}: expected positive integers like 1,4,16", s);
    out.push_back(v);
  }
  return out;
}

std::vector<double> parse_rates(const std::string& s) {
  std::vector<double> out;
  for (const auto& item : split_list(s)) {
    if (item == "inf") {
      out.push_back(INFINITY);
      continue;
    }
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KILN_CHECK(used == item.size() && v > 0, "--request-rate {}: expected positive numbers or inf, like 1,2.5,inf", s);
    out.push_back(v);
  }
  return out;
}

std::vector<std::string> own_argv() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  for (std::string a; std::getline(f, a, '\0');) argv.push_back(a);
  return argv;
}

extern "C" void on_stop_signal(int) {
  bench::request_stop();
}

// A thousand streams need a thousand sockets: lift the soft descriptor limit to the hard one.
void raise_fd_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

int run_bench_serve(const BenchServeArgs& a) {
  KILN_CHECK(!a.base_url.empty(), "--base-url URL is required (e.g. http://127.0.0.1:8000)");
  bench::BenchConfig cfg;
  cfg.client.base_url = a.base_url;
  cfg.client.endpoint = a.endpoint;
  (void)bench::endpoint_path(cfg.client);  // validates --endpoint before anything runs
  cfg.client.model = a.model;
  cfg.client.api_key = a.api_key;
  if (cfg.client.api_key.empty())
    if (const char* k = std::getenv("OPENAI_API_KEY")) cfg.client.api_key = k;
  cfg.client.ignore_eos = a.ignore_eos;
  cfg.client.temperature = a.temperature;
  KILN_CHECK(a.request_timeout > 0, "--request-timeout must be positive, got {}", a.request_timeout);
  cfg.client.request_timeout_s = a.request_timeout;
  if (!a.extra_body.empty()) {
    cfg.client.extra_body = nlohmann::json::parse(a.extra_body, nullptr, /*allow_exceptions=*/false);
    KILN_CHECK(cfg.client.extra_body.is_object(), "--extra-body {}: expected a JSON object", a.extra_body);
  }

  cfg.workload.kind = bench::parse_workload_kind(a.workload);
  const bool long_prefill = cfg.workload.kind == bench::WorkloadKind::kLongPrefill;
  cfg.workload.input_len = a.input_len;
  // A long prefill measures the prompt: one output token unless asked otherwise.
  cfg.workload.output_len = long_prefill && a.output_len_opt->count() == 0 ? 1 : a.output_len;
  cfg.workload.range_ratio = a.range_ratio;
  cfg.workload.dataset_path = a.dataset;
  cfg.workload.output_len_from_dataset = a.output_len_opt->count() == 0;
  cfg.workload.prefix_groups = a.prefix_groups;
  cfg.workload.prefix_len = a.prefix_len;
  cfg.workload.seed = a.seed;
  if (cfg.workload.kind == bench::WorkloadKind::kDataset)
    KILN_CHECK(!a.dataset.empty(), "--workload dataset needs --dataset FILE");

  std::vector<double> rates = a.request_rate.empty() ? std::vector<double>{INFINITY} : parse_rates(a.request_rate);
  std::vector<int64_t> concs;
  if (!a.concurrency.empty())
    concs = parse_concurrency(a.concurrency);
  else
    concs = {a.request_rate.empty() ? 1 : 0};  // with a request rate, no concurrency limit unless asked
  KILN_CHECK(a.num_prompts_opt->count() == 0 || a.num_prompts > 0, "--num-prompts must be positive, got {}",
             a.num_prompts);
  for (double rate : rates)
    for (int64_t c : concs) {
      KILN_CHECK(c > 0 || std::isfinite(rate), "a sweep point needs a concurrency limit or a finite request rate");
      bench::SweepPointSpec p{c, rate, a.num_prompts};
      if (a.num_prompts_opt->count() == 0) {
        // Enough requests that the steady state dominates: four waves at a concurrency limit, 30 s
        // of arrivals at a rate; one at a time for a long prefill.
        p.num_prompts = long_prefill ? 1
                        : c > 0      ? std::max<int64_t>(10, 4 * c)
                                     : std::max<int64_t>(10, static_cast<int64_t>(std::ceil(30 * rate)));
      }
      cfg.points.push_back(p);
    }
  KILN_CHECK(a.warmup >= 0, "--warmup must be >= 0, got {}", a.warmup);
  cfg.warmup = a.warmup;
  cfg.burstiness = a.burstiness;
  KILN_CHECK(a.gpus_opt->count() == 0 || a.gpus >= 1, "--gpus must be at least 1, got {}", a.gpus);
  KILN_CHECK(a.gpu_price >= 0, "--gpu-price must be >= 0, got {}", a.gpu_price);
  KILN_CHECK(a.power_kw >= 0, "--power-kw-per-gpu must be >= 0, got {}", a.power_kw);
  KILN_CHECK(a.usd_per_kwh >= 0, "--usd-per-kwh must be >= 0, got {}", a.usd_per_kwh);
  KILN_CHECK(a.pue >= 1.0, "--pue must be >= 1, got {}", a.pue);
  // Prices and power are per GPU: without the count they would be guesses.
  KILN_CHECK(a.gpus > 0 || (a.gpu_price == 0 && a.power_kw == 0),
             "--gpu-price and --power-kw-per-gpu are per GPU: give --gpus N too (the GPUs behind the server)");
  cfg.cost = {a.gpus, a.gpu_price, a.power_kw, a.usd_per_kwh, a.pue};
  cfg.label = a.label;
  cfg.progress = !a.no_progress;
  // The outputs are checked before the run, not after it: a run can take hours.
  std::string svg = a.svg;
  if (svg.empty() && !a.out.empty()) svg = std::filesystem::path(a.out).replace_extension(".svg").string();
  if (!a.out.empty()) require_output_file(a.out, "--out", {a.dataset, a.tokenizer});
  if (!svg.empty()) require_output_file(svg, a.svg.empty() ? "--out's chart" : "--svg", {a.dataset, a.tokenizer});
  KILN_CHECK(a.out.empty() || std::filesystem::weakly_canonical(svg) != std::filesystem::weakly_canonical(a.out),
             "--out {}: the chart goes beside the JSON report with .svg; give the report another name (or --svg)",
             a.out);

  std::unique_ptr<bench::PromptTokenizer> tok =
      a.tokenizer.empty() ? bench::make_approximate_tokenizer() : bench::load_prompt_tokenizer(a.tokenizer);
  if (a.tokenizer.empty())
    spdlog::info("no --tokenizer: prompt lengths and fallback counts are approximate (4 bytes per token)");
  raise_fd_limit();

  // Ctrl-C (or SIGTERM) stops the run and still writes what was measured; a second one kills.
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESETHAND;
  struct sigaction old_int {
  }, old_term{};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  bench::BenchResult r = bench::run_bench(cfg, *tok);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);

  std::printf("%s", bench::format_report(cfg, r, *tok).c_str());
  std::fflush(stdout);
  if (!a.out.empty()) {
    std::ofstream f(a.out);
    KILN_CHECK(f.good(), "--out {}: cannot write the file", a.out);
    f << bench::bench_json(cfg, r, *tok, bench::environment(own_argv())).dump(1) << "\n";
    spdlog::info("wrote {}", a.out);
  }
  if (!svg.empty()) {
    std::vector<bench::PointSummary> sums;
    for (const auto& p : r.points) sums.push_back(p.summary);
    std::ofstream f(svg);
    KILN_CHECK(f.good(), "--svg {}: cannot write the file", svg);
    f << bench::render_chart(sums, bench::chart_title(cfg, r), bench::chart_subtitle(cfg, *tok));
    spdlog::info("wrote {}", svg);
  }
  if (r.interrupted) return 130;
  int64_t completed = 0;
  for (const auto& p : r.points) completed += p.summary.completed;
  return completed > 0 ? 0 : 1;
}

KILN_SUBCOMMAND(
    "bench", "serve", "Benchmark any OpenAI-compatible server: latency, throughput, cost", [](CLI::App& sub) {
      auto a = std::make_shared<BenchServeArgs>();
      sub.add_option("--base-url", a->base_url, "server URL, e.g. http://127.0.0.1:8000 (with or without /v1)")
          ->required();
      sub.add_option("--endpoint", a->endpoint, "completions (/v1/completions) or chat (/v1/chat/completions)")
          ->capture_default_str();
      sub.add_option("--model", a->model, "model name to send (default: the first of /v1/models)");
      sub.add_option("--api-key", a->api_key, "bearer token (default: $OPENAI_API_KEY)");
      sub.add_option("--label", a->label, "names the deployment in the table, JSON and chart");
      sub.add_option("--workload", a->workload, "random, dataset, shared-prefix or long-prefill")
          ->capture_default_str();
      sub.add_option("--dataset", a->dataset, "dataset workload: ShareGPT-style JSON or JSONL file");
      sub.add_option("--tokenizer", a->tokenizer,
                     "checkpoint dir whose tokenizer makes prompt lengths exact (default: approximate)");
      sub.add_option("--input-len", a->input_len, "input tokens per prompt (question tokens for shared-prefix)")
          ->capture_default_str();
      a->output_len_opt =
          sub.add_option("--output-len", a->output_len, "output tokens per request")->capture_default_str();
      sub.add_option("--range-ratio", a->range_ratio, "lengths uniform in len*[1-r, 1+r]")->capture_default_str();
      sub.add_option("--prefix-groups", a->prefix_groups, "shared-prefix: number of system prompts")
          ->capture_default_str();
      sub.add_option("--prefix-len", a->prefix_len, "shared-prefix: tokens per system prompt")->capture_default_str();
      sub.add_option("--concurrency", a->concurrency, "sweep of concurrency limits, e.g. 1,4,16,64 (default 1)");
      sub.add_option("--request-rate", a->request_rate, "Poisson arrival rates in req/s, e.g. 2,8,inf (default inf)");
      sub.add_option("--burstiness", a->burstiness, "gamma shape of arrival gaps: 1 Poisson, <1 burstier")
          ->capture_default_str();
      a->num_prompts_opt = sub.add_option("--num-prompts", a->num_prompts,
                                          "requests per sweep point (default: max(10, 4 x concurrency))");
      sub.add_option("--warmup", a->warmup, "requests sent before measuring")->capture_default_str();
      sub.add_option("--seed", a->seed, "workload and arrival seed")->capture_default_str();
      sub.add_flag("--ignore-eos,!--no-ignore-eos", a->ignore_eos, "ask for exactly --output-len tokens (default on)");
      sub.add_option("--temperature", a->temperature, "sampling temperature")->capture_default_str();
      sub.add_option("--extra-body", a->extra_body, "JSON object merged into every request body");
      sub.add_option("--request-timeout", a->request_timeout, "seconds before a request counts as timed out")
          ->capture_default_str();
      a->gpus_opt = sub.add_option("--gpus", a->gpus,
                                   "GPUs behind the server, for the per-GPU and cost columns (default: unknown, "
                                   "no per-GPU figures)");
      sub.add_option("--gpu-price", a->gpu_price, "USD per GPU-hour, for the cost columns (needs --gpus)");
      sub.add_option("--power-kw-per-gpu", a->power_kw,
                     "board power per GPU in kW, for J/token and power cost (needs --gpus)");
      sub.add_option("--usd-per-kwh", a->usd_per_kwh, "electricity price");
      sub.add_option("--pue", a->pue, "power usage effectiveness (facility / IT power)")->capture_default_str();
      sub.add_option("--out", a->out, "write the JSON results here (and the chart next to it as .svg)");
      sub.add_option("--svg", a->svg, "write the chart here (default: --out with .svg)");
      sub.add_flag("--no-progress", a->no_progress, "no progress bar");
      return [a] { return run_bench_serve(*a); };
    });

}  // namespace
}  // namespace kiln::cli
