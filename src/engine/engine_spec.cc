// The engine's side of the speculation policy (engine/spec_policy.h), kept out of engine.cc's
// loop: which decode rows draft this step, and what the step cost afterwards.
#include <algorithm>

#include "engine/engine.h"

namespace kiln {

bool Engine::plan_speculation() {
  if (!policy_) return false;
  // Every decode row the scheduler will run first (running sequences, oldest first): the batch
  // sets the step's cost whether or not a row may speculate.
  std::vector<SpecPolicy::Row> rows;
  std::vector<Sequence*> seqs;
  for (Sequence* s : scheduler_->running()) {
    s->spec_k = 0;
    if (!s->decoding || s->finished() || s->num_output() >= s->max_tokens) continue;
    // Never more drafts than tokens it may still emit after the sampled one.
    const int64_t cap = std::max<int64_t>(0, std::min(s->spec_tokens, s->max_tokens - s->num_output() - 1));
    rows.push_back({s->id, cap});
    seqs.push_back(s);
  }
  std::vector<int64_t> k;
  const bool speculate = policy_->plan(rows, k);
  for (size_t i = 0; i < seqs.size(); ++i) seqs[i]->spec_k = k[i];
  spec_.policy = policy_->stats();
  return speculate;
}

bool Engine::taps_hidden_states() const {
  if (!cfg_.speculator || cfg_.speculator->hidden_taps().empty()) return false;
  for (const auto& [id, s] : seqs_)
    if (s->spec_tokens > 0 && !s->finished()) return true;
  return false;
}

void Engine::observe_speculation(const SchedulerOutput& out, double seconds, double draft_seconds, bool timed) {
  if (!policy_) return;
  SpecPolicy::StepSample s;
  s.rows = static_cast<int64_t>(out.seqs.size());
  for (const ScheduledSeq& it : out.seqs) {
    s.drafts += it.num_draft;
    s.spec_rows += it.num_draft > 0;
    s.max_k = std::max(s.max_k, it.num_draft);
  }
  s.seconds = seconds - draft_seconds;
  s.draft_seconds = draft_seconds;
  // A step with prompt rows costs what its chunk does: not a decode step's time.
  s.timed = timed && out.prefill_tokens == 0;
  policy_->observe(s);
}

}  // namespace kiln
