// The /metrics text from an engine snapshot: the KV block gauges a capacity dashboard reads.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>

#include "server/metrics.h"

namespace kiln::server {
namespace {

// The value of an unlabelled series in Prometheus text; NaN when it is missing.
double series(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  return std::nan("");
}

// Free means allocatable now: a prefix-cache block no request holds counts as free (the scheduler
// evicts it on demand), one a running request locks does not.
TEST(Metrics, FreeKvBlocksIncludeEvictableCachedBlocks) {
  EngineStats s;
  s.blocks_total = 100;
  s.blocks_free = 60;              // on the allocator's free list
  s.blocks_cached = 30;            // held by the prefix cache ...
  s.blocks_cached_evictable = 25;  // ... of which no request holds 25
  const std::string text = Metrics().render(s, "m");
  EXPECT_EQ(series(text, "kiln_kv_blocks_total"), 100);
  EXPECT_EQ(series(text, "kiln_kv_blocks_free"), 85);
  EXPECT_EQ(series(text, "kiln_kv_blocks_used"), 15);
  EXPECT_EQ(series(text, "kiln_kv_blocks_cached"), 30);
  EXPECT_EQ(series(text, "kiln_kv_blocks_cached_evictable"), 25);
}

// What the speculation policy decided: its last step (on or off, drafts per row) and its counts.
TEST(Metrics, SpeculationPolicyDecisions) {
  EngineStats s;
  s.spec.policy.speculate_steps = 7;
  s.spec.policy.plain_steps = 90;
  s.spec.policy.probe_speculate = 4;
  s.spec.policy.switches = 2;
  s.spec.policy.speculating = false;
  s.spec.policy.expected_speedup = 0.5;
  const std::string text = Metrics().render(s, "m");
  EXPECT_EQ(series(text, "kiln_spec_decode_policy_speculating"), 0);
  EXPECT_EQ(series(text, "kiln_spec_decode_policy_draft_tokens"), 0);
  EXPECT_EQ(series(text, "kiln_spec_decode_policy_expected_speedup"), 0.5);
  EXPECT_EQ(series(text, "kiln_spec_decode_policy_switches_total"), 2);
  EXPECT_EQ(series(text, "kiln_spec_decode_policy_decisions_total{decision=\"plain\"}"), 90);
  EXPECT_EQ(series(text, "kiln_spec_decode_policy_decisions_total{decision=\"probe_speculate\"}"), 4);
}

}  // namespace
}  // namespace kiln::server
