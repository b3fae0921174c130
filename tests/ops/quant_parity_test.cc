// The CUDA backend's quantized-weight paths (src/ops/cuda/quant/) against the CPU reference, which
// dequantizes exactly and computes in f32: both backends get the same codes and scales. Decode-sized
// calls (GEMVs: f32 activations, weights decoded exactly in registers) must agree to accumulation
// order; prefill-sized ones expand the weights to bf16 first (each value rounded once, <= 2^-9
// relative) and multiply on the bf16 tensor-core paths, so they get a bound that rounding allows.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "moe_parity_util.h"
#include "ops/backend.h"
#include "parity_util.h"
#include "quant_util.h"

namespace kiln::test {
namespace {

enum class Kind { Fp8, Int4 };

struct QuantCase {
  Kind kind;
  int64_t block_n, block_k;
};
const QuantCase kFp8{Kind::Fp8, 128, 128}, kFp8Rows{Kind::Fp8, 1, 128}, kFp8Small{Kind::Fp8, 16, 16},
    kInt4{Kind::Int4, 1, 32};

std::string name(const QuantCase& q) {
  return std::string(q.kind == Kind::Fp8 ? "fp8 " : "int4 ") + std::to_string(q.block_n) + "x" +
         std::to_string(q.block_k);
}

// `mats` matrices of [n, k] quantized one by one, stacked (codes and scale grids contiguous).
QuantWeight quantize_stack(const QuantCase& q, const std::vector<float>& w, int64_t mats, int64_t n, int64_t k) {
  QuantWeight all;
  for (int64_t m = 0; m < mats; ++m) {
    const std::vector<float> one(w.begin() + m * n * k, w.begin() + (m + 1) * n * k);
    const QuantWeight part =
        q.kind == Kind::Fp8 ? quantize_fp8(one, n, k, q.block_n, q.block_k) : quantize_int4(one, n, k, q.block_k);
    all.fp8.insert(all.fp8.end(), part.fp8.begin(), part.fp8.end());
    all.words.insert(all.words.end(), part.words.begin(), part.words.end());
    all.scales.insert(all.scales.end(), part.scales.begin(), part.scales.end());
    all.scales_bf16.insert(all.scales_bf16.end(), part.scales_bf16.begin(), part.scales_bf16.end());
  }
  return all;
}

// A quantized weight on one backend: FP8 codes with f32 scales, INT4 words with bf16 scales.
struct OnBackend {
  ops::OwnedTensor w, s;
  DType dtype;
  ops::WeightScales scales;
  OnBackend(ops::Backend& be, const QuantCase& q, const QuantWeight& qw) {
    if (q.kind == Kind::Fp8) {
      w = put_raw(be, qw.fp8, DType::F8E4M3), s = put(be, qw.scales), dtype = DType::F8E4M3;
      scales = {s.t.data, DType::F32, q.block_n, q.block_k};
    } else {
      w = put_raw(be, qw.words, DType::I4X8), s = put_raw(be, qw.scales_bf16, DType::BF16), dtype = DType::I4X8;
      scales = {s.t.data, DType::BF16, q.block_n, q.block_k};
    }
  }
};

// Rows up to KILN_QUANT_GEMV_MAX_ROWS (32) take the GEMV, 8 rows a launch; more the bf16 expansion.
double gemv_or_gemm_bound(int64_t rows) {
  return rows <= 32 ? 1e-4 : 5e-3;
}

TEST(QuantParity, Linear) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  struct S {
    int64_t m, n, k;
    bool norm_add = false;
  };
  // 1-8 rows (one launch), 9-32 (several), past 32 (the bf16 expansion) to prefill sizes; odd n; k
  // past DeepSeek-V3's hidden; k not a multiple of the 16/32-column chunks (the scalar path).
  const S shapes[] = {{1, 64, 128},        {1, 2048, 7168},  {3, 301, 256, true}, {8, 3648, 2048},
                      {9, 300, 512, true}, {32, 520, 1024},  {33, 4096, 512},     {256, 512, 1024, true},
                      {1024, 384, 2048},   {8192, 256, 512}, {2, 130, 200},       {40, 130, 200}};
  uint64_t seed = 1;
  for (const QuantCase& q : {kFp8, kFp8Rows, kFp8Small, kInt4})
    for (const S& s : shapes) {
      ++seed;
      const auto x = randn(static_cast<size_t>(s.m * s.k), seed);
      const auto add = randn(static_cast<size_t>(s.m * s.n), seed + 1);
      const auto nw = randn(static_cast<size_t>(s.k), seed + 2, 0.5f);
      const QuantWeight qw = quantize_stack(q, randn(static_cast<size_t>(s.n * s.k), seed + 3, 0.1f), 1, s.n, s.k);
      std::vector<float> out[2];
      ops::Backend* be[2] = {cpu.get(), gpu.get()};
      for (int b = 0; b < 2; ++b) {
        OnBackend w(*be[b], q, qw);
        auto tx = put(*be[b], x), ta = put(*be[b], add), tn = put(*be[b], nw);
        auto ty = poisoned(*be[b], static_cast<size_t>(s.m * s.n));
        ops::LinearParams p{tx.f32(), 0, w.w.t.data, w.dtype, ty.f32(), 0, s.m, s.n, s.k};
        p.w_scales = w.scales;
        if (s.norm_add) p.norm_weight = tn.f32(), p.norm_eps = 1e-6f, p.add = ta.f32();
        be[b]->linear(p);
        out[b] = get(*be[b], ty);
      }
      EXPECT_LE(norm_err(out[0], out[1]), gemv_or_gemm_bound(s.m)) << name(q) << " " << s.m << "x" << s.n << "x" << s.k;
    }
}

TEST(QuantParity, LinearHeadsWithStrides) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  for (const QuantCase& q : {kFp8, kInt4})
    for (int64_t m : {1, 4, 9, 33, 300})
      for (int64_t heads : {1, 5, 16}) {
        // Strided like the model's W_uv: x rows and heads apart with gaps, y likewise.
        const int64_t n = 256, k = 512, xs = heads * (k + 64), ys = heads * (n + 64);
        const auto x = randn(static_cast<size_t>(m * xs), 20);
        const QuantWeight qw = quantize_stack(q, randn(static_cast<size_t>(heads * n * k), 21, 0.1f), heads, n, k);
        std::vector<float> out[2];
        ops::Backend* be[2] = {cpu.get(), gpu.get()};
        for (int b = 0; b < 2; ++b) {
          OnBackend w(*be[b], q, qw);
          auto tx = put(*be[b], x);
          auto ty = put(*be[b], std::vector<float>(static_cast<size_t>(m * ys), 0.0f));
          const int64_t head_elems = q.kind == Kind::Fp8 ? n * k : n * k / 8;
          ops::LinearHeadsParams p{tx.f32(), xs,     k + 64, w.w.t.data, head_elems, w.dtype, ty.f32(),
                                   ys,       n + 64, heads,  m,          n,          k};
          p.w_scales = w.scales;
          p.w_scale_head_stride = static_cast<int64_t>(qw.scales.size()) / heads;
          be[b]->linear_heads(p);
          out[b] = get(*be[b], ty);
        }
        EXPECT_LE(norm_err(out[0], out[1]), gemv_or_gemm_bound(m))
            << name(q) << " " << m << " rows, " << heads << " heads";
      }
}

// Routed experts quantized per expert; shared experts quantized the same way (FP8, as DeepSeek-V3
// ships them) or bf16 beside INT4 routed experts (Kimi K2-Thinking).
std::vector<float> run_quant_moe(ops::Backend& be, const QuantCase& q, const MoeShape& s, uint64_t seed,
                                 const std::vector<float>& x, const QuantWeight& gu, const QuantWeight& dn,
                                 const QuantWeight& sgu, const QuantWeight& sdn, const std::vector<float>& sgu_f,
                                 const std::vector<float>& sdn_f, const std::vector<float>* addv = nullptr) {
  OnBackend wgu(be, q, gu), wdn(be, q, dn);
  const auto idv = moe_routing(s, seed);
  std::vector<float> tw(idv.size());
  for (size_t i = 0; i < tw.size(); ++i) tw[i] = 0.05f + 0.9f * static_cast<float>((i * 37) % 101) / 101.0f;
  auto tx = put(be, x), ids = put_raw(be, idv, DType::I32), wts = put(be, tw);
  auto out = poisoned(be, x.size());
  ops::MoeParams p{
      tx.f32(), ids.t.as<int32_t>(), wts.f32(), wgu.w.t.data, wdn.w.t.data, wgu.dtype, out.f32(), s.tokens, s.hidden,
      s.inter,  s.experts,           s.top_k};
  p.w_gate_up_scales = wgu.scales, p.w_down_scales = wdn.scales;
  std::unique_ptr<OnBackend> qsgu, qsdn;
  ops::OwnedTensor bsgu, bsdn, ta;
  if (addv) ta = put(be, *addv), p.add = ta.f32();
  if (s.shared_inter > 0) {
    p.shared_inter = s.shared_inter;
    if (q.kind == Kind::Fp8) {
      qsgu = std::make_unique<OnBackend>(be, q, sgu), qsdn = std::make_unique<OnBackend>(be, q, sdn);
      p.w_shared_gate_up = qsgu->w.t.data, p.w_shared_down = qsdn->w.t.data;
      p.w_shared_gate_up_scales = qsgu->scales, p.w_shared_down_scales = qsdn->scales;
    } else {
      bsgu = put(be, sgu_f, DType::BF16), bsdn = put(be, sdn_f, DType::BF16);
      p.w_shared_dtype = DType::BF16, p.w_shared_gate_up = bsgu.t.data, p.w_shared_down = bsdn.t.data;
    }
  }
  be.moe(p);
  return get(be, out);
}

TEST(QuantParity, MoeExperts) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  std::vector<MoeShape> shapes;
  // Decode kernels to 64 tokens, the bf16 expansion past; 8-256 experts. Sizes keep the host side
  // (quantizing, the CPU reference) to seconds: the whole QuantParity set is meant to take well
  // under a minute of device time.
  for (int64_t T : {1, 2, 8, 33, 64, 65, 300, 1024})
    for (auto [E, k] : {std::pair<int64_t, int64_t>{8, 2}, {64, 6}}) shapes.push_back({T, 256, 128, E, k});
  for (int64_t T : {1, 8, 65}) shapes.push_back({T, 256, 128, 256, 8});
  shapes.push_back({8192, 256, 128, 8, 2});  // one prefill of 8k tokens
  // Moonlight's widths (2048 / 1408, two shared experts: 2816) over a few experts, decode sizes.
  for (int64_t T : {1, 8}) shapes.push_back({T, 2048, 1408, 2, 2, MoeRouting::Random, 2816});
  // Odd widths (the scalar path: rows not whole 16/32-column chunks), few experts with tokens.
  shapes.push_back({5, 264, 136, 9, 3, MoeRouting::Random, 136});
  shapes.push_back({70, 264, 136, 9, 3, MoeRouting::FewExperts, 136});
  shapes.push_back({8, 256, 128, 16, 4, MoeRouting::OneHot, 256});
  uint64_t seed = 500;
  for (const QuantCase& q : {kFp8, kInt4})
    for (const MoeShape& s : shapes) {
      ++seed;
      const int64_t E = s.experts, H = s.hidden, I = s.inter, S = s.shared_inter;
      const auto gu = quantize_stack(q, moe_uniform(static_cast<size_t>(E * 2 * I * H), seed, 0.08f), E, 2 * I, H);
      const auto dn = quantize_stack(q, moe_uniform(static_cast<size_t>(E * H * I), seed + 1, 0.08f), E, H, I);
      const auto sgu_f = bf16_round(moe_uniform(static_cast<size_t>(2 * S * H), seed + 2, 0.08f));
      const auto sdn_f = bf16_round(moe_uniform(static_cast<size_t>(H * S), seed + 3, 0.08f));
      QuantWeight sgu, sdn;
      if (S > 0) sgu = quantize_stack(q, sgu_f, 1, 2 * S, H), sdn = quantize_stack(q, sdn_f, 1, H, S);
      const auto x = randn(static_cast<size_t>(s.tokens * H), seed + 4);
      std::vector<float> out[3];
      ops::Backend* be[3] = {cpu.get(), gpu.get(), gpu.get()};
      for (int b = 0; b < 3; ++b) out[b] = run_quant_moe(*be[b], q, s, seed, x, gu, dn, sgu, sdn, sgu_f, sdn_f);
      const std::string what = name(q) + ", " + std::to_string(s.tokens) + " tokens, " + std::to_string(H) + "/" +
                               std::to_string(I) + ", " + std::to_string(E) + " experts, top-" +
                               std::to_string(s.top_k) + ", shared " + std::to_string(S);
      EXPECT_LE(norm_err(out[0], out[1]), s.tokens <= 64 ? 1e-4 : 5e-3) << what;
      EXPECT_EQ(0, std::memcmp(out[1].data(), out[2].data(), out[1].size() * sizeof(float))) << what;
    }
}

// The residual add fused into quantized experts, at a decode size and a prefill size.
TEST(QuantParity, MoeWithAdd) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  for (const QuantCase& q : {kFp8, kInt4})
    for (int64_t T : {3, 100}) {
      const MoeShape s{T, 512, 256, 16, 4, MoeRouting::Random, 256};
      const auto gu = quantize_stack(q, moe_uniform(static_cast<size_t>(16 * 512 * 512), 7, 0.08f), 16, 512, 512);
      const auto dn = quantize_stack(q, moe_uniform(static_cast<size_t>(16 * 512 * 256), 8, 0.08f), 16, 512, 256);
      const auto sgu_f = bf16_round(moe_uniform(static_cast<size_t>(512 * 512), 9, 0.08f));
      const auto sdn_f = bf16_round(moe_uniform(static_cast<size_t>(512 * 256), 10, 0.08f));
      const auto sgu = quantize_stack(q, sgu_f, 1, 512, 512), sdn = quantize_stack(q, sdn_f, 1, 512, 256);
      const auto x = randn(static_cast<size_t>(T * 512), 11), add = randn(static_cast<size_t>(T * 512), 12);
      std::vector<float> out[2];
      ops::Backend* be[2] = {cpu.get(), gpu.get()};
      for (int b = 0; b < 2; ++b) out[b] = run_quant_moe(*be[b], q, s, 13, x, gu, dn, sgu, sdn, sgu_f, sdn_f, &add);
      EXPECT_LE(norm_err(out[0], out[1]), T <= 64 ? 1e-4 : 5e-3) << name(q) << " " << T;
    }
}

}  // namespace
}  // namespace kiln::test
