// The engine's draft-model drafter (paged cache, steps batched over sequences) against the
// single-sequence DraftModelDrafter on kiln-tiny-draft: a batch of sequences of different lengths
// gets each sequence's own proposals and draft probabilities (up to the rounding of batched
// GEMMs), after rollbacks too, and a pool too small for everyone drops idle sequences' caches
// rather than failing, with the same proposals after.
#include "spec/paged_draft_drafter.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "spec/draft_model_drafter.h"
#include "test_util.h"

namespace kiln::spec {
namespace {

struct DraftModel {
  std::unique_ptr<ops::Backend> backend = ops::make_cpu_backend();
  std::unique_ptr<DeepseekV3Model> model =
      DeepseekV3Model::load((test::repo_root() / "models" / "kiln-tiny-draft").string(), *backend);
};

DeepseekV3Model& draft_model() {
  static DraftModel m;
  return *m.model;
}

std::vector<int32_t> context(int64_t n, int32_t salt) {
  std::vector<int32_t> c{0};
  for (int64_t i = 1; i < n; ++i) c.push_back(static_cast<int32_t>((i * 977 + salt * 131) % 8000 + 100));
  return c;
}

// What the single-sequence drafter proposes for each context alone.
DraftOutput alone(const std::vector<std::vector<int32_t>>& ctx, int64_t k, const SamplingParams& s) {
  DraftOutput all;
  all.num_seqs = static_cast<int64_t>(ctx.size()), all.k = k, all.vocab = draft_model().config().vocab_size;
  for (size_t i = 0; i < ctx.size(); ++i) {
    DraftModelDrafter d(draft_model(), 256);
    const DraftInput in{static_cast<int64_t>(i), ctx[i], &s, 11 + i, 3};
    DraftOutput one;
    d.propose(std::span<const DraftInput>(&in, 1), k, one);
    all.tokens.insert(all.tokens.end(), one.tokens.begin(), one.tokens.end());
    all.probs.insert(all.probs.end(), one.probs.begin(), one.probs.end());
  }
  return all;
}

DraftOutput batched(PagedDraftModelDrafter& d, const std::vector<std::vector<int32_t>>& ctx, int64_t k,
                    const SamplingParams& s) {
  std::vector<DraftInput> in;
  for (size_t i = 0; i < ctx.size(); ++i) in.push_back({static_cast<int64_t>(i), ctx[i], &s, 11 + i, 3});
  DraftOutput out;
  d.propose(in, k, out);
  return out;
}

void expect_same(const DraftOutput& a, const DraftOutput& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.probs.size(), b.probs.size());
  double worst = 0;
  for (size_t i = 0; i < a.probs.size(); ++i) worst = std::max(worst, std::abs(double(a.probs[i]) - b.probs[i]));
  EXPECT_LT(worst, 1e-4);
}

TEST(PagedDraftModelDrafter, BatchedProposalsAreEachSequencesOwnAfterRollbacksToo) {
  SamplingParams greedy, sampled;
  greedy.temperature = 0;
  sampled.temperature = 1.0f, sampled.top_k = 20;
  for (const SamplingParams& s : {greedy, sampled}) {
    std::vector<std::vector<int32_t>> ctx = {context(5, 1), context(23, 2), context(1, 3), context(40, 4)};
    PagedDraftModelDrafter d(draft_model(), 64, 8);
    expect_same(batched(d, ctx, 3, s), alone(ctx, 3, s));
    // Sequence 0 accepted one draft then got another token; 1 accepted none; 3 all three.
    const DraftOutput first = batched(d, ctx, 3, s);
    const std::vector<int64_t> accepted = {1, 0, 2, 3};
    for (size_t i = 0; i < ctx.size(); ++i) {
      const int64_t a = accepted[i];
      d.rollback(static_cast<int64_t>(i), static_cast<int64_t>(ctx[i].size()) + a);
      ctx[i].insert(ctx[i].end(), first.tokens.begin() + static_cast<int64_t>(i) * 3,
                    first.tokens.begin() + static_cast<int64_t>(i) * 3 + a);
      ctx[i].push_back(static_cast<int32_t>(500 + i));
    }
    expect_same(batched(d, ctx, 2, s), alone(ctx, 2, s));
    for (size_t i = 0; i < ctx.size(); ++i) d.release(static_cast<int64_t>(i));
    EXPECT_EQ(d.num_free_blocks(), 64);
    EXPECT_EQ(d.num_states(), 0);
  }
}

TEST(PagedDraftModelDrafter, ATightPoolDropsIdleCachesAndRefusesWhatCannotFit) {
  SamplingParams greedy;
  greedy.temperature = 0;
  const std::vector<std::vector<int32_t>> a = {context(30, 1)}, b = {context(30, 2)};
  PagedDraftModelDrafter d(draft_model(), 5, 8);  // 40 tokens: one sequence at a time
  const DraftOutput first = batched(d, a, 2, greedy);
  std::vector<DraftInput> in = {{7, b[0], &greedy, 11, 3}};
  DraftOutput other;
  d.propose(in, 2, other);  // sequence 7 needs sequence 0's blocks: its cache is dropped
  EXPECT_EQ(batched(d, a, 2, greedy).tokens, first.tokens);
  // Both at once cannot fit.
  std::vector<DraftInput> both = {{0, a[0], &greedy, 11, 3}, {7, b[0], &greedy, 11, 3}};
  DraftOutput out;
  EXPECT_THROW(d.propose(both, 2, out), Error);
  EXPECT_THROW(d.propose(std::vector<DraftInput>{{0, a[0], &greedy, 11, 3}, {0, a[0], &greedy, 11, 3}}, 1, out), Error);
}

}  // namespace
}  // namespace kiln::spec
