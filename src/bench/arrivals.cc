#include "bench/arrivals.h"

#include <cmath>
#include <random>

#include "core/error.h"

namespace kiln::bench {

std::vector<double> arrival_times(int64_t n, double request_rate, double burstiness, uint64_t seed) {
  std::vector<double> t(static_cast<size_t>(std::max<int64_t>(n, 0)), 0.0);
  if (!(request_rate > 0) || std::isinf(request_rate)) return t;
  KILN_CHECK(burstiness > 0, "--burstiness must be positive, got {}", burstiness);
  // Gamma(shape = burstiness, scale = 1 / (rate * burstiness)) has mean 1 / rate whatever the
  // burstiness; shape 1 is the exponential, i.e. a Poisson process.
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (request_rate * burstiness));
  for (size_t i = 1; i < t.size(); ++i) t[i] = t[i - 1] + gap(rng);
  return t;
}

}  // namespace kiln::bench
