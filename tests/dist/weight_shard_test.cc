// Per-rank weight slices: every checkpoint tensor of every fixture is either whole on every rank
// or split so that the ranks' slices tile it exactly once; the projections split the way tensor
// parallelism needs; fp8 scale ranges cover a slice.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "core/error.h"
#include "dist/weight_shard.h"
#include "model/config.h"
#include "model/weight_layout.h"

namespace kiln::test {
namespace {

using dist::ParallelConfig;
using dist::ParallelLayout;
using dist::Range;
using dist::WeightShard;

ParallelConfig sizes(int world, int ep) {
  ParallelConfig p;
  p.world_size = world;
  p.tp = world;
  p.ep = ep;
  return p;
}

// Each tensor's slices over all ranks: held whole by every rank, or tiling it exactly once (a
// routed expert under EP: tiling it within the one group that holds it).
void expect_tiles(const ModelConfig& m, const ParallelLayout& layout, const std::string& where) {
  const int world = layout.parallel().world_size;
  for (const WeightSpec& w : weight_layout(m)) {
    int whole = 0, held = 0;
    int64_t numel = 0;
    for (int r = 0; r < world; ++r) {
      const WeightShard s = dist::weight_shard(w, m, layout, r);
      if (!s.held) continue;
      ++held;
      if (s.dim < 0) ++whole;
      numel += dist::shard_numel(w, s);
    }
    if (whole > 0) {
      EXPECT_EQ(whole, held) << where << " " << w.name << ": whole on some ranks, split on others";
      const bool expert_under_ep = w.role == WeightRole::RoutedExpert && layout.parallel().ep > 1;
      EXPECT_EQ(held, expert_under_ep ? world / layout.parallel().ep : world) << where << " " << w.name;
    } else {
      EXPECT_EQ(numel, w.numel()) << where << " " << w.name << ": the slices do not tile the tensor";
    }
  }
}

TEST(WeightShard, EveryFixtureTensorIsWholeOrTiledAtEveryLayout) {
  const std::string dir = std::string(KILN_TEST_DATA) + "/fixtures";
  int layouts = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const ModelConfig m = load_model_config((entry.path() / "config.json").string());
    for (int world : {1, 2, 4})
      for (int ep : {1, world}) {
        try {
          const ParallelLayout layout(sizes(world, ep), m);
          expect_tiles(
              m, layout,
              entry.path().filename().string() + " world " + std::to_string(world) + " ep " + std::to_string(ep));
          ++layouts;
        } catch (const Error&) {  // a size this fixture does not divide: ParallelLayout's own tests
        }
      }
  }
  EXPECT_GE(layouts, 12);
}

TEST(WeightShard, ProjectionsSplitByHeadsAndIntermediateSlices) {
  ModelConfig m;  // DeepSeek-V3: 128 heads, qk 192, v 128
  const ParallelLayout tp8(sizes(8, 1), m);
  std::map<std::string, WeightSpec> by_name;
  for (const WeightSpec& w : weight_layout(m)) by_name.emplace(w.name, w);
  auto shard = [&](const std::string& name, int rank) { return dist::weight_shard(by_name.at(name), m, tp8, rank); };
  EXPECT_EQ(shard("model.layers.3.self_attn.q_b_proj.weight", 1), (WeightShard{true, 0, {16 * 192, 32 * 192}}));
  EXPECT_EQ(shard("model.layers.3.self_attn.kv_b_proj.weight", 1), (WeightShard{true, 0, {16 * 256, 32 * 256}}));
  EXPECT_EQ(shard("model.layers.3.self_attn.o_proj.weight", 1), (WeightShard{true, 1, {16 * 128, 32 * 128}}));
  EXPECT_EQ(shard("model.layers.3.self_attn.kv_a_proj_with_mqa.weight", 1), WeightShard{});
  EXPECT_EQ(shard("model.layers.3.mlp.experts.7.up_proj.weight", 2), (WeightShard{true, 0, {512, 768}}));
  EXPECT_EQ(shard("model.layers.3.mlp.experts.7.down_proj.weight", 2), (WeightShard{true, 1, {512, 768}}));
  EXPECT_EQ(shard("model.layers.0.mlp.down_proj.weight", 2), (WeightShard{true, 1, {4608, 6912}}));
  EXPECT_EQ(shard("model.layers.3.mlp.gate.weight", 2), WeightShard{});
  EXPECT_EQ(shard("lm_head.weight", 7), (WeightShard{true, 0, {113120, 129280}}));

  const ParallelLayout ep8(sizes(8, 8), m);
  const WeightSpec& expert40 = by_name.at("model.layers.3.mlp.experts.40.gate_proj.weight");
  EXPECT_EQ(dist::weight_shard(expert40, m, ep8, 1), WeightShard{});  // experts 32..63: whole
  EXPECT_FALSE(dist::weight_shard(expert40, m, ep8, 0).held);
  EXPECT_EQ(dist::shard_numel(expert40, dist::weight_shard(expert40, m, ep8, 0)), 0);
}

TEST(WeightShard, ScaleRangesCoverTheSlice) {
  EXPECT_EQ(dist::scale_range({256, 512}, 128), (Range{2, 4}));  // aligned
  EXPECT_EQ(dist::scale_range({6, 12}, 16), (Range{0, 1}));      // inside one block
  EXPECT_EQ(dist::scale_range({12, 24}, 16), (Range{0, 2}));     // straddles a block edge
  EXPECT_EQ(dist::scale_range({5, 5}, 16), (Range{0, 0}));
  EXPECT_THROW(dist::scale_range({0, 4}, 0), Error);
}

}  // namespace
}  // namespace kiln::test
