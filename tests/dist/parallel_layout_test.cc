// The parallel layout: who owns which heads, experts, intermediate slices and vocabulary rows,
// at the published TP8 shape and on the 12-head fixtures at TP2 and TP4, and the errors for sizes
// that do not fit a model.
#include <gtest/gtest.h>

#include "core/error.h"
#include "dist/parallel_layout.h"
#include "model/config.h"

namespace kiln::test {
namespace {

using dist::ParallelConfig;
using dist::ParallelLayout;
using dist::Range;

ParallelConfig tp(int n, int ep = 1, int dcp = 1) {
  ParallelConfig p;
  p.world_size = n;
  p.tp = n;
  p.ep = ep;
  p.dcp = dcp;
  return p;
}

ModelConfig fixture(const std::string& name) {
  return load_model_config(std::string(KILN_TEST_DATA) + "/fixtures/" + name + "/config.json");
}

std::string layout_error(const ParallelConfig& p, const ModelConfig& m) {
  try {
    ParallelLayout layout(p, m);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every unit of [0, total) is owned by exactly one of the ranges.
void expect_partition(const std::vector<Range>& parts, int64_t total, const char* what) {
  int64_t next = 0;
  for (const Range& r : parts) {
    EXPECT_EQ(r.begin, next) << what;
    next = r.end;
  }
  EXPECT_EQ(next, total) << what;
}

TEST(ParallelLayout, NinetySixHeadsAtTp8AreTwelvePerRank) {
  ModelConfig m;  // DeepSeek-V3 widths, with the 96 heads of the published TP8 deployment
  m.num_attention_heads = 96;
  m.n_routed_experts = 384;
  m.vocab_size = 163840;
  const ParallelLayout layout(tp(8), m);
  EXPECT_EQ(layout.heads_per_rank(), 12);
  std::vector<Range> heads, inter, vocab, dense;
  for (int r = 0; r < 8; ++r) {
    const auto s = layout.share(r);
    heads.push_back(s.heads);
    inter.push_back(s.expert_inter);
    vocab.push_back(s.vocab);
    dense.push_back(s.dense_inter);
    EXPECT_EQ(s.experts, (Range{0, 384}));  // TP inside the experts: every rank holds all of them
  }
  expect_partition(heads, 96, "heads");
  expect_partition(inter, 2048, "expert intermediate");
  expect_partition(vocab, 163840, "vocab");
  expect_partition(dense, 18432, "dense intermediate");
  EXPECT_EQ(layout.share(3).heads, (Range{36, 48}));
  EXPECT_EQ(layout.share(3).expert_inter, (Range{768, 1024}));
  EXPECT_EQ(layout.describe(3), "rank 3/8: heads 36..47 (12), experts 0..383 inter 768..1023, vocab 61440..81919");
}

TEST(ParallelLayout, ExpertParallelGivesWholeExpertsPerRank) {
  ModelConfig m;
  const ParallelLayout layout(tp(8, 8), m);
  EXPECT_EQ(layout.experts_per_rank(), 32);
  std::vector<Range> experts;
  for (int r = 0; r < 8; ++r) {
    experts.push_back(layout.share(r).experts);
    EXPECT_EQ(layout.share(r).expert_inter, (Range{0, 2048}));
    EXPECT_EQ(layout.share(r).shared_inter, (Range{256 * r, 256 * (r + 1)}));  // shared experts stay TP-split
  }
  expect_partition(experts, 256, "experts");
}

TEST(ParallelLayout, AllToAllCombineKeepsTheSharedExpertsWhole) {
  ModelConfig m;
  ParallelConfig p = tp(8, 8);
  p.ep_alltoall = true;
  const ParallelLayout layout(p, m);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(layout.share(r).experts, (Range{32 * r, 32 * (r + 1)}));
    EXPECT_EQ(layout.share(r).shared_inter, (Range{0, 2048}));  // each token's owner runs them whole
  }
  p = tp(8);
  p.ep_alltoall = true;
  EXPECT_EQ(layout_error(p, m),
            "--ep-combine alltoall: needs expert parallelism (--enable-expert-parallel) on more than one rank");
}

TEST(ParallelLayout, TwelveHeadFixtureAtTp2AndTp4) {
  const ModelConfig m = fixture("h12_qlora_grouped_yarn");
  for (int n : {2, 4}) {
    const ParallelLayout layout(tp(n), m);
    EXPECT_EQ(layout.heads_per_rank(), 12 / n);
    std::vector<Range> heads, vocab, inter;
    for (int r = 0; r < n; ++r) {
      heads.push_back(layout.share(r).heads);
      vocab.push_back(layout.share(r).vocab);
      inter.push_back(layout.share(r).expert_inter);
    }
    expect_partition(heads, 12, "heads");
    expect_partition(vocab, m.vocab_size, "vocab");
    expect_partition(inter, m.moe_intermediate_size, "expert intermediate");
  }
  EXPECT_EQ(ParallelLayout(tp(4), m).share(2).heads, (Range{6, 9}));
  // EP2 and TP2 inside each expert group at four ranks.
  const ParallelLayout hybrid(tp(4, 2), m);
  EXPECT_EQ(hybrid.share(1).experts, (Range{0, 8}));
  EXPECT_EQ(hybrid.share(1).expert_inter, (Range{12, 24}));
  EXPECT_EQ(hybrid.share(2).experts, (Range{8, 16}));
  EXPECT_EQ(hybrid.share(2).expert_inter, (Range{0, 12}));
}

TEST(ParallelLayout, VocabularyThatDoesNotDivideLeavesTheLastRankShort) {
  ModelConfig m = fixture("h5_noqlora_dense2_odd");  // 151 tokens, 5 heads
  m.moe_intermediate_size = 40;                      // widths that split five ways
  m.n_shared_experts = 1;
  const ParallelLayout layout(tp(5), m);
  EXPECT_EQ(layout.vocab_per_rank(), 31);
  EXPECT_EQ(layout.share(4).vocab, (Range{124, 151}));
  std::vector<Range> vocab;
  for (int r = 0; r < 5; ++r) vocab.push_back(layout.share(r).vocab);
  expect_partition(vocab, 151, "vocab");
}

TEST(ParallelLayout, DcpGroupsAndTokenOwners) {
  ModelConfig m;
  ParallelConfig p = tp(8, 1, 2);
  p.dcp_interleave = 4;
  const ParallelLayout layout(p, m);
  EXPECT_EQ(layout.share(5).dcp_rank, 1);
  EXPECT_EQ(layout.share(5).heads, (Range{80, 96}));
  EXPECT_EQ(layout.share(5).dcp_group_heads, (Range{64, 96}));  // ranks 4 and 5 attend over each other's heads
  EXPECT_EQ(layout.kv_owner(0), 0);
  EXPECT_EQ(layout.kv_owner(3), 0);
  EXPECT_EQ(layout.kv_owner(4), 1);
  EXPECT_EQ(layout.kv_owner(9), 0);
  EXPECT_EQ(layout.describe(5),
            "rank 5/8: heads 80..95 (16), experts 0..255 inter 1280..1535, vocab 80800..96959, dcp rank 1/2");
}

TEST(ParallelLayout, SizesThatDoNotFitAreNamed) {
  const ModelConfig m12 = fixture("h12_qlora_grouped_yarn");  // 12 heads, 16 experts of width 24
  const ModelConfig m5 = fixture("h5_noqlora_dense2_odd");    // 5 heads
  EXPECT_EQ(layout_error(tp(2), m5), "--tp 2: the model's 5 attention heads do not split evenly");
  EXPECT_EQ(layout_error(tp(8), m12), "--tp 8: the model's 12 attention heads do not split evenly");
  EXPECT_EQ(layout_error(tp(3, 3), m12),
            "expert parallelism over 3: the model's 16 routed experts do not split evenly");
  ParallelConfig p = tp(4);
  p.world_size = 8;
  EXPECT_NE(layout_error(p, m12).find("--tp 4 on 8 ranks"), std::string::npos);
  EXPECT_EQ(layout_error(tp(4, 3), m12), "expert-parallel size 3: must divide the 4 ranks");
  EXPECT_EQ(layout_error(tp(4, 1, 3), m12), "--dcp 3: must divide --tp 4 (a DCP group lies within the TP ranks)");
  ModelConfig narrow = m12;
  narrow.moe_intermediate_size = 10;
  EXPECT_EQ(layout_error(tp(4), narrow),
            "tensor parallelism 4 inside the experts: moe_intermediate_size 10 does not split evenly");
  EXPECT_EQ(layout_error(tp(0), m12), "parallel layout: world size 0 (needs at least 1)");
  EXPECT_THROW(ParallelLayout(tp(2), m12).share(2), Error);
}

}  // namespace
}  // namespace kiln::test
