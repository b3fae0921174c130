// Throughput and cost arithmetic, the one place for it: the planner's ceilings and `kiln bench
// serve`'s measurements go through these same functions, so a measured figure and its ceiling are
// always computed alike. Pure functions over plain numbers; units are in the names.
//
// Conventions: "tokens" are whatever the caller counts (output tokens for serving figures); a price
// is US dollars per GPU-hour; power is watts per GPU at the wall of the board; PUE multiplies IT
// power into facility power.
#pragma once

#include <cstdint>

namespace kiln::bench {

inline constexpr double kSecondsPerHour = 3600.0;

// Throughput of one GPU when `gpus` GPUs together deliver `tok_s`.
constexpr double tok_s_per_gpu(double tok_s, int64_t gpus) {
  return gpus > 0 ? tok_s / static_cast<double>(gpus) : 0.0;
}

// Tokens per second per GPU, per dollar of GPU-hour price: the figure that compares a cheap slow
// GPU with a dear fast one ("tok/s per $/GPU-hr").
constexpr double tok_s_per_usd_gpu_hour(double tok_s, int64_t gpus, double usd_per_gpu_hour) {
  return usd_per_gpu_hour > 0 ? tok_s_per_gpu(tok_s, gpus) / usd_per_gpu_hour : 0.0;
}

// Dollars per hour for the whole deployment at the GPU-hour price.
constexpr double usd_per_hour(int64_t gpus, double usd_per_gpu_hour) {
  return static_cast<double>(gpus) * usd_per_gpu_hour;
}

// Dollars per million tokens: the hourly price over the tokens made in that hour.
constexpr double usd_per_million_tokens(double tok_s, int64_t gpus, double usd_per_gpu_hour) {
  return tok_s > 0 ? usd_per_hour(gpus, usd_per_gpu_hour) / (tok_s * kSecondsPerHour) * 1e6 : 0.0;
}

// Facility watts of `gpus` boards drawing `watts_per_gpu` each, at power usage effectiveness `pue`.
constexpr double facility_watts(int64_t gpus, double watts_per_gpu, double pue = 1.0) {
  return static_cast<double>(gpus) * watts_per_gpu * pue;
}

// Energy per token in joules (W = J/s, divided by tok/s).
constexpr double joules_per_token(double tok_s, int64_t gpus, double watts_per_gpu, double pue = 1.0) {
  return tok_s > 0 ? facility_watts(gpus, watts_per_gpu, pue) / tok_s : 0.0;
}

struct CostInputs {
  int64_t gpus = 1;
  double usd_per_gpu_hour = 0;  // rental or amortised hardware price
  double watts_per_gpu = 0;     // board power while serving
  double pue = 1.0;             // facility overhead multiplier on power
  double usd_per_kwh = 0;       // electricity price; 0 when the GPU-hour price already includes power
};

struct CostBreakdown {
  double gpu_usd = 0;     // GPU-hours x price
  double energy_kwh = 0;  // facility energy
  double power_usd = 0;   // energy x electricity price
  double total_usd = 0;
};

// Cost of running the deployment for `seconds`.
constexpr CostBreakdown total_cost(const CostInputs& in, double seconds) {
  CostBreakdown c;
  const double hours = seconds / kSecondsPerHour;
  c.gpu_usd = usd_per_hour(in.gpus, in.usd_per_gpu_hour) * hours;
  c.energy_kwh = facility_watts(in.gpus, in.watts_per_gpu, in.pue) * hours / 1000.0;
  c.power_usd = c.energy_kwh * in.usd_per_kwh;
  c.total_usd = c.gpu_usd + c.power_usd;
  return c;
}

// Dollars per million tokens with power and PUE included (total_cost over one hour).
constexpr double usd_per_million_tokens(double tok_s, const CostInputs& in) {
  return tok_s > 0 ? total_cost(in, kSecondsPerHour).total_usd / (tok_s * kSecondsPerHour) * 1e6 : 0.0;
}

}  // namespace kiln::bench
