// A benchmark run: warm-up, then each sweep point in turn (a concurrency limit and/or a request
// rate, each with fresh prompts from the workload), then the summaries, the JSON document and the
// chart. `kiln bench serve` is a thin layer of flags over this.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "bench/client.h"
#include "bench/metrics.h"
#include "bench/prompt_tokenizer.h"
#include "bench/workload.h"

namespace kiln::bench {

struct SweepPointSpec {
  int64_t concurrency = 1;                                        // most requests open at once; 0: no limit
  double request_rate = std::numeric_limits<double>::infinity();  // arrivals per second; inf: all at once
  int64_t num_prompts = 10;                                       // requests in the point
};

struct BenchConfig {
  ClientConfig client;
  WorkloadSpec workload;
  std::vector<SweepPointSpec> points;
  int64_t warmup = 1;       // requests sent (and not measured) before the first point
  double burstiness = 1.0;  // gamma shape of the arrival gaps; 1 is Poisson
  CostSpec cost;
  std::string label;  // names the deployment in the table, the JSON and the chart
  bool progress = true;
};

struct PointResult {
  SweepPointSpec spec;
  RunResult run;
  PointSummary summary;
};

struct BenchResult {
  std::vector<PointResult> points;  // the points that ran (all of them unless interrupted)
  nlohmann::json models;            // the server's /v1/models answer
  std::string model;                // the model name sent
  int64_t warmup_failed = 0;
  bool interrupted = false;
};

// Runs the sweep. Fills cfg.client.model from /v1/models when it is empty. Failed requests are
// counted, never thrown; request_stop() ends the run after the current point's open requests are
// cut, keeping what was measured.
BenchResult run_bench(BenchConfig& cfg, const PromptTokenizer& tok);

// The machine that ran the benchmark: host, OS, CPU, cores, memory, HTTP client, time, argv.
nlohmann::json environment(const std::vector<std::string>& argv);

// The whole document written by --out: summary (one object per point), requests (every record),
// workload, server, cost inputs, environment.
nlohmann::json bench_json(const BenchConfig& cfg, const BenchResult& r, const PromptTokenizer& tok,
                          const nlohmann::json& env);

// The text printed on stdout: a header naming server, model and workload, the table, notes.
std::string format_report(const BenchConfig& cfg, const BenchResult& r, const PromptTokenizer& tok);

// Title and subtitle for the chart.
std::string chart_title(const BenchConfig& cfg, const BenchResult& r);
std::string chart_subtitle(const BenchConfig& cfg, const PromptTokenizer& tok);

}  // namespace kiln::bench
