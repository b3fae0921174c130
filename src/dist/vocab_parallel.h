// The two vocabulary-parallel steps of a TP forward on host memory (the CPU backend's path):
// the embedding, where each rank holds the rows of its vocabulary range and the ranks' partial
// lookups are summed, and the logits gather, where each rank's logits for its vocabulary rows are
// put side by side into full rows on every rank (the last ranks' padding dropped).
#pragma once

#include <cstdint>
#include <span>

#include "dist/communicator.h"
#include "dist/parallel_layout.h"

namespace kiln::dist {

// out [tokens.size(), hidden]: row i is the embedding of tokens[i]. `table` holds this rank's rows
// [share.vocab.begin, share.vocab.end) of the embedding, hidden f32 values each. A token outside
// 0..vocab_size-1 is an error naming it (on every rank alike, as every rank sees the same tokens).
void embed_vocab_parallel(Communicator& c, const ParallelLayout& layout, std::span<const int32_t> tokens,
                          const float* table, int64_t hidden, float* out);

// full [rows, vocab_size] from each rank's local [rows, layout.vocab_per_rank()] (columns past the
// end of the vocabulary, on the last ranks, are ignored).
void gather_logits(Communicator& c, const ParallelLayout& layout, const float* local, int64_t rows, float* full);

}  // namespace kiln::dist
