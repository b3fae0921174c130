// MoE ops, CUDA against the CPU reference: the router (with and without its fused gate
// projection) and the routed + shared experts across token counts, expert counts and widths.
#include <algorithm>
#include <cstring>
#include <string>

#include "moe_parity_util.h"
#include "parity_util.h"

namespace kiln::test {
namespace {

struct RouterShape {
  int64_t tokens, experts, top_k, groups, topk_groups;
};

TEST(Parity, RouterChoosesTheSameExperts) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  for (RouterShape r : {RouterShape{1, 8, 2, 4, 2}, RouterShape{37, 64, 6, 1, 1}, RouterShape{256, 256, 8, 8, 4},
                        RouterShape{19, 384, 8, 1, 1}, RouterShape{5, 16, 3, 4, 2}}) {
    auto logits = randn(static_cast<size_t>(r.tokens * r.experts), 8, 2.0f);
    auto bias = randn(static_cast<size_t>(r.experts), 9, 0.05f);
    std::vector<float> w[2];
    std::vector<int32_t> ids[2];
    ops::Backend* be[2] = {cpu.get(), gpu.get()};
    for (int b = 0; b < 2; ++b) {
      auto tl = put(*be[b], logits), tb = put(*be[b], bias);
      auto tw = poisoned(*be[b], static_cast<size_t>(r.tokens * r.top_k));
      auto ti = be[b]->alloc(DType::I32, {r.tokens * r.top_k});
      be[b]->router({tl.f32(), tb.f32(), ti.t.as<int32_t>(), tw.f32(), r.tokens, r.experts, r.top_k, r.groups,
                     r.topk_groups, true, 2.5f});
      w[b] = get(*be[b], tw);
      ids[b].resize(static_cast<size_t>(r.tokens * r.top_k));
      be[b]->download(ids[b].data(), ti.t);
    }
    EXPECT_EQ(ids[0], ids[1]) << r.experts << " experts";
    EXPECT_LE(norm_err(w[0], w[1]), 1e-5);
  }
}

// The gate projection inside the routing op: one launch up to 8 tokens, per-expert CTAs over
// 8-token chunks to 256, a tiled GEMM beyond (its tails: tokens and experts past a 64-wide tile, H
// past a 32-wide k step, cp.async for H % 4 == 0 and plain loads for an odd H; H split over CTAs
// into 1-32 slices summed in order; a gate exact in bf16, as checkpoints store it, skips the
// 3xTF32 terms of its zero remainder). Logits repeat bit for bit.
TEST(Parity, RouterWithFusedGate) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  struct Shape {
    int64_t tokens, experts, hidden, top_k, groups, topk_groups;
    bool bf16_gate = false;
    bool ties = false;         // zero gate and bias: every score ties, and the lower index must win
    float bias_offset = 0.0f;  // < -1: every kept score is negative, below the 0.0 of dropped groups
  };
  for (Shape r : {Shape{1, 64, 2048, 6, 1, 1},
                  Shape{2, 64, 2048, 6, 1, 1},
                  Shape{3, 256, 7168, 8, 8, 4},
                  Shape{4, 8, 90, 2, 4, 2},
                  Shape{2, 4, 64, 2, 1, 1},
                  Shape{5, 64, 96, 6, 1, 1},
                  Shape{6, 72, 2048, 6, 1, 1},
                  Shape{8, 512, 7168, 8, 8, 4},
                  Shape{8, 384, 100, 8, 1, 1},
                  Shape{9, 64, 2048, 6, 1, 1},
                  Shape{64, 64, 2048, 6, 1, 1},
                  Shape{256, 72, 100, 6, 1, 1},
                  Shape{257, 64, 2048, 6, 1, 1},
                  Shape{300, 256, 512, 8, 8, 4},
                  Shape{1000, 64, 2050, 6, 1, 1},
                  Shape{333, 72, 100, 6, 1, 1},
                  Shape{520, 512, 99, 8, 8, 4},
                  Shape{1000, 64, 2048, 6, 1, 1, true},
                  Shape{8000, 64, 2048, 6, 1, 1, true},
                  Shape{1, 64, 2048, 6, 1, 1, false, true},
                  Shape{3, 72, 96, 6, 1, 1, false, true},
                  Shape{2, 256, 7168, 8, 8, 4, false, true},
                  Shape{300, 64, 2048, 6, 1, 1, false, true},
                  Shape{4, 128, 96, 8, 8, 4, false, true},
                  Shape{3, 64, 2048, 6, 8, 2, false, false, -5.0f},
                  Shape{2, 256, 512, 8, 8, 4, false, false, -5.0f}}) {
    const auto x = randn(static_cast<size_t>(r.tokens * r.hidden), 21);
    auto gate = randn(static_cast<size_t>(r.experts * r.hidden), 22, 0.05f);
    if (r.bf16_gate) gate = bf16_round(gate);
    auto bias = randn(static_cast<size_t>(r.experts), 23, 0.05f);
    if (r.ties) std::fill(gate.begin(), gate.end(), 0.0f), std::fill(bias.begin(), bias.end(), 0.0f);
    for (float& b : bias) b += r.bias_offset;
    std::vector<float> w[2], logits[2];
    std::vector<int32_t> ids[2];
    ops::Backend* be[2] = {cpu.get(), gpu.get()};
    for (int b = 0; b < 2; ++b) {
      auto tx = put(*be[b], x), tg = put(*be[b], gate), tb = put(*be[b], bias);
      auto tl = poisoned(*be[b], static_cast<size_t>(r.tokens * r.experts));
      auto tw = poisoned(*be[b], static_cast<size_t>(r.tokens * r.top_k));
      auto ti = be[b]->alloc(DType::I32, {r.tokens * r.top_k});
      ops::RouterParams p{nullptr, tb.f32(), ti.t.as<int32_t>(), tw.f32(), r.tokens, r.experts,
                          r.top_k, r.groups, r.topk_groups,      true,     2.5f};
      p.x = tx.f32(), p.gate_weight = tg.f32(), p.gate_logits = tl.f32(), p.hidden = r.hidden;
      be[b]->router(p);
      const auto first = get(*be[b], tl);
      be[b]->router(p);  // twice: the same bits on every run
      w[b] = get(*be[b], tw);
      logits[b] = get(*be[b], tl);
      EXPECT_EQ(first, logits[b]) << r.tokens << " tokens: logits differ between two runs";
      ids[b].resize(static_cast<size_t>(r.tokens * r.top_k));
      be[b]->download(ids[b].data(), ti.t);
    }
    const std::string what = std::to_string(r.tokens) + " tokens, " + std::to_string(r.experts) + " experts, hidden " +
                             std::to_string(r.hidden);
    EXPECT_LE(norm_err(logits[0], logits[1]), 1e-5) << what;
    EXPECT_EQ(ids[0], ids[1]) << what;
    EXPECT_LE(norm_err(w[0], w[1]), 1e-5) << what;
  }
}

// The router with the post-attention norm fused in: gate logits, choices, weights and the
// normalised input it writes (the experts' input), fused or as rms_norm then the router.
struct NormRouterCase {
  int64_t tokens, experts, hidden;
  bool residual;
  std::string str() const {
    return std::to_string(tokens) + " tokens, " + std::to_string(experts) + " experts, hidden " +
           std::to_string(hidden) + (residual ? ", residual" : "");
  }
};

struct NormRouterOut {
  std::vector<float> logits, weights, normed;
  std::vector<int32_t> ids;
};

NormRouterOut run_norm_router(ops::Backend& be, const NormRouterCase& r, bool fused) {
  const int64_t T = r.tokens, E = r.experts, H = r.hidden, k = 6;
  const DType ndt = be.device() == Device::CUDA ? DType::BF16 : DType::F32;
  auto x = put(be, randn(static_cast<size_t>(T * H), 31)), res = put(be, randn(static_cast<size_t>(T * H), 32));
  auto nw = put(be, bf16_round(randn(static_cast<size_t>(H), 33)), ndt);
  auto gate = put(be, randn(static_cast<size_t>(E * H), 34, 0.05f)), bias = put(be, randn(static_cast<size_t>(E), 35));
  auto logits = poisoned(be, static_cast<size_t>(T * E)), wts = poisoned(be, static_cast<size_t>(T * k));
  auto normed = poisoned(be, static_cast<size_t>(T * H)), sum = poisoned(be, static_cast<size_t>(T * H));
  auto ids = be.alloc(DType::I32, {T * k});
  ops::RouterParams p{nullptr, bias.f32(), ids.t.as<int32_t>(), wts.f32(), T, E, k, 1, 1, true, 2.5f};
  p.gate_weight = gate.f32(), p.gate_logits = logits.f32(), p.hidden = H;
  if (fused) {
    p.x = x.f32(), p.norm_weight = nw.t.data, p.norm_weight_dtype = ndt, p.norm_eps = 1e-6f;
    p.norm_residual = r.residual ? res.f32() : nullptr, p.normed_x = normed.f32();
    for (int rep = 0; rep < 2; ++rep) be.router(p);  // twice: nothing carries over between calls
  } else {
    ops::RmsNormParams n{x.f32(), 0, nw.t.data, ndt, normed.f32(), 0, T, H, 1e-6f};
    if (r.residual) n.residual = res.f32(), n.sum = sum.f32();
    be.rms_norm(n);
    p.x = normed.f32();
    be.router(p);
  }
  NormRouterOut o{get(be, logits), get(be, wts), get(be, normed), std::vector<int32_t>(static_cast<size_t>(T * k))};
  be.download(o.ids.data(), ids.t);
  return o;
}

// Fused-launch token counts (1, 5, 8; the decode cluster has 8 CTAs, so 6 experts leave two without
// any, and 100 give each CTA a full chunk of 8 and a partial one), the chunked gate (9) and the tiled
// GEMM (300); an odd width (scalar loads).
const NormRouterCase kNormRouterCases[] = {
    {1, 64, 2048, true}, {1, 64, 2048, false}, {5, 64, 96, true},   {8, 64, 2048, true},   {3, 16, 90, true},
    {2, 6, 64, true},    {4, 100, 2048, true}, {9, 64, 2048, true}, {300, 64, 2048, true}, {300, 64, 100, false}};

TEST(OpsCpu, RouterWithNormEqualsNormThenRouter) {
  auto& cpu = *backends().cpu;
  for (const NormRouterCase& r : kNormRouterCases) {
    const NormRouterOut fused = run_norm_router(cpu, r, true), ops = run_norm_router(cpu, r, false);
    EXPECT_EQ(fused.normed, ops.normed) << r.str();
    EXPECT_EQ(fused.logits, ops.logits) << r.str();
    EXPECT_EQ(fused.ids, ops.ids) << r.str();
    EXPECT_EQ(fused.weights, ops.weights) << r.str();
  }
}

TEST(Parity, RouterWithFusedNorm) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  for (const NormRouterCase& r : kNormRouterCases) {
    const NormRouterOut want = run_norm_router(*cpu, r, true), got = run_norm_router(*gpu, r, true);
    EXPECT_LE(norm_err(want.normed, got.normed), 1e-5) << r.str();
    EXPECT_LE(norm_err(want.logits, got.logits), 1e-5) << r.str();
    EXPECT_EQ(want.ids, got.ids) << r.str();
    EXPECT_LE(norm_err(want.weights, got.weights), 1e-5) << r.str();
  }
}

TEST(Parity, MoeExperts) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  std::vector<MoeShape> shapes;
  // Every token count (<= 8: decode GEMVs; more: device-sorted grouped GEMMs) at 96/40, sizes
  // that are not multiples of any tile, across expert counts and top-k.
  for (int64_t T : {1, 4, 5, 8, 32, 128, 256, 1000, 8192})
    for (auto [E, k] : {std::pair<int64_t, int64_t>{8, 1}, {64, 6}, {256, 8}, {8, 8}})
      shapes.push_back({T, 96, 40, E, k});
  // Model widths: Moonlight (2048/1408, 64 experts, k 6) and DeepSeek-V3 (7168/2048, few experts).
  for (int64_t T : {4, 5, 64, 256}) shapes.push_back({T, 2048, 1408, 64, 6});
  for (int64_t T : {5, 32}) shapes.push_back({T, 7168, 2048, 8, 8});
  // K not a multiple of 8 (the scalar weight-load path); experts without tokens; one expert taking
  // every token (its rows span many tiles).
  shapes.push_back({37, 90, 36, 6, 2});
  shapes.push_back({300, 100, 52, 16, 4});
  shapes.push_back({200, 96, 40, 64, 6, MoeRouting::FewExperts});
  shapes.push_back({8192, 96, 40, 64, 6, MoeRouting::OneHot});
  shapes.push_back({256, 2048, 1408, 64, 6, MoeRouting::OneHot});
  // Shared experts in the same op: decode GEMVs (<= 8 tokens) and the grouped path, model widths
  // (Moonlight: 2 shared experts, DeepSeek-V3: 1) and odd ones (scalar loads).
  for (int64_t T : {1, 2, 3, 4, 5, 8, 16, 17, 64}) shapes.push_back({T, 2048, 1408, 64, 6, MoeRouting::Random, 2816});
  shapes.push_back({16, 2048, 1408, 64, 6, MoeRouting::FewExperts, 2816});
  for (int64_t T : {1, 4, 37}) shapes.push_back({T, 96, 40, 8, 2, MoeRouting::Random, 80});
  for (int64_t T : {1, 3, 6}) shapes.push_back({T, 90, 36, 6, 2, MoeRouting::Random, 36});
  shapes.push_back({37, 90, 36, 6, 2, MoeRouting::Random, 38});  // the shared SwiGLU's scalar path
  shapes.push_back({1, 7168, 2048, 8, 8, MoeRouting::Random, 2048});
  // Decode GEMVs with experts chosen by many tokens: every token's slot 0, few experts, every token
  // taking all 4; then one without shared experts.
  shapes.push_back({8, 1024, 256, 16, 6, MoeRouting::OneHot, 512});
  shapes.push_back({6, 1024, 256, 16, 6, MoeRouting::FewExperts, 512});
  shapes.push_back({7, 256, 64, 4, 4, MoeRouting::Random, 64});
  shapes.push_back({2, 512, 128, 8, 2, MoeRouting::Random});
  // Prefill-sized steps on the wgmma kernels (>= 256 tokens, widths multiples of 64): random, few
  // experts (most get none) and one expert in every token's slot 0; Moonlight widths.
  // MoePrefillPathsAgree covers the cuBLASLt and mma.sync paths at these sizes.
  for (auto r : {MoeRouting::Random, MoeRouting::FewExperts, MoeRouting::OneHot})
    shapes.push_back({1100, 256, 128, 16, 4, r, 256});
  shapes.push_back({2048, 2048, 1408, 64, 6, MoeRouting::Random, 2816});
  uint64_t seed = 100;
  for (const MoeShape& s : shapes) {
    ++seed;
    // Both backends take the same bf16 weights; x stays f32 (the GPU must keep its precision).
    const auto x = randn(static_cast<size_t>(s.tokens * s.hidden), seed);
    std::vector<float> out[3];  // cpu, gpu, gpu again
    ops::Backend* be[3] = {cpu.get(), gpu.get(), gpu.get()};
    for (int b = 0; b < 3; ++b) out[b] = run_moe_experts(*be[b], s, seed, x);
    const std::string what = std::to_string(s.tokens) + " tokens, " + std::to_string(s.hidden) + "/" +
                             std::to_string(s.inter) + ", " + std::to_string(s.experts) + " experts, top-" +
                             std::to_string(s.top_k) + ", routing " + std::to_string(static_cast<int>(s.routing)) +
                             ", shared " + std::to_string(s.shared_inter);
    // Both GPU paths keep f32 activations as bf16 hi + lo pairs (~16 mantissa bits): only
    // accumulation order and that split separate them from the f32 reference.
    EXPECT_LE(norm_err(out[0], out[1]), 1e-4) << what;
    // The expert sort lands rows in a run-dependent order; results must not depend on it.
    EXPECT_EQ(0, std::memcmp(out[1].data(), out[2].data(), out[1].size() * sizeof(float))) << what;
  }
}

// The residual add fused into the experts' output (out = experts + add), fused or added after.
std::vector<float> run_moe_add(ops::Backend& be, const MoeShape& s, uint64_t seed, bool fused) {
  const auto add = randn(static_cast<size_t>(s.tokens * s.hidden), seed + 3);
  auto out =
      run_moe_experts(be, s, seed, randn(static_cast<size_t>(s.tokens * s.hidden), seed), fused ? &add : nullptr);
  if (!fused)
    for (size_t i = 0; i < out.size(); ++i) out[i] += add[i];
  return out;
}

// Decode GEMVs (1, 8 tokens), the grouped mma.sync path (64) and the wgmma one (1100), with and
// without shared experts.
const MoeShape kMoeAddShapes[] = {
    {1, 1024, 256, 16, 6, MoeRouting::Random, 512},
    {8, 1024, 256, 16, 6, MoeRouting::Random, 512},
    {64, 1024, 256, 16, 6, MoeRouting::Random, 512},
    {1, 96, 40, 8, 2},
    {8, 90, 36, 6, 2, MoeRouting::Random, 36},
    {64, 96, 40, 8, 2},
    {1100, 256, 128, 16, 4, MoeRouting::Random, 256},  // the wgmma path
    // Decode down segments: a short last one (1544 / 8 = 193 chunks in 2), scalar rows in 3
    {1, 256, 1544, 8, 2, MoeRouting::Random, 1544},
    {3, 90, 404, 6, 2, MoeRouting::Random, 404}};

TEST(OpsCpu, MoeWithAddEqualsMoeThenAdd) {
  auto& cpu = *backends().cpu;
  uint64_t seed = 900;
  for (const MoeShape& s : kMoeAddShapes) {
    seed += 17;
    EXPECT_EQ(run_moe_add(cpu, s, seed, true), run_moe_add(cpu, s, seed, false)) << s.tokens << " tokens";
  }
}

TEST(Parity, MoeWithAdd) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  uint64_t seed = 900;
  for (const MoeShape& s : kMoeAddShapes) {
    seed += 17;
    EXPECT_LE(norm_err(run_moe_add(*cpu, s, seed, true), run_moe_add(*gpu, s, seed, true)), 1e-4)
        << s.tokens << " tokens, hidden " << s.hidden << ", shared " << s.shared_inter;
  }
}

// The decode down kernel with one or two outputs a CTA (KILN_MOE_DOWN_OUTPUTS, read per call): the
// same sums in the same order, so the same bits, and the CPU's values (Moonlight's widths, a short
// last segment, scalar rows, no shared experts).
TEST(Parity, MoeDecodeDownOutputs) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  const MoeShape shapes[] = {{1, 2048, 1408, 64, 6, MoeRouting::Random, 2816},
                             {8, 2048, 1408, 64, 6, MoeRouting::Random, 2816},
                             {1, 256, 1544, 8, 2, MoeRouting::Random, 1544},
                             {3, 90, 404, 6, 2, MoeRouting::Random, 404},
                             {5, 96, 40, 8, 2}};
  uint64_t seed = 2400;
  for (const MoeShape& s : shapes) {
    seed += 17;
    const std::string what = std::to_string(s.tokens) + " tokens, hidden " + std::to_string(s.hidden);
    std::vector<float> one, two;
    {
      const ScopedEnv outputs("KILN_MOE_DOWN_OUTPUTS", "1");
      one = run_moe_add(*gpu, s, seed, true);
    }
    {
      const ScopedEnv outputs("KILN_MOE_DOWN_OUTPUTS", "2");
      two = run_moe_add(*gpu, s, seed, true);
    }
    EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(float))) << what;
    EXPECT_LE(norm_err(run_moe_add(*cpu, s, seed, true), two), 1e-4) << what;
  }
}

// --activation-dtype bf16: every tensor-core path (grouped 16/32/64-row tiles, the skinny kernel,
// odd widths, cuBLASLt per expert, the shared MLP) multiplies x rounded to bf16 once, and the
// expert activation silu(g)·u rounded once more. Against the CPU on the same rounded x only that
// second rounding (2^-9 relative per value) and accumulation order remain; decode GEMVs (<= 8
// tokens) keep f32 activations and still match the f32 reference. The prefill paths (>= 256
// tokens: wgmma, or cuBLASLt, MoePrefillPathsAgree) also store the expert outputs y in bf16, and
// cuBLASLt gate/up too: up to three roundings per routed value instead of one: 3e-3 to 4e-3 of the
// largest output on these shapes in a CPU model of those roundings (4.2e-3 the worst over a dozen
// other seeds), hence their looser bound; a wrong row or dtype would be off by O(1).
TEST(Parity, MoeBf16Activations) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  const GpuActivations bf16(DType::BF16);
  struct Case {
    MoeShape s;
    bool add = false;  // MoeParams::add fused into the combine
  };
  const Case cases[] = {{{4, 2048, 1408, 64, 6, MoeRouting::Random, 2816}},   // decode GEMVs
                        {{16, 2048, 1408, 64, 6, MoeRouting::Random, 2816}},  // 16-row tiles, skinny kernel
                        {{200, 256, 128, 64, 6, MoeRouting::OneHot}},         // the same, one expert in every token
                        {{200, 256, 128, 16, 4, MoeRouting::Random}},         // 32-row tiles
                        {{1000, 96, 40, 8, 2, MoeRouting::Random, 80}},       // 64-row tiles
                        {{37, 90, 36, 6, 2, MoeRouting::Random, 36}},         // 16-row tiles, scalar weight loads
                        // wgmma: few experts (most get none), one expert in every token's slot 0,
                        // no shared experts, the residual add, Moonlight widths.
                        {{1100, 256, 128, 16, 4, MoeRouting::FewExperts, 256}},
                        {{1100, 256, 128, 16, 4, MoeRouting::OneHot, 256}},
                        {{1100, 256, 128, 16, 4, MoeRouting::Random}},
                        {{1100, 256, 128, 16, 4, MoeRouting::Random, 256}, true},
                        {{1024, 2048, 1408, 64, 6, MoeRouting::Random, 2816}}};
  uint64_t seed = 700;
  for (const auto& [s, with_add] : cases) {
    ++seed;
    const auto x = randn(static_cast<size_t>(s.tokens * s.hidden), seed);
    const auto add = randn(static_cast<size_t>(s.tokens * s.hidden), seed + 3);
    const auto* a = with_add ? &add : nullptr;
    const bool gemv = s.tokens <= 8, prefill = s.tokens >= 256;
    const auto want = run_moe_experts(*cpu, s, seed, gemv ? x : bf16_round(x), a);
    const auto got = run_moe_experts(*gpu, s, seed, x, a), again = run_moe_experts(*gpu, s, seed, x, a);
    const std::string what = std::to_string(s.tokens) + " tokens, hidden " + std::to_string(s.hidden) + ", routing " +
                             std::to_string(static_cast<int>(s.routing)) + ", shared " +
                             std::to_string(s.shared_inter) + (with_add ? ", add" : "");
    EXPECT_LE(norm_err(want, got), gemv ? 1e-4 : prefill ? 6e-3 : 4e-3) << what;
    EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * sizeof(float))) << what;
  }
}

// --expert-activation-dtype: the experts (routed and shared) multiply as that dtype says, whatever
// the rest does, so the op gives bit for bit what the whole backend in that dtype gives: f32
// activations with bf16 experts equal bf16 mode, bf16 activations with f32 experts equal f32 mode.
// On every path: decode GEMVs (f32 either way), mma.sync (16-row tiles), wgmma (with the residual
// add), cuBLASLt per expert (whose shared experts split x themselves) and Moonlight's widths.
TEST(Parity, MoeExpertActivationDtype) {
  KILN_NEED_GPU();
  auto& gpu = backends().gpu;
  struct Case {
    MoeShape s;
    const char* wgmma_min = "256";
    const char* cublas_min = "1000000000";
    bool add = false;
  };
  const Case cases[] = {{{4, 1024, 256, 16, 6, MoeRouting::Random, 512}},
                        {{17, 128, 64, 8, 2, MoeRouting::Random, 64}},
                        {{600, 320, 192, 16, 4, MoeRouting::Random, 128}, "256", "1000000000", true},
                        {{1100, 256, 128, 16, 4, MoeRouting::Random, 256}, "1000000000", "0", true},
                        {{1024, 2048, 1408, 64, 6, MoeRouting::Random, 2816}}};
  uint64_t seed = 1700;
  for (const Case& c : cases) {
    ++seed;
    const ScopedEnv wgmma("KILN_MOE_WGMMA_MIN_TOKENS", c.wgmma_min);
    const ScopedEnv cublas("KILN_MOE_CUBLAS_MIN_TOKENS", c.cublas_min);
    const MoeShape& s = c.s;
    const auto x = randn(static_cast<size_t>(s.tokens * s.hidden), seed);
    const auto add = randn(static_cast<size_t>(s.tokens * s.hidden), seed + 3);
    const auto* a = c.add ? &add : nullptr;
    const std::string what = std::to_string(s.tokens) + " tokens, " + std::to_string(s.hidden) + "/" +
                             std::to_string(s.inter) + (c.add ? ", add" : "");
    for (const DType rest : {DType::F32, DType::BF16}) {
      const DType experts = rest == DType::F32 ? DType::BF16 : DType::F32;
      std::vector<float> mixed, whole;
      {
        const GpuActivations act(rest);
        const GpuExpertActivations exp(experts);
        EXPECT_EQ(gpu->activation_dtype(), rest);  // the override leaves the rest as it was
        EXPECT_EQ(gpu->expert_activation_dtype(), experts);
        mixed = run_moe_experts(*gpu, s, seed, x, a);
        gpu->set_activation_dtype(rest);  // sets both: the override is gone
        EXPECT_EQ(gpu->expert_activation_dtype(), rest);
      }
      {
        const GpuActivations act(experts);
        whole = run_moe_experts(*gpu, s, seed, x, a);
      }
      EXPECT_EQ(0, std::memcmp(mixed.data(), whole.data(), mixed.size() * sizeof(float)))
          << what << ", experts " << dtype_name(experts) << " under " << dtype_name(rest);
    }
  }
}

// The three prefill expert paths, each against the CPU with f32 (hi/lo split) and bf16
// activations, and each repeating bit for bit: the wgmma kernels (from KILN_MOE_WGMMA_MIN_TOKENS,
// 0 here), the cuBLASLt per-expert GEMMs and the grouped mma.sync kernels (the other two reached
// by moving the thresholds, read per call). Shapes: inter 192 and hidden 320 leave a partly filled
// last column tile in both wgmma GEMMs; 17 tokens leave most of every 128-row tile as padding;
// expert 0 in every slot 0 of 320 and 321 tokens fills its last tile with exactly 64 and 65 rows
// in one pass (in the wgmma kernels' token-major form the second warpgroup then skips its MMAs,
// and then must not; the weight-major form's N is 64, then 80; in several passes 32 and 33);
// few experts (most get none) and one expert in every token's slot 0 (its rows span many tiles);
// the residual add, without and with shared experts (their down GEMM adds it); Moonlight widths
// with shared experts; 3,072 experts (the expert sort's multi-round scan). "several passes":
// KILN_MOE_PASS_BYTES = 4 MB splits every batch but the 17-token one into token chunks. "wgmma"
// mixes the kernels' two forms (tiles of up to 96 real rows weight-major, moe_wgmma.cu); the two
// "every tile" paths take one form each (KILN_MOE_WGMMA_WEIGHT_MAJOR_MAX 0 and 128). With bf16
// activations the wgmma and cuBLASLt paths also round the expert outputs y (and cuBLASLt gate/up)
// to bf16: MoeBf16Activations' bound.
TEST(Parity, MoePrefillPathsAgree) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  struct Case {
    MoeShape s;
    bool add = false;
  };
  const Case cases[] = {
      {{600, 320, 192, 16, 4, MoeRouting::Random, 128}},       {{17, 128, 64, 8, 2, MoeRouting::Random}},
      {{1100, 256, 128, 16, 4, MoeRouting::FewExperts, 256}},  {{1100, 256, 128, 16, 4, MoeRouting::OneHot}, true},
      {{600, 320, 192, 16, 4, MoeRouting::Random, 128}, true}, {{600, 2048, 1408, 64, 6, MoeRouting::Random, 2816}},
      {{2600, 64, 64, 3072, 8, MoeRouting::Random}},           {{320, 320, 192, 16, 4, MoeRouting::OneHot, 128}},
      {{321, 320, 192, 16, 4, MoeRouting::OneHot, 128}}};
  struct Path {
    const char* name;
    const char* wgmma_min;
    const char* cublas_min;
    float bf16_bound;
    const char* pass_bytes = "2147483648";
    const char* weight_major_max = nullptr;  // unset: the default
  };
  const Path paths[] = {{"wgmma", "0", "1000000000", 6e-3f},
                        {"wgmma, every tile token-major", "0", "1000000000", 6e-3f, "2147483648", "0"},
                        {"wgmma, every tile weight-major", "0", "1000000000", 6e-3f, "2147483648", "128"},
                        {"wgmma, several passes", "0", "1000000000", 6e-3f, "4000000"},
                        {"cuBLASLt", "1000000000", "0", 6e-3f},
                        {"mma.sync", "1000000000", "1000000000", 4e-3f}};
  uint64_t seed = 1300;
  for (const auto& [s, with_add] : cases) {
    ++seed;
    const auto x = randn(static_cast<size_t>(s.tokens * s.hidden), seed);
    const auto add = randn(static_cast<size_t>(s.tokens * s.hidden), seed + 3);
    const auto* a = with_add ? &add : nullptr;
    for (const DType act : {DType::F32, DType::BF16}) {
      const bool bf16 = act == DType::BF16;
      const GpuActivations dtype(act);
      const auto want = run_moe_experts(*cpu, s, seed, bf16 ? bf16_round(x) : x, a);
      for (const Path& path : paths) {
        const ScopedEnv wgmma("KILN_MOE_WGMMA_MIN_TOKENS", path.wgmma_min);
        const ScopedEnv passes("KILN_MOE_PASS_BYTES", path.pass_bytes);
        const ScopedEnv cublas("KILN_MOE_CUBLAS_MIN_TOKENS", path.cublas_min);
        const ScopedEnv form("KILN_MOE_WGMMA_WEIGHT_MAJOR_MAX", path.weight_major_max);
        const auto got = run_moe_experts(*gpu, s, seed, x, a), again = run_moe_experts(*gpu, s, seed, x, a);
        const std::string what = std::string(path.name) + (bf16 ? ", bf16" : ", f32") + " activations, " +
                                 std::to_string(s.tokens) + " tokens, " + std::to_string(s.hidden) + "/" +
                                 std::to_string(s.inter) + ", routing " + std::to_string(static_cast<int>(s.routing));
        EXPECT_LE(norm_err(want, got), bf16 ? path.bf16_bound : 1e-4f) << what;
        EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * sizeof(float))) << what;
      }
    }
  }
}

}  // namespace
}  // namespace kiln::test
