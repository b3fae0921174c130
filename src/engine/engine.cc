#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "ops/cpu/sampling.h"

namespace kiln {

Engine::Engine(DeepseekV3Model& model, EngineConfig cfg) : model_(model), cfg_(std::move(cfg)) {
  const ModelConfig& c = model.config();
  const int64_t bs = cfg_.block_size;
  KILN_CHECK(bs > 0, "KV block size must be > 0, got {}", bs);
  KILN_CHECK(cfg_.max_model_len >= 0, "max model length must be >= 0 (0: the model's), got {}", cfg_.max_model_len);
  // Bytes per token come from a one-block pool: the pool's layout is the model's.
  int64_t bytes_per_token = 0;
  {
    LatentKvPool probe = model.new_pool(1, bs);
    for (const auto& layer : probe.layers) bytes_per_token += static_cast<int64_t>(layer.t.nbytes()) / bs;
  }
  int64_t limit = c.max_position_embeddings;
  if (cfg_.max_model_len > limit)  // positions past the model's are untrained (and past YaRN's range)
    spdlog::warn("max model length {} exceeds the model's max_position_embeddings {}: capping at {}",
                 cfg_.max_model_len, limit, limit);
  if (cfg_.max_model_len > 0) limit = std::min(limit, cfg_.max_model_len);
  const int64_t free_bytes = model.backend().free_memory_bytes();
  plan_ = kv::plan_kv_cache(cfg_.kv, bs, bytes_per_token, free_bytes, cfg_.scheduler.max_num_seqs * limit);
  max_model_len_ = std::min(limit, plan_.tokens());
  pool_ = model.new_pool(plan_.num_blocks, bs);
  spdlog::info("KV cache: {} tokens ({} blocks of {}, {:.1f} MiB at {} B/token; {}); longest sequence {} tokens",
               plan_.tokens(), plan_.num_blocks, bs, static_cast<double>(plan_.bytes()) / (1 << 20), bytes_per_token,
               plan_.source, max_model_len_);
  alloc_ = std::make_unique<kv::BlockAllocator>(plan_.num_blocks);
  if (cfg_.prefix_caching) cache_ = std::make_unique<kv::RadixCache>(*alloc_, bs);
  scheduler_ = std::make_unique<Scheduler>(cfg_.scheduler, *alloc_, cache_.get(), bs);
  runner_ = std::make_unique<ModelRunner>(model, pool_, cfg_.mla_form);
  if (cfg_.cuda_graphs && cfg_.mla_form != MlaForm::Expanded) {
    model.enable_decode_graphs(pool_, cfg_.scheduler.max_num_seqs, kv::blocks_for(max_model_len_, bs));
    const auto t0 = std::chrono::steady_clock::now();
    if (const int64_t n = model.capture_decode_graphs(); n > 0)
      spdlog::info("captured {} CUDA graphs for decode steps of 1 to {} sequences in {:.2f} s", n,
                   cfg_.scheduler.max_num_seqs,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  for (int64_t id : c.eos_token_ids) eos_ids_.push_back(static_cast<int32_t>(id));
  if (cfg_.speculator) {
    const int64_t k = cfg_.speculator->num_draft_tokens();
    KILN_CHECK(k >= 1, "speculative decoding: the number of draft tokens must be >= 1, got {}", k);
    // Its cache holds at most what the pool does, plus each running sequence's drafts.
    cfg_.speculator->size_cache(plan_.tokens() + cfg_.scheduler.max_num_seqs * (k + 1));
    runner_->set_hidden_taps(cfg_.speculator->hidden_taps());
    spec_.proposed_at.assign(static_cast<size_t>(k), 0);
    spec_.accepted_at.assign(static_cast<size_t>(k), 0);
    policy_ = std::make_unique<SpecPolicy>(cfg_.spec_policy, k);
    stats_.spec = spec_;
    spdlog::info(
        "speculative decoding: {} drafter, up to {} draft tokens per step, {} policy (steps that verify "
        "drafts run on the serial loop)",
        cfg_.speculator->name(), k, to_string(cfg_.spec_policy.mode));
  }
  seed_rng_.seed(std::random_device{}());
  stats_.blocks_total = stats_.blocks_free = plan_.num_blocks;
  stats_.block_size = bs;
  stats_.kv_tokens = plan_.tokens();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  stop();
  model_.disable_decode_graphs(&pool_);  // graphs captured on this engine's pool die with it
}

void Engine::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

RequestStream Engine::submit(Request req) {
  const int64_t V = model_.config().vocab_size, n = static_cast<int64_t>(req.prompt.size());
  KILN_CHECK(n > 0, "the prompt is empty");
  for (int32_t id : req.prompt)
    KILN_CHECK(id >= 0 && id < V, "prompt token id {} is outside the vocabulary [0, {})", id, V);
  SamplingParams& p = req.sampling;
  p.validate(V);
  KILN_CHECK(req.prompt_logprobs >= -1 && req.prompt_logprobs <= V, "prompt_logprobs must be in [-1, {}], got {}", V,
             req.prompt_logprobs);
  KILN_CHECK(p.stop.empty() || req.detokenizer, "stop strings need a detokenizer (the engine matches them on text)");
  KILN_CHECK(n < max_model_len_, "the prompt has {} tokens; the context limit is {}", n, max_model_len_);
  const int64_t max_new = p.max_tokens < 0 ? max_model_len_ - n : p.max_tokens;
  KILN_CHECK(n + max_new <= max_model_len_, "prompt ({} tokens) + max_tokens ({}) exceed the context limit of {}", n,
             max_new, max_model_len_);
  // Drafts reach position n + max_new - 2 at most (the last token is never drafted past).
  const bool speculate = req.speculate && cfg_.speculator && n + max_new <= cfg_.speculator->max_len();
  std::vector<int32_t> stop_ids = p.stop_token_ids;
  if (!p.ignore_eos) stop_ids.insert(stop_ids.end(), eos_ids_.begin(), eos_ids_.end());

  std::unique_lock lock(mu_);
  KILN_CHECK(!stop_, "the engine is shutting down");
  const uint64_t id = next_id_++;
  if (!p.seed) p.seed = seed_rng_();
  auto state = std::make_shared<StreamState>(id);
  auto seq = std::make_unique<Sequence>(id, std::move(req), max_new, std::move(stop_ids), state);
  if (speculate) seq->spec_tokens = cfg_.speculator->num_draft_tokens();
  inbox_.push_back(std::move(seq));
  ++stats_.requests_submitted;
  busy_ = true;
  lock.unlock();
  wake_.notify_one();
  return RequestStream(std::move(state));
}

void Engine::cancel(uint64_t request_id) {
  {
    std::lock_guard lock(mu_);
    cancels_.push_back(request_id);
  }
  wake_.notify_one();
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Engine::wait_idle() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return !busy_; });
}

void Engine::loop() {
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  for (;;) {
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock,
                 [&] { return stop_ || inflight_ || !inbox_.empty() || !cancels_.empty() || scheduler_->has_work(); });
      if (stop_) break;
    }
    intake();
    const bool speculate = plan_speculation();
    // Overlapped: step n+1 is scheduled and queued before step n's tokens are read, so the device
    // never waits for the host's bookkeeping. Only while every request samples on the device
    // with nothing the host must see between steps (drafts to verify, hidden states for a
    // drafter); otherwise the step in flight settles first.
    const bool overlap = cfg_.overlap_schedule && unsafe_ == 0 && !speculate && !taps_hidden_states();
    StepTimes times;
    const auto t0 = Clock::now();
    if (!overlap && inflight_) settle(times);
    // The step's own time, for the speculation policy: from here (the step before it settled, if
    // serial) to its flush; an overlapped step's iteration is its period once it waits for another.
    const auto t_step = Clock::now();
    const bool waits_for_previous = inflight_.has_value();
    const double draft_before = spec_.draft_seconds;
    SchedulerOutput out;
    std::optional<ModelRunner::InFlight> next;
    if (scheduler_->has_work()) {
      const auto t_schedule = Clock::now();
      try {
        out = scheduler_->schedule();
        times.schedule += since(t_schedule);
        if (out.empty()) {
          step_run(out);
        } else if (overlap) {
          const auto t_launch = Clock::now();
          next = runner_->launch(out, inflight_ ? &*inflight_ : nullptr);
          for (const ScheduledSeq& it : out.seqs) {
            ++it.seq->steps_in_flight;
            if (it.sample) it.seq->tokens.push_back(kPendingToken);  // filled in when next settles
          }
          times.forward += since(t_launch);
        } else {
          forward_seconds_ = 0;
          step_run(out);
          times.forward += forward_seconds_;
          device_seconds_ += runner_->last_device_seconds();
        }
      } catch (const std::exception& e) {
        // A failed step aborts the requests in it (all of them when it failed before choosing),
        // never the engine.
        spdlog::error("engine step failed: {}", e.what());
        if (inflight_) settle(times);
        std::vector<Sequence*> victims;
        for (const ScheduledSeq& it : out.seqs) victims.push_back(it.seq);
        if (victims.empty())
          for (auto& [id, seq] : seqs_) victims.push_back(seq.get());
        for (Sequence* v : victims) finish(v, FinishReason::Abort, e.what());
        out = {};
        next.reset();
      }
    }
    if (inflight_) settle(times);
    const bool overlapped = next.has_value();
    if (next) {
      scheduler_->computed(next->out);  // after the step before it settled: every token is known
      inflight_ = std::move(next);
      if (cfg_.check_invariants) check_invariants();
    }
    // Post-processing: this step's commit, and the previous step's flush (timed after its stats).
    times.post +=
        std::max(0.0, since(t0) - times.schedule - times.forward - times.post) + std::exchange(flush_seconds_, 0.0);
    // Stats first, so a client that sees its final chunk also sees the blocks it freed.
    publish_stats(times, out, overlapped);
    const auto t_flush = Clock::now();
    flush();
    flush_seconds_ = since(t_flush);
    if (!out.empty())
      observe_speculation(out, since(t_step), spec_.draft_seconds - draft_before, !overlapped || waits_for_previous);
    // The server log's speculation line (vLLM logs its own every few seconds): every 10 s while
    // verifying, and when the work runs out.
    if (spec_.verifies > spec_logged_verifies_ && (since(spec_logged_at_) >= 10.0 || !scheduler_->has_work())) {
      spdlog::info("{}", spec_summary(spec_));
      spec_logged_verifies_ = spec_.verifies;
      spec_logged_at_ = Clock::now();
    }
    std::lock_guard lock(mu_);
    busy_ = inflight_ || scheduler_->has_work() || !inbox_.empty();
    if (!busy_) idle_.notify_all();
  }
  // Shutting down: whatever is left ends as aborted.
  StepTimes ignored;
  if (inflight_) settle(ignored);
  intake();
  std::vector<Sequence*> left;
  for (auto& [id, seq] : seqs_) left.push_back(seq.get());
  for (Sequence* s : left) finish(s, FinishReason::Abort, "the engine shut down");
  flush();
  {  // nothing will run any more: release wait_idle(), which would otherwise wait for ever
    std::lock_guard lock(mu_);
    busy_ = false;
  }
  idle_.notify_all();
  // What the adaptive policy measured, in the form --speculative-policy-table reads.
  if (policy_ && cfg_.spec_policy.mode == SpecPolicyMode::Adaptive)
    spdlog::info("speculation policy: step times learned: {}", policy_->costs().to_json());
}

void Engine::settle(StepTimes& times) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const ModelRunner::InFlight step = std::move(*inflight_);
  inflight_.reset();
  std::vector<SampleResult> results;
  try {
    results = runner_->collect(step);
  } catch (const std::exception& e) {  // the step failed on the device: its requests end, not the engine
    spdlog::error("engine step failed: {}", e.what());
    for (const ScheduledSeq& it : step.out.seqs) {
      --it.seq->steps_in_flight;
      finish(it.seq, FinishReason::Abort, e.what());
    }
    return;
  }
  const auto t1 = Clock::now();
  times.forward += std::chrono::duration<double>(t1 - t0).count();  // waiting for the device
  device_seconds_ += runner_->last_device_seconds();
  size_t r = 0;
  for (const ScheduledSeq& it : step.out.seqs) {
    Sequence* s = it.seq;
    --s->steps_in_flight;
    touched_.push_back(s);  // flushed, and dropped once finished with nothing in flight
    if (!it.sample) continue;
    const SampleResult& res = results[r++];
    if (s->finished()) continue;  // finished (or cancelled) while the step ran: its token is void
    s->resolve(it.start + it.num_tokens, res, max_model_len_);
    if (s->finished()) retire(s);
  }
  times.post += std::chrono::duration<double>(Clock::now() - t1).count();
  if (cfg_.check_invariants) check_invariants();
}

void Engine::intake() {
  std::vector<std::unique_ptr<Sequence>> in;
  std::vector<uint64_t> cancels;
  {
    std::lock_guard lock(mu_);
    in.swap(inbox_);
    cancels.swap(cancels_);
  }
  for (auto& seq : in) {
    Sequence* s = seq.get();
    const SamplingParams& p = s->sampler.params();
    // What the host must see between two steps of this request: its logits (a constraint's mask,
    // many top logprobs, prompt logprobs) or its latest tokens (penalties are counted on the host).
    s->overlap_safe = !s->constraint && p.top_logprobs <= ops::kMaxTopLogprobs && s->prompt_logprobs < 0 &&
                      p.logit_bias.empty() && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
                      p.frequency_penalty == 0.0f;
    // Speculation verifies on the host, so a step that verifies drafts takes the serial loop (the
    // policy says which steps do); a request that needs the host for its own sampling
    // (constraint, penalties, logit_bias, prompt logprobs) decodes plainly.
    if (!s->overlap_safe) s->spec_tokens = 0;
    unsafe_ += !s->overlap_safe;
    seqs_.emplace(s->id, std::move(seq));
    if (s->max_tokens == 0 && s->prompt_logprobs < 0)  // nothing to compute
      finish(s, FinishReason::Length);
    else
      scheduler_->add(s);
  }
  std::vector<Sequence*> aborted;
  for (auto& [id, seq] : seqs_)
    if (!seq->finished() &&
        (seq->stream->cancel_requested || std::find(cancels.begin(), cancels.end(), id) != cancels.end()))
      aborted.push_back(seq.get());
  for (Sequence* s : aborted) finish(s, FinishReason::Abort);
}

void Engine::step_run(const SchedulerOutput& out) {
  if (out.empty()) {
    // Nothing ran although work is queued: only possible if the oldest waiting request cannot
    // fit the otherwise idle pool, which submit() rules out. Fail it rather than spin.
    if (scheduler_->num_running() == 0 && scheduler_->num_waiting() > 0)
      finish(scheduler_->waiting_front(), FinishReason::Abort, "internal: the request does not fit the KV pool");
    return;
  }
  using Clock = std::chrono::steady_clock;
  // Speculation: drafts for the rows that verify some, before the one target forward.
  std::vector<SpecSeq> spec;
  for (const ScheduledSeq& it : out.seqs) {
    if (it.num_draft == 0) continue;
    const Sequence& s = *it.seq;
    spec.push_back({s.id, s.tokens, &s.sampler.params(), s.sampler.params().seed.value_or(0),
                    static_cast<uint64_t>(s.num_output()), it.num_draft});
  }
  if (!spec.empty()) {
    const auto t_draft = Clock::now();
    std::vector<std::vector<int32_t>> drafts;
    cfg_.speculator->draft(spec, drafts);
    size_t i = 0;
    for (const ScheduledSeq& it : out.seqs)
      if (it.num_draft > 0) it.seq->drafts = std::move(drafts.at(i++));
    spec_.draft_seconds += std::chrono::duration<double>(Clock::now() - t_draft).count();
  }
  const auto t0 = Clock::now();
  std::vector<std::vector<float>> verify_logits, hidden;  // hidden: per scheduled row, for the drafter
  const std::vector<SampleResult> results = runner_->run(out, &verify_logits, &hidden);
  std::vector<std::vector<int32_t>> emitted;
  if (!spec.empty()) emitted = cfg_.speculator->verify(spec, verify_logits);
  forward_seconds_ = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!spec.empty()) spec_.verify_seconds += forward_seconds_;
  // The KV that stays: a verify row keeps its sampled row and the accepted drafts' rows; the
  // rejected ones' slots are overwritten by later steps and never published (computed()
  // publishes full blocks below num_computed only). The accepted drafts stand in the tokens
  // while computed() publishes, so every published block holds known tokens.
  SchedulerOutput kept = out;
  size_t v = 0;
  for (ScheduledSeq& it : kept.seqs) {
    if (it.num_draft == 0) continue;
    const std::vector<int32_t>& e = emitted.at(v++);
    const auto accepted = static_cast<int64_t>(e.size()) - 1;
    ++spec_.verifies;
    spec_.draft_tokens += it.num_draft;
    spec_.accepted_tokens += accepted;
    policy_->verified(it.seq->id, it.num_draft, accepted);
    for (int64_t j = 0; j < it.num_draft && j < static_cast<int64_t>(spec_.proposed_at.size()); ++j) {
      ++spec_.proposed_at[static_cast<size_t>(j)];
      spec_.accepted_at[static_cast<size_t>(j)] += j < accepted;
    }
    it.num_tokens += accepted;
    it.num_draft = 0;
    it.seq->drafts.clear();
    it.seq->tokens.insert(it.seq->tokens.end(), e.begin(), e.end() - 1);
  }
  scheduler_->computed(kept);
  // The drafter reads the target's hidden states at the positions that stay (kept's num_tokens).
  for (size_t i = 0; i < hidden.size(); ++i)
    if (!hidden[i].empty())
      cfg_.speculator->accept_hidden(kept.seqs[i].seq->id, kept.seqs[i].start, kept.seqs[i].num_tokens, hidden[i]);
  for (const ScheduledSeq& it : out.seqs)  // appended again below, where stop conditions are checked
    if (it.num_draft > 0) it.seq->tokens.resize(static_cast<size_t>(it.start + it.num_tokens));
  size_t r = 0;
  v = 0;
  for (const ScheduledSeq& it : out.seqs) {
    if (!it.sample) continue;
    Sequence* s = it.seq;
    if (it.num_draft > 0) {  // the verified tokens, one by one, while none finishes it
      ++r;
      const std::vector<float>& rows = verify_logits[v];
      const std::vector<int32_t>& e = emitted[v++];
      const auto V = static_cast<size_t>(model_.config().vocab_size);
      for (size_t j = 0; j < e.size() && !s->finished(); ++j) {
        s->append(scored(rows.data() + j * V, e[j], s->sampler.params()), max_model_len_);
        extra_generated_ += j > 0;
      }
      touched_.push_back(s);
      if (s->finished()) retire(s);
      continue;
    }
    if (s->max_tokens == 0) {  // prompt scoring only (prompt logprobs): the prefill was the work
      ++r;
      finish(s, FinishReason::Length);
      continue;
    }
    s->append(results[r++], max_model_len_);
    touched_.push_back(s);
    if (s->finished()) retire(s);
  }
  if (cfg_.check_invariants) check_invariants();
}

std::string spec_summary(const SpecDecodeStats& s) {
  if (s.verifies == 0) return "";
  std::string per;
  for (size_t i = 0; i < s.proposed_at.size(); ++i)
    per += fmt::format(
        "{}{:.3f}", i ? " " : "",
        s.proposed_at[i] ? static_cast<double>(s.accepted_at[i]) / static_cast<double>(s.proposed_at[i]) : 0.0);
  const SpecPolicyStats& p = s.policy;
  return fmt::format(
      "speculative decoding: {} verifies, {} of {} drafts accepted ({:.3f}), mean accepted length {:.3f}, "
      "acceptance per position [{}], draft {:.3f} s, verify {:.3f} s; policy: {} steps speculated ({} probes), "
      "{} plain ({} probes), now {} ({:.2f} drafts per row)",
      s.verifies, s.accepted_tokens, s.draft_tokens, s.acceptance_rate(), s.mean_accepted_length(), per,
      s.draft_seconds, s.verify_seconds, p.speculate_steps, p.probe_speculate, p.plain_steps, p.probe_plain,
      p.speculating ? "speculating" : "plain", p.drafts_per_row);
}

SampleResult Engine::scored(const float* logits, int32_t token, const SamplingParams& p) const {
  // What the sample op reports for a token it drew: log-probabilities of the raw logits.
  SampleResult r;
  r.token = token;
  if (!p.logprobs && p.top_logprobs == 0) return r;
  const int64_t V = model_.config().vocab_size;
  const float lse = ops::cpu::logsumexp_row(logits, V);
  r.logprob = logits[token] - lse;
  for (int32_t t : ops::cpu::top_n_row(logits, V, std::min(p.top_logprobs, V))) r.top.push_back({t, logits[t] - lse});
  return r;
}

void Engine::check_invariants() const {
  alloc_->check_integrity();
  // Every reference is accounted for: one per block-table entry and one per cache node.
  std::vector<int32_t> refs(static_cast<size_t>(alloc_->num_blocks()), 0);
  for (const auto& [id, seq] : seqs_) {
    KILN_CHECK(seq->status == Sequence::Status::Running || seq->block_table.empty(),
               "engine: request {} holds KV blocks while not running", id);
    for (int32_t b : seq->block_table) ++refs[static_cast<size_t>(b)];
  }
  if (cache_) {
    cache_->check_integrity();
    for (int32_t b : cache_->cached_blocks()) ++refs[static_cast<size_t>(b)];
  }
  for (size_t b = 0; b < refs.size(); ++b)
    KILN_CHECK(alloc_->refcount(static_cast<int32_t>(b)) == refs[b], "engine: block {} has {} references, {} holders",
               b, alloc_->refcount(static_cast<int32_t>(b)), refs[b]);
}

void Engine::finish(Sequence* seq, FinishReason reason, std::string error) {
  if (seq->status == Sequence::Status::Finished) return;
  seq->finish(reason, std::move(error));
  touched_.push_back(seq);
  retire(seq);
}

void Engine::retire(Sequence* seq) {
  scheduler_->remove(seq);
  if (cfg_.speculator && seq->spec_tokens > 0) cfg_.speculator->release(seq->id);
  if (policy_) policy_->release(seq->id);
  ++(*seq->finish_reason == FinishReason::Abort ? aborted_ : finished_);
}

void Engine::publish_stats(const StepTimes& t, const SchedulerOutput& out, bool overlapped) {
  std::lock_guard lock(mu_);
  EngineStats& s = stats_;
  s.running = scheduler_->num_running();
  s.waiting = scheduler_->num_waiting();
  s.blocks_free = alloc_->num_free();
  s.blocks_cached = cache_ ? cache_->num_nodes() : 0;
  s.blocks_cached_evictable = cache_ ? cache_->num_evictable() : 0;
  s.prefix_hit_tokens = scheduler_->prefix_hit_tokens();
  s.prefix_query_tokens = scheduler_->prefix_query_tokens();
  s.preemptions = scheduler_->num_preemptions();
  s.requests_finished = finished_;
  s.requests_aborted = aborted_;
  s.schedule_seconds += t.schedule;
  s.forward_seconds += t.forward;
  s.post_seconds += t.post;
  s.device_seconds = device_seconds_;
  s.spec = spec_;
  if (!out.empty()) {
    const double seconds = t.schedule + t.forward + t.post;
    ++s.steps;
    s.overlapped_steps += overlapped;
    for (const ScheduledSeq& it : out.seqs) s.generated_tokens += it.sample;
    s.generated_tokens += std::exchange(extra_generated_, 0);  // verified tokens past each row's first
    if (out.prefill_tokens > 0) {
      ++s.prefill_steps;
      s.prefill_tokens += out.prefill_tokens;
      s.prefill_seconds += seconds;
    } else {
      ++s.decode_steps;
      s.decode_tokens += out.decode_tokens;
      s.decode_seconds += seconds;
    }
  }
}

void Engine::flush() {
  std::sort(touched_.begin(), touched_.end());
  touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
  for (Sequence* s : touched_) {
    const bool done = s->finished();
    s->stream->push(std::exchange(s->pending, {}));  // a stream ignores what follows its last chunk
    if (done && s->steps_in_flight == 0) {           // a step in flight still points at it
      unsafe_ -= !s->overlap_safe;
      seqs_.erase(s->id);
    }
  }
  touched_.clear();
}

}  // namespace kiln
