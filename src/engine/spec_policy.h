// How many tokens to verify, per sequence and per step (issue 41's runtime policy; DSpark's
// scheduler, vLLM's acceptance-based length). Speculation pays only where a step that verifies
// K drafts per row, plus the drafter's K forwards, costs less than the tokens it is expected to
// emit are worth in plain steps; at large batches (verify rows cost like plain rows) or with a
// poor drafter it does not, and the policy turns it off so decoding goes back to the overlapped loop.
//
// The policy is plain logic with no clock of its own: the engine feeds it the step times it
// measures and the verifications' outcomes, so tests drive it with a simulated device.
//
// Model. Per sequence, drafts are accepted left to right with a per-position rate a (a running,
// exponentially weighted estimate from its verifications); K drafts then emit
// E(K) = sum_{i=0..K} a^i tokens. Per step, with B decode rows verifying n drafts in all (the
// j-th draft of a row adds a^j), from S rows with drafts and at most k_max per row:
//   speculative throughput = (B + sum of the chosen a_i^j) / (T_verify(B, n / B) + k_max * T_draft(S))
//   plain throughput       = B / T_plain(B)
// T_plain is a plain step's period (the overlapped loop's, where the loop overlaps), T_verify a
// verify step's time without drafting, T_draft one draft forward: each learned online per batch
// bucket from the engine's own step times (StepCostModel), from a prior until measured, or
// seeded from a table file. The step takes the best n (drafts allotted greedily by marginal
// gain a_i^j, so a row's K falls as its acceptance does) and speculates only when that beats
// plain by `margin`.
//
// What "never slower than plain" means here: at a steady batch size and acceptance, once both
// modes are measured at that batch bucket, the policy runs the mode with the higher measured
// throughput, except for probes of the other mode: `probe_steps` steps every probe interval
// (which doubles, up to `max_probe_interval`, while probes leave the decision unchanged). So the
// loss against plain decoding is at most probe_steps * (c - 1) / (interval + probe_steps) of
// plain throughput, c being a speculative step's cost over a plain one's (about 3 for K = 2 on
// kiln-tiny on an H100: 0.4% at the longest interval), plus the lag of the running estimates
// when load or acceptance shifts.
//
// Greedy output does not depend on the decisions; a seeded sampled request's tokens do (same
// distribution, other draws), and adaptive decisions follow measured times: the fixed policy
// keeps a seed's tokens reproducible.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace kiln {

enum class SpecPolicyMode {
  Fixed,     // every speculating decode row verifies its full K (capped near max_tokens)
  Adaptive,  // K per row and on/off per step from acceptance and measured step times
};

struct SpecPolicyConfig {
  SpecPolicyMode mode = SpecPolicyMode::Fixed;
  int64_t probe_interval = 64;        // steps before the mode not chosen is measured again
  int64_t max_probe_interval = 1024;  // the interval doubles up to this while probes change nothing
  int64_t probe_steps = 2;            // a probe's length: the first step after a switch is not timed
  double margin = 0.03;               // speculate only when its expected throughput beats plain's by this fraction
  // Acceptance: a sequence's estimate starts at the engine-wide one (which starts at
  // prior_acceptance) and weighs each verification's trials with decay `seq_decay` per verification.
  double prior_acceptance = 0.6;
  double seq_decay = 0.8, global_decay = 0.99;
  // Step-time prior until measured, relative to a plain step of the same batch: a verify step
  // costs 1 + serial + per_draft * (drafts per row); one draft forward costs `draft`. Where one
  // mode is measured, the other is derived from it through these ratios.
  double prior_serial = 0.1, prior_per_draft = 0.1, prior_draft = 0.2;
  double time_decay = 0.8;  // a cell's running mean keeps this much of its old value per sample
  bool measure = true;      // learn step times online (off: prior and table only; for tests)
  std::string table_path;   // optional: seed the step-time table from this JSON (StepCostModel::load)
};

SpecPolicyMode parse_spec_policy_mode(const std::string& s);  // "fixed" | "adaptive"; throws otherwise
const char* to_string(SpecPolicyMode m);

// What the policy decided, for /metrics, logs and tests.
struct SpecPolicyStats {
  int64_t speculate_steps = 0, plain_steps = 0;  // decisions, probes included
  int64_t probe_speculate = 0, probe_plain = 0;  // of which probes of the other mode
  int64_t switches = 0;                          // changes of the preferred mode
  bool speculating = false;                      // the last decision
  double drafts_per_row = 0;                     // the last decision's mean K over its decode rows
  double expected_speedup = 0;                   // the last decision: best speculative / plain throughput
};

// Step times per batch bucket: plain steps, verify steps by drafts per row, draft forwards.
class StepCostModel {
 public:
  StepCostModel(const SpecPolicyConfig& cfg, int64_t max_k);
  // Batch buckets: exact up to 8 rows, then four per doubling.
  static int64_t bucket(int64_t rows);
  void add_plain(int64_t rows, double seconds);
  void add_verify(int64_t rows, double drafts_per_row, double seconds);  // drafting excluded
  void add_draft(int64_t rows, double seconds_per_forward);
  double plain(int64_t rows) const;
  double verify(int64_t rows, double drafts_per_row) const;
  double draft(int64_t rows) const;  // one draft forward over `rows` sequences
  bool has_plain(int64_t rows) const;
  bool has_verify(int64_t rows) const;
  // JSON {"plain": [{"rows", "seconds"}], "verify": [{"rows", "drafts_per_row", "seconds"}],
  // "draft": [{"rows", "seconds"}]}: load() seeds cells as if measured once; to_json() writes
  // what was learned in the same form.
  void load(const std::string& path);
  std::string to_json() const;

 private:
  struct Cell {
    double t = 0, x = 0;  // running means of the time and of the cell's coordinate
    int64_t n = 0;
    void add(double t_new, double x_new, double decay);
  };
  struct Bucket {
    Cell plain, draft;         // draft.x: rows
    std::vector<Cell> verify;  // by round(drafts per row); x: drafts per row
    int64_t rows = 0;          // the last batch timed here (to_json's rows for verify cells)
  };
  double prior_ratio(double drafts_per_row) const;  // verify / plain before anything is measured
  double verify_here(const Bucket& b, double x, double p) const;
  double verify_ratio(int64_t bucket, double x) const;  // from the nearest bucket with both
  Bucket& at(int64_t rows);
  SpecPolicyConfig cfg_;
  int64_t max_k_;
  std::vector<Bucket> buckets_;
};

class SpecPolicy {
 public:
  SpecPolicy(SpecPolicyConfig cfg, int64_t max_k);

  struct Row {
    uint64_t id = 0;
    int64_t cap = 0;  // the most drafts this row may verify this step (0: it decodes plainly)
  };
  // This step's drafts per decode row (k[i] for rows[i]); true when any row drafts. `rows` are
  // every decode row of the step, speculating or not: the batch decides the costs.
  bool plan(std::span<const Row> rows, std::vector<int64_t>& k);
  // A verification of `k` drafts of which the first `accepted` were taken.
  void verified(uint64_t id, int64_t k, int64_t accepted);
  void release(uint64_t id);  // the sequence is gone
  double acceptance(uint64_t id) const;

  struct StepSample {
    int64_t rows = 0;       // decode rows (a step with prefill rows is not sampled)
    int64_t drafts = 0;     // drafts verified over all rows (0: a plain step)
    int64_t spec_rows = 0;  // rows with drafts
    int64_t max_k = 0;      // the most drafts of one row
    double seconds = 0;     // the step's time, drafting excluded (a plain step: its period)
    double draft_seconds = 0;
    bool timed = true;  // false: the time is not the step's own (the engine says so)
  };
  // After each decode step, in order; mixed steps (prefill rows) are passed with timed = false.
  void observe(const StepSample& s);

  const SpecPolicyConfig& config() const { return cfg_; }
  const StepCostModel& costs() const { return costs_; }
  StepCostModel& costs() { return costs_; }
  const SpecPolicyStats& stats() const { return stats_; }

 private:
  struct Acceptance {
    double accepted = 0, trials = 0;
  };
  struct Best {
    double plain = 0, spec = 0;  // throughputs (tokens per second of the model's unit)
    std::vector<int64_t> k;      // the best speculative allotment
  };
  Best optimise(std::span<const Row> rows) const;
  double global_acceptance() const;
  // Per batch bucket: when each mode last ran, and the current probe interval.
  struct Probe {
    int64_t plain_at = -1, spec_at = -1, interval = 0;
  };

  SpecPolicyConfig cfg_;
  int64_t max_k_;
  StepCostModel costs_;
  std::unordered_map<uint64_t, Acceptance> seqs_;
  Acceptance global_;
  std::unordered_map<int64_t, Probe> probes_;
  int64_t steps_ = 0;       // decisions so far
  int64_t probe_left_ = 0;  // steps left in the running probe
  bool probe_speculate_ = false;
  bool preferred_ = false;  // the last non-probe decision
  int last_mode_ = -1;      // the last observed step: 0 plain, 1 speculative, -1 none yet
  SpecPolicyStats stats_;
};

}  // namespace kiln
