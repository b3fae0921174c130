// When each request of a sweep point is sent. With a request rate the gaps are Poisson
// (burstiness 1) or gamma-distributed (burstiness < 1 burstier, > 1 more even), exactly as vLLM's
// `bench serve --request-rate R --burstiness B` draws them; without one every request is ready at
// once and only the concurrency limit paces them.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::bench {

// Send times in seconds from the point's start, non-decreasing, the first at 0. `request_rate` in
// requests per second; infinity (or <= 0) gives all zeros. Same seed, same times.
std::vector<double> arrival_times(int64_t n, double request_rate, double burstiness, uint64_t seed);

}  // namespace kiln::bench
