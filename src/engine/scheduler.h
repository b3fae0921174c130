// Scheduler (DESIGN.md §3): decides, each step, which sequences run and how many new tokens each
// computes. Continuous batching with chunked prefill: running sequences go first (decodes take
// one token, unfinished prompts take a chunk), then waiting ones are admitted while the step's
// token budget, the sequence limit and the KV blocks last. When a running sequence cannot get a
// block, the newest running sequences are preempted: they drop their KV and wait at the front of
// the queue to recompute it (nothing is lost; the prefix cache often still holds it).
//
// KV ownership: a sequence holds one reference on each block of its table. With prefix caching,
// every full block whose KV is computed is published to the radix cache right away, and the
// sequence locks its deepest cached node, so what it uses is never evicted.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/sequence.h"
#include "kv/block_allocator.h"
#include "kv/radix_cache.h"

namespace kiln {

struct SchedulerConfig {
  int64_t max_num_seqs = 256;         // running sequences
  int64_t max_batched_tokens = 8192;  // new tokens per step, over all sequences
  int64_t max_prefill_chunk = 0;      // new tokens of one sequence per step (0: the budget)
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int64_t start = 0;       // first new position (= tokens already computed)
  int64_t num_tokens = 0;  // new tokens this step: [start, start + num_tokens)
  bool sample = false;     // reaches the end of the sequence: its last row is sampled
  bool decode = false;     // a decode step (else a prefill chunk, or a recompute)
  // Speculation: drafts verified after the sampled row, at positions [start + num_tokens,
  // + num_draft); their KV slots are reserved, their tokens are seq->drafts.
  int64_t num_draft = 0;
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> seqs;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  // `cache` may be null: no prefix caching.
  Scheduler(SchedulerConfig cfg, kv::BlockAllocator& allocator, kv::RadixCache* cache, int64_t block_size);

  void add(Sequence* seq);  // joins the back of the waiting queue
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  SchedulerOutput schedule();
  // After the forward: the scheduled tokens' KV is in the pool; publish completed blocks. With a
  // step in flight (the overlapped loop), called once the step before it has its tokens, so that
  // every published block's tokens are known.
  void computed(const SchedulerOutput& out);
  // Takes a finished or aborted sequence out of the queues and lets go of its blocks.
  void remove(Sequence* seq);

  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_preemptions() const { return preemptions_; }
  // Tokens of admitted sequences that the prefix cache served, and tokens they had in all.
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }
  int64_t prefix_query_tokens() const { return prefix_query_tokens_; }
  const std::vector<Sequence*>& running() const { return running_; }
  Sequence* waiting_front() const { return waiting_.empty() ? nullptr : waiting_.front(); }

 private:
  // Grows seq's table to hold `tokens` tokens, evicting cached blocks if needed.
  bool reserve(Sequence* seq, int64_t tokens);
  // Cached prefix for a sequence being admitted (takes references, locks the node).
  void attach_prefix(Sequence* seq);
  // Drops all of seq's KV state (references, lock).
  void release(Sequence* seq);
  void preempt(Sequence* seq);
  void publish(Sequence* seq);  // inserts seq's computed full blocks into the cache
  int64_t chunk(const Sequence* seq, int64_t budget) const;

  SchedulerConfig cfg_;
  kv::BlockAllocator& alloc_;
  kv::RadixCache* cache_;
  int64_t block_size_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order: the back is the newest
  int64_t preemptions_ = 0, prefix_hit_tokens_ = 0, prefix_query_tokens_ = 0;
};

}  // namespace kiln
