// MLA attention on the GPU against the CPU reference: absorbed (paged decode, split-KV,
// multi-token) and expanded (prefill, varlen, causal with a cached prefix), across head counts
// {1, 5, 8, 12, 16, 24, 64, 128}, contexts 1..32k and batches 1..256; plus padding is harmless.
#include <algorithm>

#include "parity_util.h"

namespace kiln::test {
namespace {

constexpr int64_t kLora = 512, kRope = 64, kRow = kLora + kRope, kBlock = 64;

struct DecodeCase {
  int64_t heads;
  std::vector<int32_t> kv_lens;
  int64_t q_per_seq;
};

// Runs absorbed attention on one backend; blocks are handed out in a scrambled order.
std::vector<float> run_absorbed(ops::Backend& be, const DecodeCase& c, const std::vector<float>& q,
                                const std::vector<float>& pool, int64_t max_blocks, const std::vector<int32_t>& table) {
  const int64_t B = static_cast<int64_t>(c.kv_lens.size()), total_q = B * c.q_per_seq;
  std::vector<int32_t> cu(static_cast<size_t>(B + 1));
  for (int64_t b = 0; b <= B; ++b) cu[static_cast<size_t>(b)] = static_cast<int32_t>(b * c.q_per_seq);
  auto tq = put(be, q), tp = put(be, pool), tt = put_raw(be, table, DType::I32),
       tl = put_raw(be, c.kv_lens, DType::I32), tc = put_raw(be, cu, DType::I32);
  auto to = poisoned(be, static_cast<size_t>(total_q * c.heads * kLora));
  be.mla_absorbed({tq.f32(),
                   {tp.f32(), tt.t.as<int32_t>(), tl.t.as<int32_t>(), kBlock, max_blocks},
                   tc.t.as<int32_t>(),
                   B,
                   total_q,
                   to.f32(),
                   c.heads,
                   kLora,
                   kRope,
                   0.07f});
  return get(be, to);
}

struct DecodeInputs {
  std::vector<float> q, pool;
  std::vector<int32_t> table;
  int64_t max_blocks;
};

DecodeInputs make_decode(const DecodeCase& c, uint64_t seed) {
  DecodeInputs in;
  const int64_t B = static_cast<int64_t>(c.kv_lens.size());
  const int64_t longest = *std::max_element(c.kv_lens.begin(), c.kv_lens.end());
  in.max_blocks = (longest + kBlock - 1) / kBlock;
  const int64_t blocks = B * in.max_blocks;
  in.table.resize(static_cast<size_t>(blocks));
  std::iota(in.table.begin(), in.table.end(), 0);
  std::shuffle(in.table.begin(), in.table.end(), std::mt19937_64(seed));
  in.pool = randn(static_cast<size_t>(blocks * kBlock * kRow), seed + 1);
  in.q = randn(static_cast<size_t>(B * c.q_per_seq * c.heads * kRow), seed + 2, 0.5f);
  return in;
}

TEST(MlaParity, AbsorbedAcrossHeadsContextsBatches) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  std::vector<DecodeCase> cases;
  for (int64_t h : {1, 5, 8, 12, 16, 24, 64, 128}) cases.push_back({h, {1}, 1});
  for (int32_t ctx : {17, 300, 4096, 32768}) cases.push_back({16, {ctx}, 1});
  cases.push_back({128, {8192}, 1});
  cases.push_back({12, {5000, 33, 1, 777}, 1});              // mixed lengths
  cases.push_back({12, std::vector<int32_t>(256, 100), 1});  // batch 256
  cases.push_back({24, {900, 64}, 4});                       // speculative: 4 queries
  uint64_t seed = 100;
  for (const auto& c : cases) {
    auto in = make_decode(c, seed += 10);
    auto ref = run_absorbed(*cpu, c, in.q, in.pool, in.max_blocks, in.table);
    auto got = run_absorbed(*gpu, c, in.q, in.pool, in.max_blocks, in.table);
    EXPECT_LE(norm_err(ref, got), 1e-4) << c.heads << " heads, " << c.kv_lens.size() << " seqs, first ctx "
                                        << c.kv_lens[0] << ", " << c.q_per_seq << " q/seq";
  }
}

TEST(MlaParity, AbsorbedPaddingToSixteenHeadsIsHarmless) {
  KILN_NEED_GPU();
  auto& gpu = backends().gpu;
  DecodeCase c12{12, {3000}, 2}, c16{16, {3000}, 2};
  auto in16 = make_decode(c16, 7);
  // The same 12 heads, then 4 extra heads of other data.
  std::vector<float> q12;
  for (int64_t r = 0; r < 2; ++r)
    q12.insert(q12.end(), in16.q.begin() + r * 16 * kRow, in16.q.begin() + (r * 16 + 12) * kRow);
  auto out12 = run_absorbed(*gpu, c12, q12, in16.pool, in16.max_blocks, in16.table);
  auto out16 = run_absorbed(*gpu, c16, in16.q, in16.pool, in16.max_blocks, in16.table);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t i = 0; i < 12 * kLora; ++i)
      ASSERT_EQ(out12[static_cast<size_t>(r * 12 * kLora + i)], out16[static_cast<size_t>(r * 16 * kLora + i)]);
}

struct PrefillCase {
  int64_t heads, qk, v;
  std::vector<int32_t> q_lens, kv_lens;  // kv_len >= q_len: the rest is a cached prefix
};

std::vector<float> run_expanded(ops::Backend& be, const PrefillCase& c, const std::vector<float>& q,
                                const std::vector<float>& k, const std::vector<float>& v) {
  std::vector<int32_t> cu_q = {0}, cu_kv = {0};
  for (size_t b = 0; b < c.q_lens.size(); ++b) {
    cu_q.push_back(cu_q.back() + c.q_lens[b]);
    cu_kv.push_back(cu_kv.back() + c.kv_lens[b]);
  }
  auto tq = put(be, q), tk = put(be, k), tv = put(be, v), tcq = put_raw(be, cu_q, DType::I32),
       tck = put_raw(be, cu_kv, DType::I32);
  auto to = poisoned(be, static_cast<size_t>(cu_q.back() * c.heads * c.v));
  be.mla_expanded({tq.f32(),
                   tk.f32(),
                   tv.f32(),
                   to.f32(),
                   {tcq.t.as<int32_t>(), tck.t.as<int32_t>(), static_cast<int64_t>(c.q_lens.size())},
                   cu_q.back(),
                   c.heads,
                   c.qk,
                   c.v,
                   0.09f});
  return get(be, to);
}

TEST(MlaParity, ExpandedPrefillVarlenCausal) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  std::vector<PrefillCase> cases;
  for (int64_t h : {1, 5, 8, 12, 16, 24, 64, 128}) cases.push_back({h, 192, 128, {37}, {37}});
  cases.push_back({12, 192, 128, {1000, 3, 64}, {1500, 3, 200}});  // chunks over cached prefixes
  cases.push_back({5, 30, 20, {17, 1}, {17, 9}});                  // odd head dims
  cases.push_back({16, 192, 128, {2048}, {2048}});
  uint64_t seed = 500;
  for (const auto& c : cases) {
    int64_t tq = 0, tkv = 0;
    for (size_t b = 0; b < c.q_lens.size(); ++b) tq += c.q_lens[b], tkv += c.kv_lens[b];
    auto q = randn(static_cast<size_t>(tq * c.heads * c.qk), seed += 3, 0.5f);
    auto k = randn(static_cast<size_t>(tkv * c.heads * c.qk), seed + 1, 0.5f);
    auto v = randn(static_cast<size_t>(tkv * c.heads * c.v), seed + 2);
    auto ref = run_expanded(*cpu, c, q, k, v), got = run_expanded(*gpu, c, q, k, v);
    EXPECT_LE(norm_err(ref, got), 1e-4) << c.heads << " heads, qk " << c.qk << ", " << c.q_lens.size() << " seqs";
  }
}

// 12 heads alone and the same 12 heads inside a 16-head problem give identical outputs.
TEST(MlaParity, ExpandedTwelveHeadsInsideSixteen) {
  KILN_NEED_GPU();
  auto& gpu = backends().gpu;
  const int64_t T = 300, qk = 192, vd = 128;
  PrefillCase c16{16, qk, vd, {static_cast<int32_t>(T)}, {static_cast<int32_t>(T)}};
  PrefillCase c12{12, qk, vd, {static_cast<int32_t>(T)}, {static_cast<int32_t>(T)}};
  auto q16 = randn(static_cast<size_t>(T * 16 * qk), 1), k16 = randn(static_cast<size_t>(T * 16 * qk), 2),
       v16 = randn(static_cast<size_t>(T * 16 * vd), 3);
  auto first12 = [&](const std::vector<float>& x, int64_t d) {
    std::vector<float> r;
    for (int64_t t = 0; t < T; ++t) r.insert(r.end(), x.begin() + t * 16 * d, x.begin() + (t * 16 + 12) * d);
    return r;
  };
  auto out16 = run_expanded(*gpu, c16, q16, k16, v16);
  auto out12 = run_expanded(*gpu, c12, first12(q16, qk), first12(k16, qk), first12(v16, vd));
  EXPECT_EQ(first12(out16, vd), out12);
}

}  // namespace
}  // namespace kiln::test
