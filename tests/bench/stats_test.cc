// bench/stats.h: numpy-compatible percentiles and the busiest-window peak.
#include <gtest/gtest.h>

#include "bench/stats.h"

namespace kiln::bench {
namespace {

TEST(BenchStats, PercentilesMatchNumpyLinear) {
  // numpy.percentile(range(1, 11), [50, 90, 99]) == [5.5, 9.1, 9.91]
  Distribution d = describe({10, 9, 8, 7, 6, 5, 4, 3, 2, 1});
  EXPECT_DOUBLE_EQ(d.median, 5.5);
  EXPECT_NEAR(d.p90, 9.1, 1e-12);
  EXPECT_NEAR(d.p99, 9.91, 1e-12);
  EXPECT_DOUBLE_EQ(d.mean, 5.5);
  EXPECT_EQ(d.count, 10);
  EXPECT_EQ(d.min, 1);
  EXPECT_EQ(d.max, 10);
  // numpy.std([2, 4, 4, 4, 5, 5, 7, 9]) == 2.0 (population)
  EXPECT_DOUBLE_EQ(describe({2, 4, 4, 4, 5, 5, 7, 9}).stdev, 2.0);
  EXPECT_EQ(describe({}).count, 0);
  EXPECT_EQ(describe({}).p99, 0);
  EXPECT_DOUBLE_EQ(describe({3}).p99, 3);
}

TEST(BenchStats, PeakWindowFindsTheBusiestSecond) {
  // Three events in [0, 1), two in any later window.
  EXPECT_DOUBLE_EQ(peak_window_sum({{2.0, 1}, {0.0, 1}, {0.5, 1}, {0.9, 1}, {1.0, 1}, {1.95, 1}}, 1.0), 3.0);
  // The busiest window need not start at a whole second: [0.6, 1.6) holds 4.
  EXPECT_DOUBLE_EQ(peak_window_sum({{0.0, 1}, {0.6, 1}, {0.8, 1}, {1.2, 1}, {1.5, 1}, {2.7, 1}}, 1.0), 4.0);
  // Weights add (several tokens per chunk).
  EXPECT_DOUBLE_EQ(peak_window_sum({{0.0, 2.5}, {0.1, 2.5}, {3.0, 1}}, 1.0), 5.0);
  EXPECT_EQ(peak_window_sum({}, 1.0), 0.0);
}

}  // namespace
}  // namespace kiln::bench
