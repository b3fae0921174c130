// Vocabulary-parallel embedding and logits gather over the thread group: the same rows as one
// rank's full lookup and logits, at 1 to 4 ranks on a vocabulary that does not divide (151).
#include <gtest/gtest.h>

#include "collective_expect.h"
#include "core/error.h"
#include "dist/vocab_parallel.h"
#include "rank_threads.h"

namespace kiln::test {
namespace {

constexpr int64_t kVocab = 151, kHidden = 5;

ModelConfig model_with_vocab() {
  ModelConfig m;
  m.vocab_size = kVocab;
  m.num_attention_heads = 12;
  m.n_routed_experts = 12;
  m.moe_intermediate_size = 24;
  m.intermediate_size = 48;
  m.n_shared_experts = 1;
  return m;
}

dist::ParallelLayout layout_for(int world) {
  dist::ParallelConfig p;
  p.world_size = p.tp = world;
  return dist::ParallelLayout(p, model_with_vocab());
}

float table_value(int64_t token, int64_t j) {
  return static_cast<float>(token) * 0.5f - static_cast<float>(j) * 0.25f;
}

class VocabParallel : public ::testing::TestWithParam<int> {};

TEST_P(VocabParallel, EmbeddingEqualsTheFullLookup) {
  const auto layout = layout_for(GetParam());
  const std::vector<int32_t> tokens = {0, 150, 37, 75, 76, 37, 120};
  run_ranks(GetParam(), [&](dist::Communicator& c) {
    const dist::Range rows = layout.share(c.rank()).vocab;
    std::vector<float> table;
    for (int64_t t = rows.begin; t < rows.end; ++t)
      for (int64_t j = 0; j < kHidden; ++j) table.push_back(table_value(t, j));
    std::vector<float> out(tokens.size() * kHidden, -1.0f);
    dist::embed_vocab_parallel(c, layout, tokens, table.data(), kHidden, out.data());
    for (size_t i = 0; i < tokens.size(); ++i)
      for (int64_t j = 0; j < kHidden; ++j)
        if (out[i * kHidden + j] != table_value(tokens[i], j)) throw Error("row " + std::to_string(i) + " differs");
  });
}

TEST_P(VocabParallel, LogitsGatherEqualsTheFullRows) {
  const auto layout = layout_for(GetParam());
  const int64_t rows = 3, per = layout.vocab_per_rank();
  run_ranks(GetParam(), [&](dist::Communicator& c) {
    const dist::Range cols = layout.share(c.rank()).vocab;
    std::vector<float> local(rows * per, 1e30f);  // padding columns must not reach the output
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t v = cols.begin; v < cols.end; ++v)
        local[r * per + (v - cols.begin)] = rank_value(static_cast<int>(r), v);
    std::vector<float> full(rows * kVocab, -1.0f);
    dist::gather_logits(c, layout, local.data(), rows, full.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t v = 0; v < kVocab; ++v)
        if (full[r * kVocab + v] != rank_value(static_cast<int>(r), v))
          throw Error("logit " + std::to_string(r) + "," + std::to_string(v) + " differs");
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, VocabParallel, ::testing::Values(1, 2, 3, 4));

TEST(VocabParallel, TokenOutsideTheVocabularyIsNamedOnEveryRank) {
  const auto layout = layout_for(2);
  const auto errors = run_ranks_collect(2, [&](dist::Communicator& c) {
    const std::vector<int32_t> tokens = {3, 151};
    std::vector<float> table(76 * kHidden), out(2 * kHidden);
    dist::embed_vocab_parallel(c, layout, tokens, table.data(), kHidden, out.data());
  });
  for (const auto& e : errors)
    EXPECT_NE(e.find("token 151 at position 1 is outside the vocabulary of 151"), std::string::npos) << e;
}

}  // namespace
}  // namespace kiln::test
