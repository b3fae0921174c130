// Standalone SVG charts. The throughput-interactivity chart of a sweep: tok/s per user (per-stream
// decode speed, x) against output tok/s per GPU (y), one point per sweep point, the Pareto front
// (points no other point beats on both axes) drawn as a line and filled. And bars of figures as
// fractions of their ceilings (kiln-gpu-bench's results, bench/gpu_chart.h).
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "bench/metrics.h"

namespace kiln::bench {

// Indices of the points on the Pareto front (higher is better on both axes), by ascending x.
// Points with a zero on either axis (nothing completed) are never on it.
std::vector<size_t> pareto_front(const std::vector<double>& x, const std::vector<double>& y);

// `title` is escaped; one line of subtitle under it (the workload, the engine label).
std::string render_chart(const std::vector<PointSummary>& points, const std::string& title,
                         const std::string& subtitle);

// One figure: `fraction` of its ceiling (0.5 = 50%), `value` the absolute figure beside the bar,
// `target` the fraction it is meant to reach (NaN: none).
struct ResultBar {
  std::string group, label, value;
  double fraction = 0;
  double target = std::numeric_limits<double>::quiet_NaN();
};

// Horizontal bars grouped under their headings in the order given, the x axis in percent (at least
// 0-100%); a bar with a target is green at or past it, orange short of it, and the target a tick.
std::string render_bars(const std::vector<ResultBar>& bars, const std::string& title, const std::string& subtitle);

}  // namespace kiln::bench
