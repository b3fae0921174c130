// Integer settings of the CUDA backend read from the environment (the diagnostics and A/B switches
// listed in docs/benchmarking.md). Most callers read theirs once per process into a static; the
// prefill attention's, the MoE prefill thresholds, KILN_MOE_WGMMA_WEIGHT_MAJOR_MAX,
// KILN_MOE_SHARED_BESIDE and KILN_MOE_DOWN_OUTPUTS are read on every call, so tests can vary them.
#pragma once

#include <cstdint>
#include <cstdlib>

namespace kiln::ops::cuda {

// The value of `name` as an integer clamped to [lo, hi], or `fallback` when unset or empty.
inline int64_t env_int(const char* name, int64_t fallback, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  const long long n = std::atoll(v);
  return n < lo ? lo : n > hi ? hi : n;
}

}  // namespace kiln::ops::cuda
