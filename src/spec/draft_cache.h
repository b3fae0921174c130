// What the paged drafters (a draft model's, the MTP layer's) share about their per-sequence KV
// caches: the checks and output sizing that open a proposal, the block reservation that evicts
// caches of sequences not drafted now, and forgetting fed rows when a forward fails.
// `who` names the drafter in errors ("draft model", "MTP drafter").
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "kv/block_allocator.h"
#include "spec/drafter.h"

namespace kiln::spec {

// How many blocks of `block_size` a drafter's cache of `tokens` tokens gets: the target's pool
// took its share of memory first, so at most half of `free_bytes` (sequences that do not fit then
// lose their draft cache and rebuild it, see reserve_draft_blocks). Logs the size as `what`.
inline int64_t draft_cache_blocks(std::string_view what, int64_t tokens, int64_t block_size, int64_t bytes_per_block,
                                  int64_t free_bytes) {
  const int64_t affordable = free_bytes / 2 / std::max<int64_t>(1, bytes_per_block);
  const int64_t blocks = std::max<int64_t>(1, std::min(kv::blocks_for(tokens, block_size), affordable));
  if (blocks < kv::blocks_for(tokens, block_size))
    spdlog::warn("{}: {} tokens of the {} asked fit in half the free memory", what, blocks * block_size, tokens);
  spdlog::info("{}: {} tokens ({} blocks of {}, {:.1f} MiB)", what, blocks * block_size, blocks, block_size,
               static_cast<double>(blocks * bytes_per_block) / (1 << 20));
  return blocks;
}

// Checks k and sizes `out` for `seqs` (all zeros); false when there is nothing to draft.
inline bool begin_proposal(std::string_view who, std::span<const DraftInput> seqs, int64_t k, int64_t vocab,
                           DraftOutput& out) {
  const auto B = static_cast<int64_t>(seqs.size());
  KILN_CHECK(k >= 1, "{}: number of draft tokens must be >= 1, got {}", who, k);
  out.num_seqs = B, out.k = k, out.vocab = vocab;
  out.tokens.assign(static_cast<size_t>(B * k), 0);
  out.probs.assign(static_cast<size_t>(B * k * vocab), 0.0f);
  return B > 0;
}

// Checks that sequence `s` of `seqs` has sampling parameters and no earlier entry of its id.
inline void check_draft_input(std::string_view who, std::span<const DraftInput> seqs, size_t s) {
  const DraftInput& in = seqs[s];
  KILN_CHECK(in.sampling, "{}: sequence {} has no sampling parameters", who, in.seq_id);
  for (size_t o = 0; o < s; ++o)
    KILN_CHECK(seqs[o].seq_id != in.seq_id, "{}: sequence {} is drafted twice", who, in.seq_id);
}

// Grows `blocks` (sequence `id`'s) to hold `tokens` tokens of `block_size`. When the allocator runs
// short, the caches of other sequences in `states` (a map of id to a state with `blocks`) that are
// not in `busy` go through `drop` (which frees their blocks); they are rebuilt when next drafted.
template <class States, class Drop>
void reserve_draft_blocks(std::string_view who, kv::BlockAllocator& alloc, int64_t block_size, States& states,
                          int64_t id, std::vector<int32_t>& blocks, int64_t tokens, std::span<const DraftInput> busy,
                          Drop&& drop) {
  const int64_t need = kv::blocks_for(tokens, block_size) - static_cast<int64_t>(blocks.size());
  if (need <= 0) return;
  if (alloc.num_free() < need)
    for (auto& [other, s] : states) {
      if (other == id || s.blocks.empty() ||
          std::any_of(busy.begin(), busy.end(), [&](const DraftInput& in) { return in.seq_id == other; }))
        continue;
      drop(s);
      if (alloc.num_free() >= need) break;
    }
  KILN_CHECK(alloc.num_free() >= need,
             "{}: its KV pool ({} blocks of {}) cannot hold the {} sequences drafted together", who, alloc.num_blocks(),
             block_size, busy.size());
  for (int64_t i = 0; i < need; ++i) blocks.push_back(alloc.allocate());
}

// Runs `f`; if it throws, calls `forget` (rows fed in a failed forward may not be in the cache) and
// rethrows.
template <class F, class Forget>
void forget_on_failure(F&& f, Forget&& forget) {
  try {
    f();
  } catch (...) {
    forget();
    throw;
  }
}

}  // namespace kiln::spec
