// The sweep table printed on stdout: one row per sweep point, Markdown so that it pastes into docs.
// Columns follow the published comparison tables (per-stream decode tok/s, aggregate tok/s, per
// GPU, per $/GPU-hour) plus what their critics asked for: $ per million output tokens, and with a
// power figure joules per token and a total cost that includes electricity and PUE.
#pragma once

#include <string>
#include <vector>

#include "bench/metrics.h"

namespace kiln::bench {

// A figure with as many decimals as its size deserves: 3+ significant digits, none past the point
// from 100 up (952 -> "952", 31.125 -> "31.1", 7.32 -> "7.32").
std::string format_figure(double v);

std::string format_table(const std::vector<PointSummary>& points);

// A few lines under the table: failures by kind with an example, and a warning when the load
// generator itself ran near one full core (its figures may then be its own limit, not the server's).
std::string format_notes(const std::vector<PointSummary>& points);

}  // namespace kiln::bench
