#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace kiln {

Scheduler::Scheduler(SchedulerConfig cfg, kv::BlockAllocator& allocator, kv::RadixCache* cache, int64_t block_size)
    : cfg_(cfg), alloc_(allocator), cache_(cache), block_size_(block_size) {
  KILN_CHECK(cfg.max_num_seqs > 0, "max_num_seqs must be > 0, got {}", cfg.max_num_seqs);
  KILN_CHECK(cfg.max_batched_tokens > 0, "max_batched_tokens must be > 0, got {}", cfg.max_batched_tokens);
  KILN_CHECK(cfg.max_prefill_chunk >= 0, "max_prefill_chunk must be >= 0, got {}", cfg.max_prefill_chunk);
}

void Scheduler::add(Sequence* seq) {
  seq->status = Sequence::Status::Waiting;
  waiting_.push_back(seq);
}

int64_t Scheduler::chunk(const Sequence* seq, int64_t budget) const {
  int64_t n = std::min(seq->len() - seq->num_computed, budget);
  if (cfg_.max_prefill_chunk > 0) n = std::min(n, cfg_.max_prefill_chunk);
  return n;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int64_t budget = cfg_.max_batched_tokens;
  auto take = [&](Sequence* s, int64_t n, int64_t k = 0) {
    out.seqs.push_back({s, s->num_computed, n, s->num_computed + n == s->len(), s->decoding, k});
    (s->decoding ? out.decode_tokens : out.prefill_tokens) += n + k;
    budget -= n + k;
  };
  // Drafts a speculating decode row verifies: never more than the tokens it may still emit
  // after the sampled one, nor than the step's budget.
  auto drafts = [&](const Sequence* s, int64_t n) -> int64_t {
    if (!s->decoding || n != 1 || s->spec_k <= 0) return 0;
    return std::max<int64_t>(0, std::min({s->spec_k, s->max_tokens - s->num_output() - 1, budget - 1}));
  };

  // Running sequences, oldest first. One that cannot grow preempts the newest until it can (or
  // until it is itself the newest, and waits).
  bool preempted = false;
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* s = running_[i];
    if (s->decoding && s->num_output() >= s->max_tokens) {  // its last token is still pending (overlap)
      ++i;
      continue;
    }
    const int64_t n = chunk(s, budget), k = drafts(s, n);
    bool fits = true;
    while (!reserve(s, s->num_computed + n + k)) {
      Sequence* victim = running_.back();
      preempt(victim);
      preempted = true;
      if (victim == s) {
        fits = false;
        break;
      }
    }
    if (!fits) break;
    take(s, n, k);
    ++i;
  }

  // Admission, first come first served, unless this step already had to preempt.
  while (!preempted && !waiting_.empty() && budget > 0 && num_running() < cfg_.max_num_seqs) {
    Sequence* s = waiting_.front();
    if (s->prompt_logprobs < 0) attach_prefix(s);  // prompt logprobs need every prompt row computed
    const int64_t n = chunk(s, budget);
    if (!reserve(s, s->num_computed + n)) {
      release(s);
      break;
    }
    waiting_.pop_front();
    s->status = Sequence::Status::Running;
    if (!s->admitted_once) s->cached_prompt_tokens = std::min(s->num_computed, s->num_prompt);
    s->admitted_once = true;
    prefix_hit_tokens_ += s->num_computed;
    prefix_query_tokens_ += s->len();
    running_.push_back(s);
    take(s, n);
  }
  return out;
}

void Scheduler::computed(const SchedulerOutput& out) {
  for (const ScheduledSeq& it : out.seqs) {
    Sequence* s = it.seq;
    if (s->finished()) continue;  // finished while its step was in flight (overlap): nothing to keep
    s->num_computed = it.start + it.num_tokens;
    if (it.sample) s->decoding = true;
    publish(s);
  }
}

void Scheduler::remove(Sequence* seq) {
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end()) running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end()) waiting_.erase(it);
  release(seq);
  seq->status = Sequence::Status::Finished;
}

bool Scheduler::reserve(Sequence* seq, int64_t tokens) {
  const int64_t need = kv::blocks_for(tokens, block_size_) - static_cast<int64_t>(seq->block_table.size());
  if (need <= 0) return true;
  if (alloc_.num_free() < need && cache_ != nullptr) cache_->evict(need - alloc_.num_free());
  if (alloc_.num_free() < need) return false;
  for (int64_t i = 0; i < need; ++i) seq->block_table.push_back(alloc_.allocate());
  return true;
}

void Scheduler::attach_prefix(Sequence* seq) {
  if (cache_ == nullptr) return;
  // Leave at least one token to compute: its logits give the next token.
  const kv::RadixCache::Match m = cache_->match(seq->tokens, (seq->len() - 1) / block_size_);
  for (int32_t b : m.blocks) {
    alloc_.incref(b);
    seq->block_table.push_back(b);
  }
  cache_->lock(m.last);
  seq->cache_node = m.last;
  seq->num_cached_blocks = static_cast<int64_t>(m.blocks.size());
  seq->num_computed = seq->num_cached_blocks * block_size_;
}

void Scheduler::release(Sequence* seq) {
  if (seq->cache_node != nullptr) cache_->unlock(seq->cache_node);
  seq->cache_node = nullptr;
  for (int32_t b : seq->block_table) alloc_.decref(b);
  seq->block_table.clear();
  seq->num_computed = 0;
  seq->num_cached_blocks = 0;
  seq->decoding = false;
}

void Scheduler::preempt(Sequence* seq) {
  KILN_CHECK(!running_.empty() && running_.back() == seq, "internal: only the newest sequence is preempted");
  running_.pop_back();
  release(seq);
  seq->status = Sequence::Status::Waiting;
  ++seq->preemptions;
  ++preemptions_;
  waiting_.push_front(seq);
}

void Scheduler::publish(Sequence* seq) {
  if (cache_ == nullptr) return;
  const int64_t full = seq->num_computed / block_size_;
  if (full <= seq->num_cached_blocks) return;
  const kv::RadixCache::Match m = cache_->insert({seq->tokens.data(), static_cast<size_t>(full * block_size_)},
                                                 {seq->block_table.data(), static_cast<size_t>(full)});
  // Where another sequence cached the same tokens first, switch to its block and free ours.
  for (int64_t i = seq->num_cached_blocks; i < full; ++i) {
    int32_t& mine = seq->block_table[static_cast<size_t>(i)];
    const int32_t cached = m.blocks[static_cast<size_t>(i)];
    if (mine == cached) continue;
    alloc_.incref(cached);
    alloc_.decref(mine);
    mine = cached;
  }
  cache_->lock(m.last);
  if (seq->cache_node != nullptr) cache_->unlock(seq->cache_node);
  seq->cache_node = m.last;
  seq->num_cached_blocks = full;
}

}  // namespace kiln
