// The planner's memory fit and ceilings on the scenarios: Kimi K3 as its deployment
// describes it, Kimi K2 on 8 x H200, and the layout checks.
#include <gtest/gtest.h>

#include "core/error.h"
#include "plan/hardware.h"
#include "plan/planner.h"
#include "plan/presets.h"

namespace kiln::plan {
namespace {

Plan plan_for(const char* model, const char* gpu, int64_t per_node, int64_t nodes, WeightFormat f, Workload wl = {},
              Layout extra = {}) {
  const ModelPreset* m = find_preset(model);
  EXPECT_NE(m, nullptr) << model;
  Layout l = extra;
  l.gpus_per_node = per_node;
  l.nodes = nodes;
  PlanOptions o;
  o.weights = f;
  return make_plan(m->name, m->config, find_gpu(builtin_catalog(), gpu), l, wl, o);
}

Workload million_token_pool() {
  Workload wl;
  wl.kv_pool_tokens = 1000000;
  return wl;
}

TEST(KimiK3, ModelAsDescribed) {
  const ModelPreset* k3 = find_preset("Kimi-K3");
  ASSERT_NE(k3, nullptr);
  const ModelConfig& c = k3->config;
  EXPECT_NEAR(static_cast<double>(count_params(c).total), 2.8e12, 0.01 * 2.8e12);
  EXPECT_EQ(c.num_attention_heads, 96);
  EXPECT_EQ(c.num_attention_heads / 8, 12);  // 12 heads per GPU at TP8
  EXPECT_EQ(c.num_hidden_layers, 61);
  // bf16 MLA KV: 61 layers x 576 values x 2 bytes; a 1M-token pool is about 70 GB.
  EXPECT_EQ(kv_bytes_per_token(c, 2), 61 * 576 * 2);
  EXPECT_NEAR(static_cast<double>(kv_bytes_per_token(c, 2)) * 1e6, 70e9, 0.5e9);
}

TEST(KimiK3, WeightsOverOnePointFiveTerabytes) {
  // int4 experts with bf16 group-32 scales (Kimi K2 Thinking's format): 4.5 bits on the experts,
  // bf16 on the ~0.5% rest -> about 4.56 bits per parameter, 1.60 TB.
  const Plan int4 = plan_for("kimi-k3", "B300", 8, 1, WeightFormat::Int4Experts);
  EXPECT_GT(int4.w.bytes, 1.5e12);
  EXPECT_NEAR(int4.bits_per_param, 4.56, 0.03);
  // An 8-bit scale per 32 (MXFP4) lands on the deployment's own figure: just over 1.5 TB at ~4.3 bits.
  const Plan fp4 = plan_for("kimi-k3", "B300", 8, 1, WeightFormat::Mxfp4Experts);
  EXPECT_GT(fp4.w.bytes, 1.5e12);
  EXPECT_NEAR(fp4.bits_per_param, 4.3, 0.05);
  // In int4 the weights alone exceed a B200 node's 8 x 192 GB; in MXFP4 they squeeze in, but with
  // no room for the reserve and the pool (WhichNodesHoldWeightsAndAMillionTokenPool).
  EXPECT_GT(int4.w.bytes, 8 * find_gpu(builtin_catalog(), "B200").hbm_visible_bytes);
}

TEST(KimiK3, WhichNodesHoldWeightsAndAMillionTokenPool) {
  for (WeightFormat f : {WeightFormat::Int4Experts, WeightFormat::Mxfp4Experts}) {
    SCOPED_TRACE(weight_format_name(f));
    const Plan b200 = plan_for("kimi-k3", "B200", 8, 1, f, million_token_pool());
    EXPECT_FALSE(b200.fits);
    EXPECT_LT(b200.margin_bytes_per_gpu, 0);
    const Plan b200x2 = plan_for("kimi-k3", "B200", 8, 2, f, million_token_pool());
    EXPECT_TRUE(b200x2.fits) << b200x2.margin_bytes_per_gpu;
    EXPECT_EQ(b200x2.layout.tp, 16);
    EXPECT_GE(b200x2.kv_capacity_tokens, 1000000);
    for (const char* gpu : {"MI355X", "B300"}) {
      const Plan p = plan_for("kimi-k3", gpu, 8, 1, f, million_token_pool());
      EXPECT_TRUE(p.fits) << gpu << " short by " << -p.margin_bytes_per_gpu;
      EXPECT_GE(p.kv_capacity_tokens, 1000000) << gpu;
      // The pool is replicated on every TP rank: 70 GB on each GPU.
      EXPECT_NEAR(p.required_kv_bytes_per_gpu, 70.272e9, 1e6);
    }
  }
  // --context 1000000 (one sequence that long) asks the same of the memory.
  Workload one_long;
  one_long.context = 1000000;
  EXPECT_TRUE(plan_for("kimi-k3", "B300", 8, 1, WeightFormat::Int4Experts, one_long).fits);
  EXPECT_FALSE(plan_for("kimi-k3", "B200", 8, 1, WeightFormat::Int4Experts, one_long).fits);
}

TEST(KimiK2, Int4FitsOnEightH200WithAPoolAndBf16DoesNot) {
  const Plan int4 = plan_for("kimi-k2", "H200", 8, 1, WeightFormat::Int4Experts);
  EXPECT_TRUE(int4.fits);
  EXPECT_NEAR(static_cast<double>(int4.w.bytes), 594e9, 2e9);
  // About 69 GB of pool per GPU at 70,272 B per token: close to a million tokens.
  EXPECT_GT(int4.kv_pool_bytes_per_gpu, 60e9);
  EXPECT_GT(int4.kv_capacity_tokens, 900000);
  EXPECT_LT(int4.kv_capacity_tokens, 1100000);
  EXPECT_GT(int4.max_sequences, 500);  // at the default 1024 + 400 context
  const Plan bf16 = plan_for("kimi-k2", "H200", 8, 1, WeightFormat::Bf16);
  EXPECT_FALSE(bf16.fits);
  EXPECT_LT(bf16.kv_pool_bytes_per_gpu, 0);
  EXPECT_EQ(bf16.kv_capacity_tokens, 0);
}

TEST(Planner, DcpAndAttentionDpChangeWhereKvLives) {
  Layout dcp;
  dcp.dcp = 8;
  const Plan base = plan_for("kimi-k2", "H200", 8, 1, WeightFormat::Int4Experts);
  const Plan split = plan_for("kimi-k2", "H200", 8, 1, WeightFormat::Int4Experts, {}, dcp);
  EXPECT_DOUBLE_EQ(split.kv_bytes_per_token_per_gpu, base.kv_bytes_per_token_per_gpu / 8);
  EXPECT_NEAR(static_cast<double>(split.kv_capacity_tokens), 8.0 * static_cast<double>(base.kv_capacity_tokens), 8.0);
  // Attention DP replicates attention weights (TP1) but gives each group its own pool.
  Layout dp;
  dp.attn_dp = 8;
  const Plan dp8 = plan_for("kimi-k2", "H200", 8, 1, WeightFormat::Int4Experts, {}, dp);
  EXPECT_EQ(dp8.layout.tp, 1);
  EXPECT_GT(dp8.w.bytes_per_gpu, base.w.bytes_per_gpu);
  EXPECT_GT(dp8.kv_capacity_tokens, base.kv_capacity_tokens);
  // A sequence cannot spread over DP groups: a 1M-token sequence needs it all in one group.
  Workload one_long;
  one_long.context = 1000000;
  EXPECT_FALSE(plan_for("kimi-k2", "H200", 8, 1, WeightFormat::Int4Experts, one_long, dp).fits);
}

TEST(Planner, DecodeCeilingFollowsTheRoofline) {
  const Plan p = plan_for("kimi-k2", "H200", 8, 1, WeightFormat::Int4Experts);
  // Batch 1 reads exactly top-k experts per layer and is bandwidth-bound.
  EXPECT_NEAR(p.decode_single.distinct_experts, 8.0, 1e-9);
  EXPECT_STREQ(p.decode_single.bound, "memory");
  EXPECT_NEAR(p.decode_single.time_s,
              std::max(p.decode_single.mem_s, p.decode_single.compute_s) + p.decode_single.comm_s, 1e-15);
  EXPECT_NEAR(p.decode_single.mem_s, p.decode_single.bytes / 4.8e12, 1e-15);
  EXPECT_GT(p.decode_single.comm_s, 0);
  // Larger batches: more experts, slower steps, more aggregate throughput.
  EXPECT_GT(p.decode.distinct_experts, p.decode_single.distinct_experts);
  EXPECT_GT(p.decode.time_s, p.decode_single.time_s);
  EXPECT_GT(p.decode_aggregate_tok_s, p.single_stream_tok_s);
  EXPECT_LE(p.aggregate_tok_s, p.decode_aggregate_tok_s);  // prefill costs time
  EXPECT_NEAR(p.single_stream_tok_s, 1.0 / p.decode_single.time_s, 1e-9);
  EXPECT_NEAR(p.tok_s_per_gpu * 8, p.aggregate_tok_s, 1e-6);
  EXPECT_NEAR(p.usd_per_million_tokens, 8 * 2.5 / (p.aggregate_tok_s * 3600) * 1e6, 1e-9);
  // Twice the GPUs: each reads fewer bytes per step.
  const Plan two_nodes = plan_for("kimi-k2", "H200", 8, 2, WeightFormat::Int4Experts);
  EXPECT_LT(two_nodes.decode_single.mem_s, p.decode_single.mem_s);
}

TEST(Planner, LayoutErrorsNameTheFlag) {
  const ModelConfig& k2 = find_preset("kimi-k2")->config;
  auto expect_error = [&](Layout l, const char* flag) {
    try {
      resolve_layout(k2, l);
      FAIL() << "expected an error mentioning " << flag;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
  };
  Layout l;
  l.gpus_per_node = 6;  // 64 heads do not split 6 ways
  expect_error(l, "--tp");
  l = {};
  l.dcp = 3;
  expect_error(l, "--dcp");
  l = {};
  l.ep = 5;
  expect_error(l, "--ep");
  l = {};
  l.tp = 4;  // 4 x 1 != 8
  expect_error(l, "--tp");
  l = {};
  l.attn_dp = 3;
  expect_error(l, "--attn-dp");
}

TEST(Presets, MatchPublishedSizes) {
  EXPECT_NEAR(static_cast<double>(count_params(find_preset("deepseek-v3")->config).total), 671e9, 1e9);
  EXPECT_NEAR(static_cast<double>(count_params(find_preset("kimi-k2")->config).total), 1.026e12, 2e9);
  EXPECT_NEAR(static_cast<double>(count_params(find_preset("moonlight")->config).total), 15.96e9, 0.1e9);
  EXPECT_EQ(find_preset("nope"), nullptr);
}

}  // namespace
}  // namespace kiln::plan
