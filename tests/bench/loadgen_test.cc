// The load generator holds a thousand concurrent SSE streams on its one thread. This checks that it
// does (every stream completes, all were open at once, every token arrived) and prints the rate;
// the figure itself is a benchmark, recorded in docs/results.md, not asserted here.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cstdio>

#include "bench/client.h"
#include "bench/metrics.h"
#include "fake_server.h"

namespace kiln::bench {
namespace {

TEST(BenchLoadGen, AThousandConcurrentStreams) {
  // Two ends of 1000 connections live in this process.
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < 2200) GTEST_SKIP() << "needs 2200 file descriptors, the hard limit is " << lim.rlim_max;

  constexpr int64_t kStreams = 1000, kTokens = 40;
  // 1000 streams at 20 tok/s each: 20,000 tok/s when the client keeps up.
  test::FakeServer server({.ttft_ms = 50, .itl_ms = 50});
  auto tok = make_approximate_tokenizer();
  WorkloadSpec spec;
  spec.input_len = 16;
  spec.output_len = kTokens;
  ClientConfig cfg;
  cfg.base_url = server.url();
  cfg.model = "fake-model";
  cfg.request_timeout_s = 120;
  RunOptions opt;
  opt.max_concurrency = kStreams;
  RunResult r = run_requests(cfg, Workload(spec, *tok).take(kStreams), opt);
  count_tokens(r.records, nullptr);
  PointSummary s = summarize(r.records, r.duration_s, CostSpec{}, r.max_in_flight, r.client_cpu_s);
  EXPECT_EQ(s.completed, kStreams) << (s.errors.empty() ? "" : s.errors.begin()->first);
  EXPECT_EQ(s.total_output_tokens, kStreams * kTokens);
  EXPECT_EQ(r.max_in_flight, kStreams);
  EXPECT_EQ(server.max_open_streams(), kStreams);
  std::printf(
      "load generator: %lld streams, %lld tokens in %.2f s: %.0f output tok/s (peak %.0f in 1 s), TPOT mean %.1f ms "
      "(programmed 50), TTFT p99 %.1f ms, client CPU %.2f s (%.0f%% of a core)\n",
      static_cast<long long>(kStreams), static_cast<long long>(s.total_output_tokens), s.duration_s, s.output_tok_s,
      s.peak_output_tok_s, s.tpot_ms.mean, s.ttft_ms.p99, s.client_cpu_s, s.client_cpu_utilization * 100);
}

}  // namespace
}  // namespace kiln::bench
