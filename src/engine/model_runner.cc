#include "engine/model_runner.h"

#include <algorithm>

#include "kv/block_allocator.h"

namespace kiln {

ForwardBatch ModelRunner::build(const SchedulerOutput& out) const {
  ForwardBatch b;
  const int64_t bs = pool_.block_size;
  for (const ScheduledSeq& it : out.seqs)
    b.max_blocks = std::max(b.max_blocks, kv::blocks_for(it.start + it.num_tokens, bs));
  b.cu_q.push_back(0);
  for (const ScheduledSeq& it : out.seqs) {
    const Sequence& s = *it.seq;
    for (int64_t p = it.start; p < it.start + it.num_tokens; ++p) {
      b.tokens.push_back(s.tokens[static_cast<size_t>(p)]);
      b.positions.push_back(static_cast<int32_t>(p));
      b.slot_mapping.push_back(kv::slot_of(s.block_table, p, bs));
    }
    if (it.sample) b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
    b.cu_q.push_back(static_cast<int32_t>(b.tokens.size()));
    b.kv_lens.push_back(static_cast<int32_t>(it.start + it.num_tokens));
    const int64_t used = kv::blocks_for(it.start + it.num_tokens, bs);
    b.block_tables.insert(b.block_tables.end(), s.block_table.begin(), s.block_table.begin() + used);
    b.block_tables.insert(b.block_tables.end(), static_cast<size_t>(b.max_blocks - used), 0);
  }
  return b;
}

std::vector<SampleResult> ModelRunner::run(const SchedulerOutput& out) {
  const ForwardBatch batch = build(out);
  const std::vector<float> logits = model_.forward(batch, pool_, form_);
  const int64_t V = model_.config().vocab_size;
  std::vector<SampleResult> results;
  results.reserve(batch.logit_rows.size());
  size_t row = 0;
  for (const ScheduledSeq& it : out.seqs) {
    if (!it.sample) continue;
    Sequence& s = *it.seq;
    const std::span<const float> l(logits.data() + static_cast<int64_t>(row++) * V, static_cast<size_t>(V));
    results.push_back(s.sampler.sample(l, s.prompt(), s.output()));
  }
  return results;
}

}  // namespace kiln
