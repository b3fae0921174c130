#include "dist/vocab_parallel.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace kiln::dist {

void embed_vocab_parallel(Communicator& c, const ParallelLayout& layout, std::span<const int32_t> tokens,
                          const float* table, int64_t hidden, float* out) {
  KILN_CHECK(c.world_size() == layout.parallel().world_size, "embedding: a group of {} ranks for a layout of {}",
             c.world_size(), layout.parallel().world_size);
  const RankShare s = layout.share(c.rank());
  const int64_t vocab = layout.vocab_size();
  for (size_t i = 0; i < tokens.size(); ++i)
    KILN_CHECK(tokens[i] >= 0 && tokens[i] < vocab,
               "embedding: token {} at position {} is outside the vocabulary of {}", tokens[i], i, vocab);
  const size_t n = tokens.size() * static_cast<size_t>(hidden);
  std::fill(out, out + n, 0.0f);
  for (size_t i = 0; i < tokens.size(); ++i)
    if (s.vocab.contains(tokens[i]))
      std::memcpy(out + i * hidden, table + (tokens[i] - s.vocab.begin) * hidden, sizeof(float) * hidden);
  // Exactly one rank contributes each row, the others zeros, so the sum is the row itself.
  c.all_reduce(out, out, n, DType::F32);
}

void gather_logits(Communicator& c, const ParallelLayout& layout, const float* local, int64_t rows, float* full) {
  KILN_CHECK(c.world_size() == layout.parallel().world_size, "logits gather: a group of {} ranks for a layout of {}",
             c.world_size(), layout.parallel().world_size);
  const int world = c.world_size();
  const int64_t per = layout.vocab_per_rank(), vocab = layout.vocab_size();
  std::vector<float> gathered(static_cast<size_t>(world * rows * per));
  c.all_gather(local, gathered.data(), static_cast<size_t>(rows * per), DType::F32);
  for (int r = 0; r < world; ++r) {
    const Range cols = layout.share(r).vocab;
    for (int64_t row = 0; row < rows; ++row)
      std::copy_n(gathered.data() + (r * rows + row) * per, cols.size(), full + row * vocab + cols.begin);
  }
}

}  // namespace kiln::dist
