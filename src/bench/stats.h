// Summary statistics for benchmark samples, defined as vLLM's `bench serve` and SGLang's
// bench_serving define them (numpy's mean, median and linearly interpolated percentiles), so a
// figure from Kiln compares with a figure from those tools on the same samples.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <utility>
#include <vector>

namespace kiln::bench {

// Mean, median, p90 and p99 of a set of samples, in the samples' unit (ms for latencies).
struct Distribution {
  int64_t count = 0;
  double mean = 0, median = 0, p90 = 0, p99 = 0;
  double stdev = 0;  // population standard deviation (numpy's default, as vLLM reports it)
  double min = 0, max = 0;
};

// numpy.percentile(sorted, p) with the default "linear" method; `sorted` ascending, p in [0, 100].
// 0 for an empty set.
double percentile_sorted(const std::vector<double>& sorted, double p);

// All of Distribution over `values` (taken by value: sorted in place).
Distribution describe(std::vector<double> values);

// {"mean", "median", "p90", "p99", "std", "min", "max", "count"}.
nlohmann::json to_json(const Distribution& d);

// The largest sum of weights whose times fall in any window [t, t + window_s): the busiest stretch
// of a run. `events` are (time_s, weight) pairs in any order; taken by value (sorted in place).
// With a 1 s window and weights in tokens this is the peak output tok/s.
double peak_window_sum(std::vector<std::pair<double, double>> events, double window_s);

}  // namespace kiln::bench
