#include "bench/stats.h"

#include <algorithm>
#include <cmath>

namespace kiln::bench {

double percentile_sorted(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  // numpy "linear": the rank (n - 1) * p / 100, interpolated between its two neighbours.
  const double rank = (static_cast<double>(sorted.size()) - 1.0) * std::clamp(p, 0.0, 100.0) / 100.0;
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Distribution describe(std::vector<double> values) {
  Distribution d;
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.count = static_cast<int64_t>(values.size());
  double sum = 0;
  for (double v : values) sum += v;
  d.mean = sum / static_cast<double>(values.size());
  double sq = 0;
  for (double v : values) sq += (v - d.mean) * (v - d.mean);
  d.stdev = std::sqrt(sq / static_cast<double>(values.size()));
  d.median = percentile_sorted(values, 50);
  d.p90 = percentile_sorted(values, 90);
  d.p99 = percentile_sorted(values, 99);
  d.min = values.front();
  d.max = values.back();
  return d;
}

nlohmann::json to_json(const Distribution& d) {
  return {{"mean", d.mean}, {"median", d.median}, {"p90", d.p90}, {"p99", d.p99},
          {"std", d.stdev}, {"min", d.min},       {"max", d.max}, {"count", d.count}};
}

double peak_window_sum(std::vector<std::pair<double, double>> events, double window_s) {
  if (events.empty()) return 0.0;
  std::sort(events.begin(), events.end());
  // Two pointers: for each event as the window's left edge, add everything before t + window.
  double best = 0, sum = 0;
  size_t hi = 0;
  for (size_t lo = 0; lo < events.size(); ++lo) {
    while (hi < events.size() && events[hi].first < events[lo].first + window_s) sum += events[hi++].second;
    best = std::max(best, sum);
    sum -= events[lo].second;
  }
  return best;
}

}  // namespace kiln::bench
