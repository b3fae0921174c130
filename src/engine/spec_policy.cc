#include "engine/spec_policy.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>

#include "core/error.h"
#include "core/log.h"

namespace kiln {

SpecPolicyMode parse_spec_policy_mode(const std::string& s) {
  if (s == "fixed") return SpecPolicyMode::Fixed;
  if (s == "adaptive") return SpecPolicyMode::Adaptive;
  throw Error(fmt::format("unknown --speculative-policy '{}' (fixed or adaptive)", s));
}

const char* to_string(SpecPolicyMode m) {
  return m == SpecPolicyMode::Fixed ? "fixed" : "adaptive";
}

// ---- StepCostModel ----

void StepCostModel::Cell::add(double t_new, double x_new, double decay) {
  if (n == 0) {
    t = t_new, x = x_new;
  } else {
    t = decay * t + (1 - decay) * t_new;
    x = decay * x + (1 - decay) * x_new;
  }
  ++n;
}

StepCostModel::StepCostModel(const SpecPolicyConfig& cfg, int64_t max_k) : cfg_(cfg), max_k_(max_k) {
  KILN_CHECK(max_k >= 1, "speculation policy: K must be >= 1, got {}", max_k);
  if (!cfg.table_path.empty()) load(cfg.table_path);
}

int64_t StepCostModel::bucket(int64_t rows) {
  if (rows <= 8) return std::max<int64_t>(rows, 1) - 1;
  // Above 8 rows, a step's time grows with the batch: quarter octaves keep a bucket's rows within
  // 12% of each other, so one time stands for all of them.
  const auto r = static_cast<uint64_t>(rows - 1);
  const int e = std::bit_width(r) - 1;  // >= 3
  const auto q = static_cast<int64_t>(((r - (uint64_t{1} << e)) * 4) >> e);
  return 8 + (e - 3) * 4 + q;
}

StepCostModel::Bucket& StepCostModel::at(int64_t rows) {
  const auto b = static_cast<size_t>(bucket(rows));
  if (buckets_.size() <= b) buckets_.resize(b + 1);
  if (buckets_[b].verify.empty()) buckets_[b].verify.resize(static_cast<size_t>(max_k_) + 1);
  buckets_[b].rows = rows;
  return buckets_[b];
}

void StepCostModel::add_plain(int64_t rows, double seconds) {
  at(rows).plain.add(seconds, static_cast<double>(rows), cfg_.time_decay);
}

void StepCostModel::add_verify(int64_t rows, double drafts_per_row, double seconds) {
  const auto i = static_cast<size_t>(std::clamp<int64_t>(std::llround(drafts_per_row), 0, max_k_));
  at(rows).verify[i].add(seconds, drafts_per_row, cfg_.time_decay);
}

void StepCostModel::add_draft(int64_t rows, double seconds_per_forward) {
  at(rows).draft.add(seconds_per_forward, static_cast<double>(rows), cfg_.time_decay);
}

bool StepCostModel::has_plain(int64_t rows) const {
  const auto b = static_cast<size_t>(bucket(rows));
  return b < buckets_.size() && buckets_[b].plain.n > 0;
}

bool StepCostModel::has_verify(int64_t rows) const {
  const auto b = static_cast<size_t>(bucket(rows));
  return b < buckets_.size() &&
         std::any_of(buckets_[b].verify.begin(), buckets_[b].verify.end(), [](const Cell& c) { return c.n > 0; });
}

double StepCostModel::prior_ratio(double x) const {
  return 1 + cfg_.prior_serial + cfg_.prior_per_draft * x;
}

double StepCostModel::verify_here(const Bucket& b, double x, double p) const {
  // Piecewise linear through the measured cells (at their mean drafts per row); past the ends,
  // the slope of the last two cells, or the prior's with one.
  std::vector<const Cell*> pts;
  for (const Cell& c : b.verify)
    if (c.n > 0) pts.push_back(&c);
  if (pts.empty()) return p * prior_ratio(x);
  const double prior_slope = p * cfg_.prior_per_draft;
  auto slope = [&](const Cell* u, const Cell* v) {
    return v->x - u->x > 0.25 ? std::max(0.0, (v->t - u->t) / (v->x - u->x)) : prior_slope;
  };
  if (x <= pts.front()->x) {
    const double s = pts.size() > 1 ? slope(pts[0], pts[1]) : prior_slope;
    return std::max(0.0, pts.front()->t - s * (pts.front()->x - x));
  }
  for (size_t i = 1; i < pts.size(); ++i)
    if (x <= pts[i]->x) {
      const Cell *u = pts[i - 1], *v = pts[i];
      const double f = v->x > u->x ? (x - u->x) / (v->x - u->x) : 1.0;
      return u->t + f * (v->t - u->t);
    }
  const double s = pts.size() > 1 ? slope(pts[pts.size() - 2], pts.back()) : prior_slope;
  return pts.back()->t + s * (x - pts.back()->x);
}

double StepCostModel::verify_ratio(int64_t bucket, double x) const {
  // The nearest bucket where both modes are measured says how much dearer verifying is.
  const auto n = static_cast<int64_t>(buckets_.size());
  for (int64_t d = 0; d < std::max(n, bucket + 1); ++d)
    for (const int64_t c : {bucket - d, bucket + d}) {
      if (c < 0 || c >= n) continue;
      const Bucket& b = buckets_[static_cast<size_t>(c)];
      if (b.plain.n == 0 || std::none_of(b.verify.begin(), b.verify.end(), [](const Cell& v) { return v.n > 0; }))
        continue;
      return verify_here(b, x, b.plain.t) / b.plain.t;
    }
  return prior_ratio(x);
}

double StepCostModel::plain(int64_t rows) const {
  const int64_t b = bucket(rows), n = static_cast<int64_t>(buckets_.size());
  // Measured here; else from this bucket's verify steps; else the nearest bucket's.
  for (int64_t d = 0; d < std::max(n, b + 1); ++d)
    for (const int64_t c : {b - d, b + d}) {
      if (c < 0 || c >= n) continue;
      const Bucket& k = buckets_[static_cast<size_t>(c)];
      if (k.plain.n > 0) return k.plain.t;
      double sum = 0;
      int64_t m = 0;
      for (const Cell& v : k.verify)
        if (v.n > 0) sum += v.t / verify_ratio(c, v.x), ++m;
      if (m > 0) return sum / static_cast<double>(m);
    }
  return 1.0;  // nothing measured: only ratios matter
}

double StepCostModel::verify(int64_t rows, double x) const {
  const double p = plain(rows);
  const auto b = static_cast<size_t>(bucket(rows));
  if (b < buckets_.size() && has_verify(rows)) return verify_here(buckets_[b], x, p);
  return p * verify_ratio(bucket(rows), x);
}

double StepCostModel::draft(int64_t rows) const {
  const int64_t b = bucket(rows), n = static_cast<int64_t>(buckets_.size());
  for (int64_t d = 0; d < std::max(n, b + 1); ++d)
    for (const int64_t c : {b - d, b + d}) {
      if (c < 0 || c >= n) continue;
      const Cell& k = buckets_[static_cast<size_t>(c)].draft;
      // Elsewhere, scaled as the target's plain step scales between the two batches.
      if (k.n > 0) return d == 0 ? k.t : k.t * plain(rows) / plain(std::llround(k.x));
    }
  return cfg_.prior_draft * plain(rows);
}

void StepCostModel::load(const std::string& path) {
  std::ifstream f(path);
  KILN_CHECK(f.good(), "speculation policy: cannot read the step-time table {}", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
    // A time of 0 would divide the throughputs by zero; no rows or negative values are no step.
    auto rows = [&](const nlohmann::json& e) {
      const auto r = e.at("rows").get<int64_t>();
      KILN_CHECK(r >= 1, "speculation policy: bad step-time table {}: rows {} (must be >= 1)", path, r);
      return r;
    };
    auto seconds = [&](const nlohmann::json& e) {
      const auto t = e.at("seconds").get<double>();
      KILN_CHECK(std::isfinite(t) && t > 0, "speculation policy: bad step-time table {}: seconds {} (must be > 0)",
                 path, t);
      return t;
    };
    for (const auto& e : j.value("plain", nlohmann::json::array())) add_plain(rows(e), seconds(e));
    for (const auto& e : j.value("verify", nlohmann::json::array())) {
      const auto x = e.at("drafts_per_row").get<double>();
      KILN_CHECK(std::isfinite(x) && x >= 0,
                 "speculation policy: bad step-time table {}: drafts_per_row {} (must be >= 0)", path, x);
      add_verify(rows(e), x, seconds(e));
    }
    for (const auto& e : j.value("draft", nlohmann::json::array())) add_draft(rows(e), seconds(e));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("speculation policy: bad step-time table {}: {}", path, e.what()));
  }
}

std::string StepCostModel::to_json() const {
  nlohmann::json j = {
      {"plain", nlohmann::json::array()}, {"verify", nlohmann::json::array()}, {"draft", nlohmann::json::array()}};
  for (const Bucket& b : buckets_) {
    if (b.plain.n > 0) j["plain"].push_back({{"rows", std::llround(b.plain.x)}, {"seconds", b.plain.t}});
    if (b.draft.n > 0) j["draft"].push_back({{"rows", std::llround(b.draft.x)}, {"seconds", b.draft.t}});
    // The verify cells' rows are the bucket's plain rows where known (cells keep drafts per row),
    // else a batch timed in this bucket: never 0, which would reload them at one row.
    const int64_t rows = b.plain.n > 0 ? std::llround(b.plain.x) : b.rows;
    for (const Cell& v : b.verify)
      if (v.n > 0) j["verify"].push_back({{"rows", rows}, {"drafts_per_row", v.x}, {"seconds", v.t}});
  }
  return j.dump();
}

// ---- SpecPolicy ----

SpecPolicy::SpecPolicy(SpecPolicyConfig cfg, int64_t max_k) : cfg_(std::move(cfg)), max_k_(max_k), costs_(cfg_, max_k) {
  KILN_CHECK(cfg_.probe_interval >= 1 && cfg_.max_probe_interval >= cfg_.probe_interval,
             "speculation policy: probe interval {} must be >= 1 and at most the largest, {}", cfg_.probe_interval,
             cfg_.max_probe_interval);
  KILN_CHECK(cfg_.probe_steps >= 1, "speculation policy: a probe must last >= 1 step, got {}", cfg_.probe_steps);
  KILN_CHECK(cfg_.prior_acceptance >= 0 && cfg_.prior_acceptance <= 1,
             "speculation policy: prior acceptance {} is outside [0, 1]", cfg_.prior_acceptance);
}

// Pseudo-trials of the prior behind the engine-wide estimate, and of the engine-wide estimate
// behind a sequence's: a new sequence starts where the others are, and its own few
// verifications soon outweigh it.
static constexpr double kGlobalPriorTrials = 4, kSeqPriorTrials = 2;

double SpecPolicy::global_acceptance() const {
  return (global_.accepted + kGlobalPriorTrials * cfg_.prior_acceptance) / (global_.trials + kGlobalPriorTrials);
}

double SpecPolicy::acceptance(uint64_t id) const {
  const double g = global_acceptance();
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) return g;
  return (it->second.accepted + kSeqPriorTrials * g) / (it->second.trials + kSeqPriorTrials);
}

void SpecPolicy::verified(uint64_t id, int64_t k, int64_t accepted) {
  if (k <= 0) return;
  // Position-wise trials: each accepted draft is a success, the first rejection (if any) a
  // failure; drafts after it were never tried.
  const double m = static_cast<double>(accepted), t = m + (accepted < k ? 1 : 0);
  Acceptance& s = seqs_[id];
  s.accepted = cfg_.seq_decay * s.accepted + m;
  s.trials = cfg_.seq_decay * s.trials + t;
  global_.accepted = cfg_.global_decay * global_.accepted + m;
  global_.trials = cfg_.global_decay * global_.trials + t;
}

void SpecPolicy::release(uint64_t id) {
  seqs_.erase(id);
}

SpecPolicy::Best SpecPolicy::optimise(std::span<const Row> rows) const {
  const auto B = static_cast<int64_t>(rows.size());
  Best best;
  best.k.assign(rows.size(), 0);
  best.plain = static_cast<double>(B) / costs_.plain(B);
  // Rows grouped by acceptance (32 levels), so the search costs the same at any batch: each
  // (level, j) group is the j-th draft of its rows, worth a^j tokens each.
  constexpr int kLevels = 32;
  std::vector<double> sum_a(kLevels, 0);
  std::vector<int64_t> num(kLevels, 0);
  std::vector<std::vector<int64_t>> with_cap(kLevels);  // [level][j]: rows allowed >= j drafts
  std::vector<int> level(rows.size(), 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].cap <= 0) continue;
    const double a = std::clamp(acceptance(rows[i].id), 0.0, 0.98);
    const int l = std::min(kLevels - 1, static_cast<int>(a * kLevels));
    level[i] = l;
    sum_a[static_cast<size_t>(l)] += a;
    ++num[static_cast<size_t>(l)];
    auto& c = with_cap[static_cast<size_t>(l)];
    const int64_t cap = std::min(rows[i].cap, max_k_);
    if (static_cast<int64_t>(c.size()) <= cap) c.resize(static_cast<size_t>(cap) + 1, 0);
    for (int64_t j = 1; j <= cap; ++j) ++c[static_cast<size_t>(j)];
  }
  struct Group {
    double gain;
    int64_t j, count;
    int level;
  };
  std::vector<Group> groups;
  for (int l = 0; l < kLevels; ++l) {
    if (num[static_cast<size_t>(l)] == 0) continue;
    const double a = sum_a[static_cast<size_t>(l)] / static_cast<double>(num[static_cast<size_t>(l)]);
    const auto& c = with_cap[static_cast<size_t>(l)];
    for (size_t j = 1; j < c.size(); ++j)
      if (c[j] > 0) groups.push_back({std::pow(a, static_cast<double>(j)), static_cast<int64_t>(j), c[j], l});
  }
  // Best marginal gain first; a level's drafts in order, so each row takes drafts 1..K.
  std::sort(groups.begin(), groups.end(),
            [](const Group& x, const Group& y) { return x.gain != y.gain ? x.gain > y.gain : x.j < y.j; });
  // The verify time at whole drafts per row, interpolated between (the loop below stays cheap on
  // the engine thread at any batch); a draft forward's only when the rows drafting change.
  std::vector<double> verify_at(static_cast<size_t>(max_k_) + 1);
  for (int64_t x = 0; x <= max_k_; ++x) verify_at[static_cast<size_t>(x)] = costs_.verify(B, static_cast<double>(x));
  double tokens = static_cast<double>(B), draft = 0;
  int64_t drafts = 0, spec_rows = 0, k_max = 0;
  size_t taken = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    tokens += groups[g].gain * static_cast<double>(groups[g].count);
    drafts += groups[g].count;
    if (groups[g].j == 1) spec_rows += groups[g].count, draft = costs_.draft(spec_rows);
    k_max = std::max(k_max, groups[g].j);
    const double x = static_cast<double>(drafts) / static_cast<double>(B);
    const auto lo = std::min(static_cast<size_t>(x), static_cast<size_t>(max_k_ - 1));
    const double verify = verify_at[lo] + (x - static_cast<double>(lo)) * (verify_at[lo + 1] - verify_at[lo]);
    const double cost = verify + static_cast<double>(k_max) * draft;
    if (const double thr = tokens / cost; thr > best.spec) best.spec = thr, taken = g + 1;
  }
  std::vector<int64_t> k_level(kLevels, 0);
  for (size_t g = 0; g < taken; ++g)
    k_level[static_cast<size_t>(groups[g].level)] =
        std::max(k_level[static_cast<size_t>(groups[g].level)], groups[g].j);
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].cap > 0) best.k[i] = std::min(rows[i].cap, k_level[static_cast<size_t>(level[i])]);
  return best;
}

bool SpecPolicy::plan(std::span<const Row> rows, std::vector<int64_t>& k) {
  k.assign(rows.size(), 0);
  if (std::none_of(rows.begin(), rows.end(), [](const Row& r) { return r.cap > 0; })) return false;
  const auto B = static_cast<int64_t>(rows.size());
  auto decided = [&](bool speculate, double speedup) {
    int64_t sum = 0;
    for (int64_t x : k) sum += x;
    ++(speculate ? stats_.speculate_steps : stats_.plain_steps);
    stats_.speculating = speculate;
    stats_.drafts_per_row = static_cast<double>(sum) / static_cast<double>(B);
    stats_.expected_speedup = speedup;
    return speculate;
  };
  if (cfg_.mode == SpecPolicyMode::Fixed) {
    for (size_t i = 0; i < rows.size(); ++i) k[i] = rows[i].cap;
    return decided(true, 0);
  }
  ++steps_;
  Best best = optimise(rows);
  const bool want = best.spec > best.plain * (1 + cfg_.margin);
  Probe& p = probes_[StepCostModel::bucket(B)];
  if (p.interval == 0) p.interval = cfg_.probe_interval;
  if (want != preferred_ && steps_ > 1) {
    ++stats_.switches;
    p.interval = cfg_.probe_interval;  // things changed: look again soon
    // Each change is logged while they are few; a load that keeps crossing the break-even batch
    // would flood the log, and the periodic speculation line has the counts.
    spdlog::log(stats_.switches <= 20 ? spdlog::level::info : spdlog::level::debug,
                "speculation policy: {} at {} decode rows (expected {:.2f}x plain throughput){}",
                want ? "speculating" : "decoding plainly", B, best.spec / best.plain,
                stats_.switches == 20 ? "; further changes are logged at debug level" : "");
  }
  preferred_ = want;
  bool speculate = want;
  if (probe_left_ > 0) {
    --probe_left_;
    speculate = probe_speculate_;
  } else {
    // The preferred mode is measured at this batch first; then the other one, at intervals that
    // double while probing leaves the decision as it was. Plain probes only measure (a
    // speculative one also refreshes acceptance): none when step times are not learned.
    const bool measured = want ? costs_.has_verify(B) : costs_.has_plain(B);
    const bool other_measured = want ? costs_.has_plain(B) : costs_.has_verify(B);
    const int64_t other_at = want ? p.plain_at : p.spec_at;
    if ((cfg_.measure || !want) && measured && (!other_measured || steps_ - other_at > p.interval)) {
      if (other_measured) p.interval = std::min(2 * p.interval, cfg_.max_probe_interval);
      probe_speculate_ = speculate = !want;
      probe_left_ = cfg_.probe_steps - 1;
    }
  }
  if (speculate != want) ++(speculate ? stats_.probe_speculate : stats_.probe_plain);
  (speculate ? p.spec_at : p.plain_at) = steps_;
  if (speculate) k = std::move(best.k);
  return decided(speculate, best.plain > 0 ? best.spec / best.plain : 0);
}

void SpecPolicy::observe(const StepSample& s) {
  const int mode = s.drafts > 0 ? 1 : 0;
  // The first step after a switch is not its mode's own: the overlapped loop's first step only
  // launches, and the drafter catches up on the tokens it did not see.
  const bool first = mode != last_mode_;
  last_mode_ = mode;
  if (!cfg_.measure || !s.timed || first || s.rows <= 0 || s.seconds <= 0) return;
  if (mode == 0) {
    costs_.add_plain(s.rows, s.seconds);
    return;
  }
  costs_.add_verify(s.rows, static_cast<double>(s.drafts) / static_cast<double>(s.rows), s.seconds);
  if (s.max_k > 0 && s.spec_rows > 0 && s.draft_seconds > 0)
    costs_.add_draft(s.spec_rows, s.draft_seconds / static_cast<double>(s.max_k));
}

}  // namespace kiln
