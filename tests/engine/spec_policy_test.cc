// The speculation policy's decisions on a simulated device (no clock: each step's time comes from
// a cost function, acceptance from a seeded draw): it speculates with a large K where verifying is
// cheap and drafts are good, turns off where they are poor or the batch makes verify rows cost
// like plain ones, re-probes at intervals, lowers K as acceptance falls, and over many devices
// and loads is never measurably slower than plain decoding.
#include "engine/spec_policy.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

namespace kiln {
namespace {

// A device: a plain step's time by batch, a verify step's by batch and drafts (drafting excluded),
// one draft forward's by speculating rows.
struct Device {
  std::function<double(int64_t)> plain;
  std::function<double(int64_t, int64_t)> verify;
  std::function<double(int64_t)> draft;
};

// Decode-bound at small batches (a step costs its weights' bytes, extra rows are almost free):
// verifying is cheap and a draft forward costs a tenth of a step.
Device memory_bound() {
  return {[](int64_t b) { return 1e-3 + 1e-6 * static_cast<double>(b); },
          [](int64_t b, int64_t d) { return 1.05e-3 + 1e-6 * static_cast<double>(b + d); },
          [](int64_t s) { return 1e-4 + 1e-7 * static_cast<double>(s); }};
}

// Compute-bound: every row costs the same, so verifying K drafts costs K + 1 plain rows.
Device compute_bound() {
  return {[](int64_t b) { return 1e-5 * static_cast<double>(b); },
          [](int64_t b, int64_t d) { return 1e-5 * static_cast<double>(b + d) * 1.02; },
          [](int64_t s) { return 2e-6 * static_cast<double>(s); }};
}

SpecPolicyConfig adaptive() {
  SpecPolicyConfig c;
  c.mode = SpecPolicyMode::Adaptive;
  return c;
}

struct Sim {
  Device dev;
  std::vector<double> accept;  // each row's true per-position acceptance
  SpecPolicy policy;
  std::mt19937_64 rng{7};
  std::vector<int64_t> k;
  double seconds = 0, tokens = 0;
  int64_t speculated = 0;

  Sim(Device d, std::vector<double> a, int64_t max_k, SpecPolicyConfig cfg = adaptive())
      : dev(std::move(d)), accept(std::move(a)), policy(cfg, max_k) {}

  void step(int64_t cap) {
    std::vector<SpecPolicy::Row> rows;
    for (size_t i = 0; i < accept.size(); ++i) rows.push_back({i + 1, cap});
    const bool spec = policy.plan(rows, k);
    SpecPolicy::StepSample s;
    s.rows = static_cast<int64_t>(rows.size());
    for (int64_t x : k) s.drafts += x, s.spec_rows += x > 0, s.max_k = std::max(s.max_k, x);
    EXPECT_EQ(spec, s.drafts > 0);
    s.seconds = s.drafts ? dev.verify(s.rows, s.drafts) : dev.plain(s.rows);
    s.draft_seconds = s.drafts ? static_cast<double>(s.max_k) * dev.draft(s.spec_rows) : 0;
    policy.observe(s);
    seconds += s.seconds + s.draft_seconds;
    speculated += spec;
    std::uniform_real_distribution<double> u(0, 1);
    for (size_t i = 0; i < accept.size(); ++i) {
      int64_t m = 0;
      while (m < k[i] && u(rng) < accept[i]) ++m;
      if (k[i] > 0) policy.verified(i + 1, k[i], m);
      tokens += static_cast<double>(1 + m);
    }
  }
  void run(int64_t steps, int64_t cap) {
    for (int64_t i = 0; i < steps; ++i) step(cap);
  }
  double plain_throughput() const {
    const auto b = static_cast<int64_t>(accept.size());
    return static_cast<double>(b) / dev.plain(b);
  }
};

TEST(SpecPolicy, BucketsAreExactSmallAndQuarterOctavesAbove) {
  for (int64_t b = 1; b <= 8; ++b) EXPECT_EQ(StepCostModel::bucket(b), b - 1);
  EXPECT_EQ(StepCostModel::bucket(9), 8);
  EXPECT_EQ(StepCostModel::bucket(10), 8);
  EXPECT_EQ(StepCostModel::bucket(11), 9);
  EXPECT_EQ(StepCostModel::bucket(16), 11);
  EXPECT_EQ(StepCostModel::bucket(17), 12);
  EXPECT_EQ(StepCostModel::bucket(256), 27);
  for (int64_t b = 2; b < 4096; ++b) EXPECT_LE(StepCostModel::bucket(b - 1), StepCostModel::bucket(b));
}

TEST(SpecPolicy, HighAcceptanceAndCheapVerifySpeculateWithTheLargestK) {
  Sim sim(memory_bound(), {0.9}, 6);
  sim.run(400, 6);
  EXPECT_TRUE(sim.policy.stats().speculating);
  EXPECT_EQ(sim.k, std::vector<int64_t>{6});
  EXPECT_GT(sim.policy.stats().expected_speedup, 2.0);
  EXPECT_GT(sim.tokens / sim.seconds, 2.5 * sim.plain_throughput());
  // Plain steps only as probes: the first measurement and a few re-measurements.
  EXPECT_LE(sim.policy.stats().plain_steps, 12);
}

TEST(SpecPolicy, LowAcceptanceTurnsSpeculationOff) {
  Sim sim(memory_bound(), {0.02, 0.05}, 4);
  sim.run(400, 4);
  EXPECT_FALSE(sim.policy.stats().speculating);
  EXPECT_EQ(sim.k, (std::vector<int64_t>{0, 0}));
  EXPECT_LT(sim.policy.acceptance(1), 0.15);
  EXPECT_LE(sim.speculated, 16) << "only the first steps and probes";
  EXPECT_GE(sim.tokens / sim.seconds, 0.97 * sim.plain_throughput());
}

TEST(SpecPolicy, BatchWhereVerifyCostsLikeKPlusOnePlainStepsTurnsItOff) {
  Sim sim(compute_bound(), std::vector<double>(64, 0.8), 4);
  sim.run(600, 4);
  EXPECT_FALSE(sim.policy.stats().speculating);
  EXPECT_LT(sim.policy.stats().expected_speedup, 1.0);
  EXPECT_GE(sim.tokens / sim.seconds, 0.97 * sim.plain_throughput());
}

TEST(SpecPolicy, ReprobesAtDoublingIntervalsAndTurnsBackOnWhenVerifyGetsCheap) {
  SpecPolicyConfig cfg = adaptive();
  cfg.probe_interval = 50;
  cfg.max_probe_interval = 200;
  cfg.probe_steps = 2;
  // Verifying costs like K + 1 plain steps: off after the first measurements.
  Device dev = compute_bound();
  Sim sim(dev, {0.8}, 4, cfg);
  std::vector<int64_t> spec_at;
  for (int64_t i = 0; i < 700; ++i) {
    sim.step(4);
    if (sim.policy.stats().speculating) spec_at.push_back(i);
  }
  // Probes of two steps each, starting 51, 101 and 201 steps apart, then every 201.
  ASSERT_GE(spec_at.size(), 8u);
  std::vector<int64_t> starts;
  for (size_t i = 0; i < spec_at.size(); ++i)
    if (i == 0 || spec_at[i] != spec_at[i - 1] + 1) starts.push_back(spec_at[i]);
  ASSERT_GE(starts.size(), 5u);
  for (size_t i = 1; i < starts.size(); ++i) EXPECT_GT(starts[i] - starts[i - 1], 50) << i;
  EXPECT_GT(starts.back() - starts[starts.size() - 2], 200);
  EXPECT_LE(starts.back() - starts[starts.size() - 2], 203);
  EXPECT_FALSE(sim.policy.stats().speculating);
  // The load changes (a cheap verify now): the next probe measures it and speculation comes back.
  sim.dev = memory_bound();
  sim.run(260, 4);
  EXPECT_TRUE(sim.policy.stats().speculating);
  EXPECT_GT(sim.policy.stats().switches, 0);
}

TEST(SpecPolicy, ComesBackOnWhenTheBatchShrinks) {
  // Compute-bound at 64 rows, memory-bound at 1: the same device, as a real one is.
  Device dev{[](int64_t b) { return 1e-3 + 1e-4 * static_cast<double>(b); },
             [](int64_t b, int64_t d) { return 1.05e-3 + 1e-4 * static_cast<double>(b + d); },
             [](int64_t s) { return 1e-4 + 1e-5 * static_cast<double>(s); }};
  Sim sim(dev, std::vector<double>(64, 0.7), 4);
  sim.run(300, 4);
  EXPECT_FALSE(sim.policy.stats().speculating);
  sim.accept.assign(1, 0.7);
  sim.run(50, 4);
  EXPECT_TRUE(sim.policy.stats().speculating);
  EXPECT_GT(sim.k[0], 1);
}

TEST(SpecPolicy, KFallsAsAcceptanceDrops) {
  // One sequence whose drafts get worse: the K it is given never grows and ends small.
  Device dev{[](int64_t) { return 1e-3; }, [](int64_t, int64_t d) { return 1.05e-3 + 1e-4 * static_cast<double>(d); },
             [](int64_t) { return 5e-5; }};
  Sim sim(dev, {0.95}, 8);
  std::vector<int64_t> ks;
  for (double a : {0.95, 0.85, 0.7, 0.5, 0.3}) {
    sim.accept[0] = a;
    sim.run(150, 8);
    ks.push_back(sim.k[0]);
  }
  for (size_t i = 1; i < ks.size(); ++i) EXPECT_LE(ks[i], ks[i - 1]) << "at step " << i;
  EXPECT_EQ(ks.front(), 8);
  EXPECT_LT(ks.back(), 3);
  // In one batch: better drafters get more drafts.
  Sim mixed(dev, {0.95, 0.7, 0.4, 0.1}, 8);
  mixed.run(200, 8);
  EXPECT_TRUE(mixed.policy.stats().speculating);
  for (size_t i = 1; i < 4; ++i) EXPECT_LE(mixed.k[i], mixed.k[i - 1]);
  EXPECT_GT(mixed.k[0], mixed.k[3]);
}

TEST(SpecPolicy, FixedVerifiesEveryRowsCap) {
  SpecPolicyConfig cfg;  // fixed
  SpecPolicy p(cfg, 4);
  std::vector<SpecPolicy::Row> rows{{1, 4}, {2, 0}, {3, 2}};
  std::vector<int64_t> k;
  EXPECT_TRUE(p.plan(rows, k));
  EXPECT_EQ(k, (std::vector<int64_t>{4, 0, 2}));
  rows = {{1, 0}};
  EXPECT_FALSE(p.plan(rows, k));
  EXPECT_EQ(k, std::vector<int64_t>{0});
}

TEST(SpecPolicy, NeverMeasurablySlowerThanPlainOverDevicesAndLoads) {
  // Plain-decoding throughput against the adaptive policy's over a grid of drafters, batches and
  // devices: at least 0.97x plain everywhere (the probing overhead), and well above where
  // speculation pays.
  for (const Device& dev : {memory_bound(), compute_bound()})
    for (double a : {0.0, 0.3, 0.6, 0.9})
      for (int64_t b : {1, 4, 16, 64}) {
        Sim sim(dev, std::vector<double>(static_cast<size_t>(b), a), 4);
        sim.run(200, 4);  // learning
        sim.seconds = sim.tokens = 0;
        sim.run(1500, 4);
        const double ratio = sim.tokens / sim.seconds / sim.plain_throughput();
        EXPECT_GE(ratio, 0.97) << "acceptance " << a << " batch " << b;
        const bool memory = dev.plain(1) > 5e-4;
        if (memory && a >= 0.6 && b <= 16) {
          EXPECT_GT(ratio, 1.3) << "acceptance " << a << " batch " << b;
        }
      }
}

TEST(SpecPolicy, TableFileSeedsTheModelAndRoundTrips) {
  const auto path =
      (std::filesystem::temp_directory_path() / ("kiln_spec_policy_table_" + std::to_string(::getpid()) + ".json"))
          .string();
  {
    std::ofstream f(path);
    f << R"({"plain": [{"rows": 4, "seconds": 0.001}],
             "verify": [{"rows": 4, "drafts_per_row": 2, "seconds": 0.003}],
             "draft": [{"rows": 4, "seconds": 0.0005}]})";
  }
  SpecPolicyConfig cfg = adaptive();
  cfg.table_path = path;
  cfg.measure = false;
  SpecPolicy p(cfg, 4);
  const StepCostModel& c = p.costs();
  EXPECT_TRUE(c.has_plain(4));
  EXPECT_TRUE(c.has_verify(4));
  EXPECT_DOUBLE_EQ(c.plain(4), 0.001);
  EXPECT_DOUBLE_EQ(c.verify(4, 2), 0.003);
  EXPECT_DOUBLE_EQ(c.draft(4), 0.0005);
  // Elsewhere: the nearest bucket's times and ratio.
  EXPECT_DOUBLE_EQ(c.plain(3), 0.001);
  EXPECT_NEAR(c.verify(3, 2) / c.plain(3), 3.0, 1e-9);
  // A verify step 3x plain for 2 drafts at 0.6 acceptance (1.96 tokens): off.
  std::vector<SpecPolicy::Row> rows(4, {0, 2});
  for (int i = 0; i < 4; ++i) rows[i].id = i + 1;
  std::vector<int64_t> k;
  EXPECT_FALSE(p.plan(rows, k));
  const std::string json = c.to_json();
  std::ofstream(path) << json;
  StepCostModel reloaded(cfg, 4);
  EXPECT_EQ(reloaded.to_json(), json);
  std::filesystem::remove(path);
}

// A bucket where only verify steps were timed (its plain mode never probed, its drafts timed at
// the drafting rows' own bucket) keeps its batch size in the learned table: reloaded, the times
// land in the same bucket, not at one row.
TEST(SpecPolicy, VerifyOnlyBucketRoundTripsToItsOwnBatch) {
  StepCostModel c(adaptive(), 4);
  c.add_verify(10, 2, 0.01);
  c.add_draft(6, 0.001);
  const auto path = (std::filesystem::temp_directory_path() /
                     ("kiln_spec_policy_verify_only_" + std::to_string(::getpid()) + ".json"))
                        .string();
  std::ofstream(path) << c.to_json();
  SpecPolicyConfig cfg = adaptive();
  cfg.table_path = path;
  StepCostModel reloaded(cfg, 4);
  std::filesystem::remove(path);
  EXPECT_TRUE(reloaded.has_verify(10)) << c.to_json();
  EXPECT_FALSE(reloaded.has_verify(1)) << c.to_json();
  EXPECT_EQ(reloaded.to_json(), c.to_json());
}

// A table entry the model cannot use is refused by name: a zero time would divide the
// throughputs by zero (every decision NaN), a negative one or a batch of no rows is no step.
TEST(SpecPolicy, BadTableEntriesAreRefused) {
  const auto path =
      (std::filesystem::temp_directory_path() / ("kiln_spec_policy_bad_" + std::to_string(::getpid()) + ".json"))
          .string();
  SpecPolicyConfig cfg = adaptive();
  cfg.table_path = path;
  for (const char* bad : {R"({"plain": [{"rows": 4, "seconds": 0}]})", R"({"plain": [{"rows": 4, "seconds": -1}]})",
                          R"({"plain": [{"rows": 0, "seconds": 0.001}]})",
                          R"({"verify": [{"rows": 4, "drafts_per_row": -2, "seconds": 0.001}]})",
                          R"({"draft": [{"rows": -3, "seconds": 0.001}]})"}) {
    std::ofstream(path) << bad;
    EXPECT_THROW(
        {
          try {
            StepCostModel c(cfg, 4);
          } catch (const std::exception& e) {
            EXPECT_NE(std::string(e.what()).find("bad step-time table"), std::string::npos) << e.what();
            throw;
          }
        },
        std::exception)
        << bad;
  }
  std::filesystem::remove(path);
}

TEST(SpecPolicy, PriorAloneDerivesTheMissingMode) {
  StepCostModel c(adaptive(), 4);
  EXPECT_DOUBLE_EQ(c.plain(1), 1.0);  // nothing measured: relative units
  EXPECT_NEAR(c.verify(1, 2), 1.3, 1e-12);
  c.add_verify(2, 2, 0.013);  // a verify step measured: plain follows through the prior's ratio
  EXPECT_NEAR(c.plain(2), 0.01, 1e-12);
  c.add_plain(2, 0.005);  // both measured: the measured ratio (2.6) carries to other batches
  EXPECT_NEAR(c.verify(1, 2) / c.plain(1), 2.6, 1e-9);
  // A batch far above every measured one: the nearest measured bucket's times.
  EXPECT_NEAR(c.plain(200), 0.005, 1e-12);
  EXPECT_NEAR(c.verify(200, 2) / c.plain(200), 2.6, 1e-9);
  EXPECT_THROW(parse_spec_policy_mode("sometimes"), std::exception);
  EXPECT_EQ(parse_spec_policy_mode("adaptive"), SpecPolicyMode::Adaptive);
}

}  // namespace
}  // namespace kiln
