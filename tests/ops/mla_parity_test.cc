// MLA attention on the GPU against the CPU reference: absorbed (paged decode over the bf16 and f32
// latent pools, split-KV, multi-token, padding sequences) and expanded (prefill, varlen, causal
// with a cached prefix), across head counts {1, 5, 8, 12, 16, 24, 64, 128}, contexts 1..32k and
// batches 1..256; plus padding heads are harmless (mla_prepare's W_uk fold: mla_prepare_fold_test.cc).
// The MlaCpu tests need no GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

#include "parity_util.h"

namespace kiln::test {
namespace {

constexpr int64_t kLora = 512, kRope = 64, kRow = kLora + kRope;

struct DecodeCase {
  int64_t heads;
  std::vector<int32_t> kv_lens;  // 0: a padding sequence (zero output, block table never read)
  int64_t q_per_seq;
  int64_t block_size = 64;
};

struct DecodeInputs {
  std::vector<float> q, pool;  // pool values are bf16-representable
  std::vector<int32_t> table;
  int64_t max_blocks;
};

// Blocks are handed out in a scrambled order; padding sequences' table rows point far outside the
// pool, so reading them would fault (GPU) or trip ASan (CPU).
DecodeInputs make_decode(const DecodeCase& c, uint64_t seed) {
  DecodeInputs in;
  const int64_t B = static_cast<int64_t>(c.kv_lens.size()), bs = c.block_size;
  const int64_t longest = std::max<int64_t>(1, *std::max_element(c.kv_lens.begin(), c.kv_lens.end()));
  in.max_blocks = (longest + bs - 1) / bs;
  const int64_t blocks = B * in.max_blocks;
  std::vector<int32_t> ids(static_cast<size_t>(blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
  in.table = ids;
  for (int64_t b = 0; b < B; ++b)
    if (c.kv_lens[static_cast<size_t>(b)] == 0)
      std::fill_n(in.table.begin() + b * in.max_blocks, in.max_blocks, 1 << 30);
  in.pool = bf16_round(randn(static_cast<size_t>(blocks * bs * kRow), seed + 1));
  in.q = randn(static_cast<size_t>(B * c.q_per_seq * c.heads * kRow), seed + 2, 0.5f);
  return in;
}

// Runs absorbed attention on one backend over a pool of `pool_dtype`, into a NaN-poisoned output.
std::vector<float> run_absorbed(ops::Backend& be, const DecodeCase& c, const std::vector<float>& q,
                                const DecodeInputs& in, DType pool_dtype) {
  const int64_t B = static_cast<int64_t>(c.kv_lens.size()), total_q = B * c.q_per_seq;
  std::vector<int32_t> cu(static_cast<size_t>(B + 1));
  for (int64_t b = 0; b <= B; ++b) cu[static_cast<size_t>(b)] = static_cast<int32_t>(b * c.q_per_seq);
  auto tq = put(be, q), tp = put(be, in.pool, pool_dtype), tt = put_raw(be, in.table, DType::I32),
       tl = put_raw(be, c.kv_lens, DType::I32), tc = put_raw(be, cu, DType::I32);
  auto to = poisoned(be, static_cast<size_t>(total_q * c.heads * kLora));
  be.mla_absorbed({tq.f32(),
                   {tp.t.data, pool_dtype, tt.t.as<int32_t>(), tl.t.as<int32_t>(), c.block_size, in.max_blocks},
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

std::string describe(const DecodeCase& c) {
  return std::to_string(c.heads) + " heads, " + std::to_string(c.kv_lens.size()) + " seqs, first ctx " +
         std::to_string(c.kv_lens[0]) + ", " + std::to_string(c.q_per_seq) + " q/seq, block " +
         std::to_string(c.block_size);
}

// Rows of padding sequences must be exactly zero (and so finite: nothing NaN-poisoned survives).
void expect_padding_zero(const DecodeCase& c, const std::vector<float>& out) {
  const size_t per_seq = static_cast<size_t>(c.q_per_seq * c.heads * kLora);
  for (size_t b = 0; b < c.kv_lens.size(); ++b) {
    if (c.kv_lens[b] != 0) continue;
    for (size_t i = 0; i < per_seq; ++i) ASSERT_EQ(out[b * per_seq + i], 0.0f) << describe(c) << ", seq " << b;
  }
}

// The bf16 pool on the GPU (tensor-core kernel) against the CPU reference over the same bf16 pool.
// Bound: the kernel rounds q and the softmax weights P to bf16 for the mma (2^-9 relative each);
// the CPU keeps both in f32. Emulating exactly that rounding on the CPU gives a normalised error
// (max |ref - got| / max |ref|) of 2e-3..3.5e-3 at 1..128 heads and contexts 1..32k; 1e-2 leaves
// margin while a wrong row, head or split (errors of order 1) still fails.
TEST(MlaParity, AbsorbedBf16PoolAcrossHeadsContextsBatches) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  ASSERT_EQ(gpu->kv_dtype(), DType::BF16);
  std::vector<DecodeCase> cases;
  for (int64_t h : {1, 5, 8, 12, 16, 24, 64, 128}) {
    cases.push_back({h, {1}, 1});
    cases.push_back({h, {700}, 1});
  }
  for (int32_t ctx : {17, 300, 4096, 8192, 32768}) cases.push_back({16, {ctx}, 1});
  cases.push_back({128, {8192}, 1});
  cases.push_back({64, {32768}, 1});
  cases.push_back({48, {2000, 31}, 1});                      // a head group with one idle tile
  cases.push_back({12, {5000, 33, 1, 777}, 1});              // mixed lengths
  cases.push_back({12, std::vector<int32_t>(256, 100), 1});  // batch 256
  cases.push_back({16, std::vector<int32_t>(64, 1000), 1});  // batch 64
  cases.push_back({128, std::vector<int32_t>(16, 600), 1});  // 128 heads, batch 16
  cases.push_back({24, {900, 64}, 4});                       // speculative: 4 queries
  cases.push_back({16, {3000, 5, 4}, 3});                    // 3 queries, short contexts
  cases.push_back({128, {2000}, 2});                         // 2 queries, 128 heads
  cases.push_back({16, {700, 0, 33, 0}, 1});                 // padding sequences
  cases.push_back({64, {0, 4000}, 2});                       // padding, multi-token
  cases.push_back({16, {1000, 77}, 2, 16});                  // small blocks
  cases.push_back({12, {999, 130}, 1, 48});                  // blocks not a power of two
  uint64_t seed = 100;
  for (const auto& c : cases) {
    auto in = make_decode(c, seed += 10);
    auto ref = run_absorbed(*cpu, c, in.q, in, DType::BF16);
    auto got = run_absorbed(*gpu, c, in.q, in, DType::BF16);
    EXPECT_LE(norm_err(ref, got), 1e-2) << describe(c);
    expect_padding_zero(c, got);
  }
}

// The tensor-core kernel merges its splits in the same launch, through counters each launch must
// leave at zero and in an order fixed by split index: the same call twice is bitwise equal. Contexts
// sit on either side of split boundaries (64 rows a split at least; on a 132-SM GPU 8192 rows fill
// 128 splits of 64 exactly, 8193 takes 86 of 96), in one- and two-tile (24-head) CTAs.
TEST(MlaParity, AbsorbedRepeatsBitwiseAtSplitBoundaries) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  std::vector<DecodeCase> cases;
  for (int32_t ctx : {64, 65, 128, 129, 8192, 8193}) cases.push_back({16, {ctx}, 1});
  cases.push_back({24, {129, 4000}, 2});
  cases.push_back({16, std::vector<int32_t>(8, 1000), 1});
  uint64_t seed = 1300;
  for (const auto& c : cases) {
    auto in = make_decode(c, seed += 10);
    auto first = run_absorbed(*gpu, c, in.q, in, DType::BF16);
    auto again = run_absorbed(*gpu, c, in.q, in, DType::BF16);
    EXPECT_EQ(first, again) << describe(c);
    EXPECT_LE(norm_err(run_absorbed(*cpu, c, in.q, in, DType::BF16), first), 1e-2) << describe(c);
  }
}

// f32 pools (and the CUDA-core kernel behind them) stay exact to f32 rounding.
TEST(MlaParity, AbsorbedF32Pool) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  const std::vector<DecodeCase> cases = {
      {5, {300}, 1}, {16, {4096}, 1}, {128, {2000}, 1}, {24, {900, 64}, 4}, {16, {500, 0}, 1}};
  uint64_t seed = 900;
  for (const auto& c : cases) {
    auto in = make_decode(c, seed += 10);
    auto ref = run_absorbed(*cpu, c, in.q, in, DType::F32);
    auto got = run_absorbed(*gpu, c, in.q, in, DType::F32);
    EXPECT_LE(norm_err(ref, got), 1e-4) << describe(c);
    expect_padding_zero(c, got);
  }
}

// 12 heads alone and the same 12 inside a 16-head tile: the padded rows of the mma tile do not
// touch the real ones, so the outputs are bitwise equal.
TEST(MlaParity, AbsorbedPaddingToSixteenHeadsIsHarmless) {
  KILN_NEED_GPU();
  auto& gpu = backends().gpu;
  DecodeCase c12{12, {3000, 9000}, 2}, c16{16, {3000, 9000}, 2};
  auto in16 = make_decode(c16, 7);
  std::vector<float> q12;  // the same 12 heads, without the 4 extra heads of other data
  for (int64_t r = 0; r < 4; ++r)
    q12.insert(q12.end(), in16.q.begin() + r * 16 * kRow, in16.q.begin() + (r * 16 + 12) * kRow);
  auto out12 = run_absorbed(*gpu, c12, q12, in16, DType::BF16);
  auto out16 = run_absorbed(*gpu, c16, in16.q, in16, DType::BF16);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t i = 0; i < 12 * kLora; ++i)
      ASSERT_EQ(out12[static_cast<size_t>(r * 12 * kLora + i)], out16[static_cast<size_t>(r * 16 * kLora + i)]);
}

// CPU only (runs in CI): a bf16 pool holding bf16-representable values gives exactly the f32
// pool's result, padding sequences included.
TEST(MlaCpu, AbsorbedBf16PoolEqualsF32Pool) {
  auto& cpu = backends().cpu;
  const std::vector<DecodeCase> cases = {{5, {300, 0, 17}, 2}, {16, {130}, 1, 16}};
  uint64_t seed = 40;
  for (const auto& c : cases) {
    auto in = make_decode(c, seed += 10);
    auto f32 = run_absorbed(*cpu, c, in.q, in, DType::F32);
    auto b16 = run_absorbed(*cpu, c, in.q, in, DType::BF16);
    EXPECT_EQ(f32, b16) << describe(c);
    expect_padding_zero(c, b16);
  }
}

// CPU only: a bf16 pool stores rows rounded to nearest even, and gathers them back exactly.
TEST(MlaCpu, KvScatterRoundsToNearestEvenAndGatherWidens) {
  auto& cpu = backends().cpu;
  const float one = 1.0f, ulp = std::ldexp(1.0f, -7);  // bf16 spacing at 1
  // value -> expected bf16: ties go to the even mantissa, anything past half rounds up.
  const std::vector<std::pair<float, float>> cases = {
      {one + ulp / 2, one},                                // tie, even below
      {one + 3 * ulp / 2, one + 2 * ulp},                  // tie, even above
      {one + ulp / 2 + std::ldexp(1.0f, -20), one + ulp},  // just past half
      {-(one + 3 * ulp / 2), -(one + 2 * ulp)},            // sign symmetric
      {3.0e-3f, bf16_to_f32(f32_to_bf16(3.0e-3f))},        // an ordinary value
      {0.0f, 0.0f}};
  const int64_t row = static_cast<int64_t>(cases.size()), bs = 4;
  std::vector<float> rows;
  for (const auto& [v, want] : cases) rows.push_back(v);
  rows.insert(rows.end(), rows.rbegin(), rows.rend());  // a second token: the values reversed
  std::vector<int32_t> slots = {6, 1}, table = {1, 0}, lens = {7}, cu = {0, 7};
  auto pool = cpu->alloc(DType::BF16, {2 * bs, row});
  auto tr = put(*cpu, rows), ts = put_raw(*cpu, slots, DType::I32);
  cpu->kv_scatter({tr.f32(), ts.t.as<int32_t>(), pool.t.data, DType::BF16, 2, row});
  const uint16_t* bits = pool.t.as<uint16_t>();
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(bf16_to_f32(bits[6 * row + static_cast<int64_t>(i)]), cases[i].second) << "value " << cases[i].first;
    EXPECT_EQ(bf16_to_f32(bits[1 * row + row - 1 - static_cast<int64_t>(i)]), cases[i].second);
  }
  // Sequence rows 0..6 live in blocks 1, 0 (slots 4..7, 0..2): row 2 is slot 6, row 5 is slot 1.
  auto tt = put_raw(*cpu, table, DType::I32), tl = put_raw(*cpu, lens, DType::I32), tc = put_raw(*cpu, cu, DType::I32);
  auto to = poisoned(*cpu, static_cast<size_t>(7 * row));
  cpu->kv_gather({{pool.t.data, DType::BF16, tt.t.as<int32_t>(), tl.t.as<int32_t>(), bs, 2},
                  tc.t.as<int32_t>(),
                  1,
                  row,
                  7,
                  to.f32()});
  auto out = get(*cpu, to);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(out[2 * static_cast<size_t>(row) + i], cases[i].second);
    EXPECT_EQ(out[5 * static_cast<size_t>(row) + static_cast<size_t>(row) - 1 - i], cases[i].second);
  }
}

struct PrefillCase {
  int64_t heads, qk, v;
  std::vector<int32_t> q_lens, kv_lens;  // kv_len >= q_len: the rest is a cached prefix
};

// q_stride: q's rows this far apart (0: contiguous).
std::vector<float> run_expanded(ops::Backend& be, const PrefillCase& c, const std::vector<float>& q,
                                const std::vector<float>& k, const std::vector<float>& v, int64_t q_stride = 0) {
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
                   0.09f,
                   q_stride});
  return get(be, to);
}

// qk 192 / v 128 (the DeepSeek-V3 shape) runs on tensor cores: q, k, v and the softmax weights P
// are rounded to bf16 for the mma (2^-9 relative each, as FlashAttention does); scores, softmax and
// accumulation stay f32. A host emulation of exactly that kernel (its fragment layouts, tiling and
// rounding) against a double reference gives a normalised error (max |ref - got| / max |ref|) of
// 1.7e-3..2.9e-3 on these inputs (contexts 37..16k, with and without prefixes); 1e-2 leaves margin
// while a wrong row, head, sequence or mask (the first row of a sequence sees one key: errors of
// order 1) still fails. Other head dims run the f32 kernel and keep the f32 bound.
double expanded_bound(const PrefillCase& c) {
  return c.qk == 192 && c.v == 128 ? 1e-2 : 1e-4;
}

TEST(MlaParity, ExpandedPrefillVarlenCausal) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  std::vector<PrefillCase> cases;
  for (int64_t h : {1, 5, 8, 12, 16, 24, 64, 128}) {
    cases.push_back({h, 192, 128, {37}, {37}});
    cases.push_back({h, 192, 128, {200}, {700}});  // two query tiles over a cached prefix
  }
  cases.push_back({12, 192, 128, {1000, 3, 64, 129}, {1500, 3, 200, 129}});  // chunks over cached prefixes
  cases.push_back({5, 30, 20, {17, 1}, {17, 9}});                            // odd head dims (f32 kernel)
  cases.push_back({12, 32, 24, {300, 5}, {300, 40}});                        // a fixture's dims (f32 kernel)
  cases.push_back({16, 192, 128, {2048}, {2048}});
  cases.push_back({2, 192, 128, {8192}, {8192}});
  cases.push_back({1, 192, 128, {1024, 300, 77}, {16384, 8000, 77}});  // 16k context, long prefixes
  {
    PrefillCase many{4, 192, 128, {}, {}};  // 40 sequences (the tile map scans cu_q 32 at a time)
    for (int32_t i = 0; i < 40; ++i) {
      const int32_t q = i == 7 ? 0 : 1 + (i * 37) % 150;  // one sequence with no queries
      many.q_lens.push_back(q);
      many.kv_lens.push_back(q + (i % 3) * 61);
    }
    cases.push_back(many);
  }
  uint64_t seed = 500;
  for (const auto& c : cases) {
    int64_t tq = 0, tkv = 0;
    for (size_t b = 0; b < c.q_lens.size(); ++b) tq += c.q_lens[b], tkv += c.kv_lens[b];
    auto q = randn(static_cast<size_t>(tq * c.heads * c.qk), seed += 3, 0.5f);
    auto k = randn(static_cast<size_t>(tkv * c.heads * c.qk), seed + 1, 0.5f);
    auto v = randn(static_cast<size_t>(tkv * c.heads * c.v), seed + 2);
    auto ref = run_expanded(*cpu, c, q, k, v), got = run_expanded(*gpu, c, q, k, v);
    EXPECT_LE(norm_err(ref, got), expanded_bound(c))
        << c.heads << " heads, qk " << c.qk << ", " << c.q_lens.size() << " seqs, first q_len " << c.q_lens[0]
        << " kv_len " << c.kv_lens[0];
  }
}

// 12 heads alone and the same 12 heads inside a 16-head problem give identical outputs.
TEST(MlaParity, ExpandedTwelveHeadsInsideSixteen) {
  KILN_NEED_GPU();
  auto& gpu = backends().gpu;
  // Two sequences: 260 queries over 270 keys (a cached prefix), and 30 over 30.
  const int64_t Tq = 290, Tkv = 300, qk = 192, vd = 128;
  PrefillCase c16{16, qk, vd, {260, 30}, {270, 30}};
  PrefillCase c12{12, qk, vd, {260, 30}, {270, 30}};
  auto q16 = randn(static_cast<size_t>(Tq * 16 * qk), 1), k16 = randn(static_cast<size_t>(Tkv * 16 * qk), 2),
       v16 = randn(static_cast<size_t>(Tkv * 16 * vd), 3);
  auto first12 = [&](const std::vector<float>& x, int64_t d) {
    std::vector<float> r;
    const auto rows = static_cast<int64_t>(x.size()) / (16 * d);
    for (int64_t t = 0; t < rows; ++t) r.insert(r.end(), x.begin() + t * 16 * d, x.begin() + (t * 16 + 12) * d);
    return r;
  };
  auto out16 = run_expanded(*gpu, c16, q16, k16, v16);
  auto out12 = run_expanded(*gpu, c12, first12(q16, qk), first12(k16, qk), first12(v16, vd));
  EXPECT_EQ(first12(out16, vd), out12);
}

// q as a view of a wider row (the fused q + kv_a projection without q LoRA): `pad` spare columns
// after each token's heads.
std::vector<float> widen_rows(const std::vector<float>& q, int64_t width, int64_t pad) {
  std::vector<float> out;
  for (size_t t = 0; t < q.size() / static_cast<size_t>(width); ++t) {
    out.insert(out.end(), q.begin() + static_cast<int64_t>(t) * width, q.begin() + static_cast<int64_t>(t + 1) * width);
    out.insert(out.end(), static_cast<size_t>(pad), NAN);
  }
  return out;
}

// CPU only: strided q gives the contiguous result bit for bit.
TEST(MlaCpu, ExpandedReadsStridedQ) {
  auto& cpu = backends().cpu;
  for (const PrefillCase& c : {PrefillCase{5, 30, 20, {17, 1}, {17, 9}}, PrefillCase{12, 192, 128, {40}, {70}}}) {
    const int64_t tq = std::accumulate(c.q_lens.begin(), c.q_lens.end(), int64_t{0}),
                  tkv = std::accumulate(c.kv_lens.begin(), c.kv_lens.end(), int64_t{0}), w = c.heads * c.qk;
    auto q = randn(static_cast<size_t>(tq * w), 60, 0.5f), k = randn(static_cast<size_t>(tkv * w), 61, 0.5f),
         v = randn(static_cast<size_t>(tkv * c.heads * c.v), 62);
    EXPECT_EQ(run_expanded(*cpu, c, q, k, v), run_expanded(*cpu, c, widen_rows(q, w, 580), k, v, w + 580));
  }
}

// The tensor-core kernel takes q rows a multiple of 4 floats apart; other strides fall back to the
// f32 kernel. Both read the right rows.
TEST(MlaParity, ExpandedStridedQ) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  const PrefillCase c{12, 192, 128, {260, 30}, {270, 30}};
  const int64_t w = c.heads * c.qk;
  auto q = randn(static_cast<size_t>(290 * w), 70, 0.5f), k = randn(static_cast<size_t>(300 * w), 71, 0.5f),
       v = randn(static_cast<size_t>(300 * c.heads * c.v), 72);
  const auto ref = run_expanded(*cpu, c, q, k, v);
  for (int64_t pad : {580, 3})
    EXPECT_LE(norm_err(ref, run_expanded(*gpu, c, widen_rows(q, w, pad), k, v, w + pad)), expanded_bound(c)) << pad;
}

}  // namespace
}  // namespace kiln::test
