// The absorbed form's folds in fused ops: the W_uk fold inside mla_prepare (the attention prologue
// in one launch), the fused op against linear_heads + the unfused op on the CPU (bitwise), and CUDA
// against the CPU; and the W_uv fold with o_proj (heads_then_linear, the epilogue).
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "parity_util.h"

namespace kiln::test {
namespace {

constexpr int64_t kLora = 512, kRope = 64;

// mla_prepare with the W_uk fold, laid out as the absorbed form has it: q [T, heads, nope + rope]
// a view of a projection row with `pad` spare columns after the kv part (3: q rows not float4
// aligned), into qa [T, heads, lora + rope] = q_lat ‖ roped q_pe.
struct FoldCase {
  int64_t heads, tokens, nope = 128, rope = kRope, lora = kLora, pad = 0;
  DType w_dtype = DType::BF16;  // of w_uk and the norm weight (their values are bf16-exact either way)
  int64_t qk() const { return nope + rope; }
  int64_t row() const { return lora + rope; }
  int64_t ld() const { return heads * qk() + row() + pad; }
  std::string str() const {
    return std::to_string(heads) + " heads, " + std::to_string(tokens) + " tokens, nope " + std::to_string(nope) +
           ", lora " + std::to_string(lora) + ", pad " + std::to_string(pad) + ", " + dtype_name(w_dtype) + " w_uk";
  }
};

struct FoldInputs {
  std::vector<float> proj, w_uk, norm_w, inv_freq;  // [T, ld], [heads, lora, nope] and [lora] bf16-exact
  std::vector<int32_t> pos, slots;                  // [T]
};

FoldInputs make_fold(const FoldCase& c, uint64_t seed) {
  FoldInputs in;
  in.proj = randn(static_cast<size_t>(c.tokens * c.ld()), seed);
  in.w_uk = bf16_round(randn(static_cast<size_t>(c.heads * c.lora * c.nope), seed + 1, 0.1f));
  in.norm_w = bf16_round(randn(static_cast<size_t>(c.lora), seed + 2));
  for (int64_t i = 0; i < c.rope / 2; ++i)
    in.inv_freq.push_back(std::pow(10000.0f, -static_cast<float>(2 * i) / static_cast<float>(c.rope)));
  for (int64_t t = 0; t < c.tokens; ++t) {
    in.pos.push_back(static_cast<int32_t>((t * 7919 + seed) % 32768));
    in.slots.push_back(static_cast<int32_t>(t * 5 + 3));  // distinct, spread over the pool
  }
  return in;
}

struct FoldOut {
  std::vector<float> qa, pool;  // [T, heads, row] and [5T + 7, row] f32, both NaN-poisoned before
};

// fused: one mla_prepare with the fold; otherwise linear_heads, then mla_prepare without it (the
// model's absorbed branch before the fusion).
FoldOut run_fold(ops::Backend& be, const FoldCase& c, const FoldInputs& in, bool fused) {
  const int64_t T = c.tokens, H = c.heads, row = c.row(), ld = c.ld();
  const DType wdt = c.w_dtype;
  auto proj = put(be, in.proj), wuk = put(be, in.w_uk, wdt), nw = put(be, in.norm_w, wdt), inv = put(be, in.inv_freq);
  auto pos = put_raw(be, in.pos, DType::I32), slots = put_raw(be, in.slots, DType::I32);
  auto pool = poisoned(be, static_cast<size_t>((T * 5 + 7) * row)), qa = poisoned(be, static_cast<size_t>(T * H * row));
  ops::MlaPrepareParams p{.q_in = proj.f32() + c.nope,
                          .q_in_stride = ld,
                          .q_in_head_stride = c.qk(),
                          .q_out = qa.f32() + c.lora,
                          .q_out_stride = H * row,
                          .q_out_head_stride = row,
                          .num_heads = H,
                          .kva = proj.f32() + H * c.qk(),
                          .kva_stride = ld,
                          .norm_weight = nw.t.data,
                          .norm_weight_dtype = wdt,
                          .eps = 1e-6f,
                          .positions = pos.t.as<int32_t>(),
                          .inv_freq = inv.f32(),
                          .attention_factor = 1.3f,
                          .interleaved = true,
                          .slots = slots.t.as<int32_t>(),
                          .pool = pool.t.data,
                          .pool_dtype = DType::F32,
                          .num_tokens = T,
                          .kv_lora = c.lora,
                          .rope_dim = c.rope,
                          .q_nope = proj.f32(),
                          .w_uk = wuk.t.data,
                          .w_uk_dtype = wdt,
                          .nope_dim = c.nope,
                          .q_lat = qa.f32()};
  if (!fused) {
    be.linear_heads(
        {proj.f32(), ld, c.qk(), wuk.t.data, c.lora * c.nope, wdt, qa.f32(), H * row, row, H, T, c.lora, c.nope});
    p.w_uk = nullptr;
  }
  be.mla_prepare(p);
  return {get(be, qa), get(be, pool)};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// CPU only (runs in CI): the fold inside mla_prepare is exactly linear_heads then mla_prepare.
TEST(MlaCpu, PrepareFoldEqualsLinearHeadsThenPrepare) {
  auto& cpu = *backends().cpu;
  uint64_t seed = 900;
  std::vector<FoldCase> cases;
  for (int64_t h : {1, 5, 24, 128})
    for (int64_t t : {1, 3, 9}) cases.push_back({h, t});
  cases.push_back({5, 9, 16, 8, 36, 3});  // a small model's shape (odd latent width, narrow rope)
  cases.push_back({8, 3, 128, kRope, kLora, 0, DType::F32});
  for (const FoldCase& c : cases) {
    const FoldInputs in = make_fold(c, ++seed);
    const FoldOut fused = run_fold(cpu, c, in, true), ops = run_fold(cpu, c, in, false);
    EXPECT_TRUE(same_bits(fused.qa, ops.qa)) << c.str();
    EXPECT_TRUE(same_bits(fused.pool, ops.pool)) << c.str();
  }
}

// The GPU folds <= 8 tokens inside the prologue's launch (16-byte bf16 loads, or scalars for f32
// weights, odd nope and unaligned q rows) and more through the batched GEMM. Bounds: q_lat as
// Parity.LinearHeads (f32 products summed in another order; beyond 8 tokens q is split into two
// bf16 halves, ~16 bits); q_pe and the pool are the plain prologue's, f32 rounding.
TEST(MlaParity, PrepareWithFold) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  uint64_t seed = 950;
  std::vector<FoldCase> cases;
  for (int64_t h : {1, 5, 8, 12, 16, 24, 64, 128})
    for (int64_t t : {1, 3, 8, 9, 64}) cases.push_back({h, t});
  for (int64_t t : {3, 9}) {
    cases.push_back({12, t, 128, kRope, kLora, 3});             // q rows not float4-aligned
    cases.push_back({5, t, 16, 8, 36, 3});                      // a small model's shape
    cases.push_back({5, t, 36, 8, 36, 0});                      // nope % 8 != 0
    cases.push_back({8, t, 128, kRope, kLora, 0, DType::F32});  // f32 weights
  }
  for (const FoldCase& c : cases) {
    const FoldInputs in = make_fold(c, ++seed);
    const FoldOut want = run_fold(*cpu, c, in, true), got = run_fold(*gpu, c, in, true);
    std::vector<float> wl, wp, gl, gp;  // q_lat and q_pe values of qa
    for (size_t i = 0; i < want.qa.size(); ++i) {
      const bool lat = static_cast<int64_t>(i) % c.row() < c.lora;
      (lat ? wl : wp).push_back(want.qa[i]);
      (lat ? gl : gp).push_back(got.qa[i]);
    }
    EXPECT_LE(norm_err(wl, gl), 1e-4) << c.str();  // every value written: poison would be infinite error
    EXPECT_LE(norm_err(wp, gp), 1e-5) << c.str();
    int64_t written = 0;
    compare_pool(want.pool, got.pool, false, c.str(), written);  // an f32 pool
    if (HasFatalFailure()) return;
    EXPECT_EQ(written, c.tokens * c.row()) << c.str();
  }
}

// Backend::heads_then_linear (W_uv per head, then o_proj with the residual added): CUDA runs one
// row in one launch (heads_linear.cu), which must give the CPU's result and the same bits as the
// two CUDA ops it replaces. Head counts 1-16 take it (Moonlight: 16 heads of 128 from 512, o_proj
// 2048); 24 and more heads (over its 48 KB of staged rows), two rows and k % 8 != 0 run the two
// ops, and must match as well (heads.n 40 with k 512 takes the one launch). That the one launch
// ran shows in the kernel trace (heads_linear_kernel), not here.
TEST(MlaParity, HeadsThenLinear) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  struct S {
    int64_t m, heads, n, k, out;
    bool add;
  };
  uint64_t seed = 1200;
  for (const S s : {S{1, 16, 128, 512, 2048, true}, S{1, 1, 128, 512, 2048, true}, S{1, 5, 128, 512, 1000, false},
                    S{1, 8, 128, 512, 2048, true}, S{1, 12, 128, 512, 1536, true}, S{1, 16, 64, 512, 777, true},
                    S{1, 24, 128, 512, 2048, true}, S{1, 64, 128, 512, 1024, true}, S{1, 128, 128, 512, 1024, false},
                    S{2, 16, 128, 512, 2048, true}, S{1, 5, 40, 90, 300, true}, S{1, 5, 40, 512, 300, true}}) {
    const int64_t xs = s.heads * s.k, ks = s.heads * s.n;
    const auto x = randn(static_cast<size_t>(s.m * xs), ++seed);
    const auto w_uv = bf16_round(randn(static_cast<size_t>(s.heads * s.n * s.k), ++seed, 0.05f));
    const auto w_o = bf16_round(randn(static_cast<size_t>(s.out * ks), ++seed, 0.05f));
    const auto add = randn(static_cast<size_t>(s.m * s.out), ++seed);
    // y (and the intermediate v) of one backend, fused into one op or as the two ops.
    auto run = [&](ops::Backend& be, bool fused) {
      const DType wt = be.device() == Device::CPU ? DType::F32 : DType::BF16;
      auto tx = put(be, x), tuv = put(be, w_uv, wt), to = put(be, w_o, wt), ta = put(be, add);
      auto tv = poisoned(be, static_cast<size_t>(s.m * ks)), ty = poisoned(be, static_cast<size_t>(s.m * s.out));
      const ops::LinearHeadsParams heads{tx.f32(), xs,  s.k,     tuv.t.data, s.n * s.k, wt, tv.f32(),
                                         ks,       s.n, s.heads, s.m,        s.n,       s.k};
      ops::LinearParams proj{tv.f32(), 0, to.t.data, wt, ty.f32(), 0, s.m, s.out, ks};
      if (s.add) proj.add = ta.f32();
      if (fused) {
        be.heads_then_linear(heads, proj);
      } else {
        be.linear_heads(heads);
        be.linear(proj);
      }
      return std::pair{get(be, tv), get(be, ty)};
    };
    const std::string what = std::to_string(s.m) + " rows, " + std::to_string(s.heads) + " heads of " +
                             std::to_string(s.n) + " from " + std::to_string(s.k) + ", out " + std::to_string(s.out);
    const auto want = run(*cpu, true), got = run(*gpu, true), two = run(*gpu, false);
    EXPECT_LE(norm_err(want.first, got.first), 1e-4) << what;
    EXPECT_LE(norm_err(want.second, got.second), 1e-4) << what;
    EXPECT_EQ(0, std::memcmp(got.second.data(), two.second.data(), got.second.size() * sizeof(float))) << what;
    EXPECT_EQ(0, std::memcmp(got.first.data(), two.first.data(), got.first.size() * sizeof(float))) << what;
    // Launch after launch on one stream (the barrier's counters carry over), fresh poison each time.
    for (int again = 0; again < 20; ++again) {
      const auto next = run(*gpu, true);
      ASSERT_EQ(0, std::memcmp(got.second.data(), next.second.data(), got.second.size() * sizeof(float))) << what;
    }
  }
}

}  // namespace
}  // namespace kiln::test
