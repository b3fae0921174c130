// The throughput-interactivity chart of a sweep as a standalone SVG: tok/s per user (per-stream
// decode speed, x) against output tok/s per GPU (y), one point per sweep point, the Pareto front
// (points no other point beats on both axes) drawn as a line and filled.
#pragma once

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

}  // namespace kiln::bench
