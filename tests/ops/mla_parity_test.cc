// MLA attention on the GPU against the CPU reference: absorbed (paged decode over the bf16 and f32
// latent pools, split-KV, multi-token, padding sequences) and expanded (prefill, varlen, causal
// with a cached prefix; k_nope and v read from the kv_b_proj output, the shared k_pe from strided
// latent rows), across head counts {1, 5, 8, 12, 16, 24, 64, 128}, contexts 1..32k and
// batches 1..256; plus padding heads are harmless (mla_prepare's W_uk fold: mla_prepare_fold_test.cc).
// The MlaCpu tests need no GPU.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

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

// Runs absorbed attention on one backend over a pool of `pool_dtype`, into a NaN-poisoned output;
// `before` (when set) runs on the uploaded pool first, on the same stream.
std::vector<float> run_absorbed(ops::Backend& be, const DecodeCase& c, const std::vector<float>& q,
                                const DecodeInputs& in, DType pool_dtype,
                                const std::function<void(void* pool)>& before = {}) {
  const int64_t B = static_cast<int64_t>(c.kv_lens.size()), total_q = B * c.q_per_seq;
  std::vector<int32_t> cu(static_cast<size_t>(B + 1));
  for (int64_t b = 0; b <= B; ++b) cu[static_cast<size_t>(b)] = static_cast<int32_t>(b * c.q_per_seq);
  auto tq = put(be, q), tp = put(be, in.pool, pool_dtype), tt = put_raw(be, in.table, DType::I32),
       tl = put_raw(be, c.kv_lens, DType::I32), tc = put_raw(be, cu, DType::I32);
  auto to = poisoned(be, static_cast<size_t>(total_q * c.heads * kLora));
  if (before) before(tp.t.data);
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
// sit on either side of split boundaries: 1-2 query rows of up to 16 heads take the 4-stage cluster
// kernel (one cluster of 8 splits up to 1024 rows, 32-128 rows a split; past that 128 rows a split
// at least, clusters merged up the tree: 8192 rows fill 64 splits, 8 clusters), 3-8 rows the
// 4-stage tree kernel (128 rows a split at least), 9+ rows the 2-stage one (64 rows at least), 24
// heads two-tile CTAs (64 rows at least).
TEST(MlaParity, AbsorbedRepeatsBitwiseAtSplitBoundaries) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  std::vector<DecodeCase> cases;
  for (int32_t ctx : {32, 33, 64, 65, 128, 129, 256, 257, 1024, 1025, 8192, 8193}) cases.push_back({16, {ctx}, 1});
  for (int32_t ctx : {0, 200, 1100, 3000}) cases.push_back({5, {ctx}, 1});  // heads past 5 masked
  cases.push_back({16, {1025, 0, 9000}, 2});                                // 6 query rows
  cases.push_back({16, {9000, 33}, 1});                                     // 2 rows: clusters
  cases.push_back({16, {1100}, 2});                                         // 2 queries of one sequence
  for (int32_t ctx : {64, 65, 128, 129}) cases.push_back({16, std::vector<int32_t>(9, ctx), 1});
  cases.push_back({24, {129, 4000}, 2});
  cases.push_back({24, {64, 65, 128, 129}, 1});
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

// mla_prepare writes this step's latent rows, then mla_absorbed reads them, back to back on one
// stream (as in a decode step). The tensor-core decode kernel requests the tiles of earlier rows
// before it waits for the kernel before it; a tile holding any new row must wait. The pool starts
// with stale values in the new rows' slots, so reading one early changes the output. Contexts put
// the new rows on either side of 32-row tile edges, 1-4 new rows per sequence, 16 heads (1-2 query
// rows: the cluster kernel, whose 32-row splits can start at the new row; the 4-stage kernel up to
// 8 query rows, the 2-stage one beyond) and 128 heads.
TEST(MlaParity, PrepareThenAbsorbedSeesTheNewRows) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  std::vector<DecodeCase> cases;
  for (int64_t qn : {1, 2, 4})
    for (int64_t heads : {16, 128}) cases.push_back({heads, {32, 33, 64, 129, 1000}, qn});
  cases.push_back({16, std::vector<int32_t>(12, 96), 1});  // 12 query rows: the 2-stage kernel
  cases.push_back({16, {31, 32, 33, 65}, 3});
  for (int32_t ctx : {1, 33, 129, 1000, 1025, 5000}) cases.push_back({16, {ctx}, 1});  // one query row
  cases.push_back({16, {33, 129}, 1});                                                 // two rows
  for (int32_t ctx : {33, 1000}) cases.push_back({16, {ctx}, 2});                      // two queries of one sequence
  uint64_t seed = 1700;
  for (const auto& c : cases) {
    const auto in = make_decode(c, seed += 10);
    const int64_t B = static_cast<int64_t>(c.kv_lens.size()), T = B * c.q_per_seq;
    std::vector<int32_t> positions, slots;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < c.q_per_seq; ++i) {
        const int32_t pos = c.kv_lens[static_cast<size_t>(b)] - static_cast<int32_t>(c.q_per_seq - i);
        positions.push_back(pos);
        slots.push_back(in.table[static_cast<size_t>(b * in.max_blocks + pos / c.block_size)] *
                            static_cast<int32_t>(c.block_size) +
                        pos % static_cast<int32_t>(c.block_size));
      }
    const auto kva = randn(static_cast<size_t>(T * kRow), seed + 3);
    const auto norm_w = bf16_round(randn(kLora, seed + 4, 0.5f));
    std::vector<float> inv_freq(kRope / 2);
    for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / kRope);
    auto run = [&](ops::Backend& be) {
      auto tk = put(be, kva), tn = put(be, norm_w, DType::BF16);
      auto tpos = put_raw(be, positions, DType::I32), tslot = put_raw(be, slots, DType::I32);
      auto tf = put(be, inv_freq), tqpe = put(be, std::vector<float>(static_cast<size_t>(T * c.heads * kRope), 0.5f));
      return run_absorbed(be, c, in.q, in, DType::BF16, [&](void* pool) {
        be.mla_prepare({.q_in = tqpe.f32(),
                        .q_in_stride = c.heads * kRope,
                        .q_in_head_stride = kRope,
                        .q_out = tqpe.f32(),
                        .q_out_stride = c.heads * kRope,
                        .q_out_head_stride = kRope,
                        .num_heads = c.heads,
                        .kva = tk.f32(),
                        .kva_stride = kRow,
                        .norm_weight = tn.t.data,
                        .norm_weight_dtype = DType::BF16,
                        .eps = 1e-6f,
                        .positions = tpos.t.as<int32_t>(),
                        .inv_freq = tf.f32(),
                        .attention_factor = 1.0f,
                        .interleaved = true,
                        .slots = tslot.t.as<int32_t>(),
                        .pool = pool,
                        .pool_dtype = DType::BF16,
                        .num_tokens = T,
                        .kv_lora = kLora,
                        .rope_dim = kRope});
      });
    };
    const auto want = run(*cpu), got = run(*gpu);
    EXPECT_LE(norm_err(want, got), 1e-2) << describe(c);
    for (int rep = 0; rep < 4; ++rep) EXPECT_EQ(run(*gpu), got) << describe(c) << ", repeat " << rep;
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
  // 4 query rows (the 4-stage tree kernel) and one (the cluster kernel, its clusters merged up the tree).
  for (const auto& [lens, q_per_seq] :
       std::vector<std::pair<std::vector<int32_t>, int64_t>>{{{3000, 9000}, 2}, {{9000}, 1}}) {
    DecodeCase c12{12, lens, q_per_seq}, c16{16, lens, q_per_seq};
    auto in16 = make_decode(c16, 7);
    const int64_t rows = static_cast<int64_t>(lens.size()) * q_per_seq;
    std::vector<float> q12;  // the same 12 heads, without the 4 extra heads of other data
    for (int64_t r = 0; r < rows; ++r)
      q12.insert(q12.end(), in16.q.begin() + r * 16 * kRow, in16.q.begin() + (r * 16 + 12) * kRow);
    auto out12 = run_absorbed(*gpu, c12, q12, in16, DType::BF16);
    auto out16 = run_absorbed(*gpu, c16, in16.q, in16, DType::BF16);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < 12 * kLora; ++i)
        ASSERT_EQ(out12[static_cast<size_t>(r * 12 * kLora + i)], out16[static_cast<size_t>(r * 16 * kLora + i)])
            << rows << " query rows";
  }
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
  int64_t rope = 64;                     // k_pe's width; k_nope's is qk - rope
  int64_t nope() const { return qk - rope; }
  int64_t total_q() const { return std::accumulate(q_lens.begin(), q_lens.end(), int64_t{0}); }
  int64_t total_kv() const { return std::accumulate(kv_lens.begin(), kv_lens.end(), int64_t{0}); }
};

// The op's inputs as the model has them: q, the kv_b_proj output (per head k_nope ‖ v) and the
// shared roped k_pe.
struct PrefillInputs {
  std::vector<float> q;     // [total_q, heads, qk]
  std::vector<float> kv_b;  // [total_kv, heads, nope + v]
  std::vector<float> k_pe;  // [total_kv, rope]
};

PrefillInputs make_prefill(const PrefillCase& c, uint64_t seed) {
  const auto tq = static_cast<size_t>(c.total_q()), tkv = static_cast<size_t>(c.total_kv());
  const auto h = static_cast<size_t>(c.heads);
  // k_nope and k_pe at 0.5, v at 1 (as the k and v of the per-head layout were).
  auto kv_b = randn(tkv * h * static_cast<size_t>(c.nope() + c.v), seed + 2);
  auto k_nope = randn(kv_b.size(), seed + 1, 0.5f);
  for (size_t i = 0; i < kv_b.size(); ++i)
    if (static_cast<int64_t>(i) % (c.nope() + c.v) < c.nope()) kv_b[i] = k_nope[i];
  return {randn(tq * h * static_cast<size_t>(c.qk), seed, 0.5f), kv_b,
          randn(tkv * static_cast<size_t>(c.rope), seed + 3, 0.5f)};
}

// How the inputs lie in memory (0: dense rows). k_pe_offset: k_pe's first column this far into its
// (wider) rows, as in the model's gathered latent rows (k_pe at column kv_lora of 576).
struct PrefillLayout {
  int64_t q_stride = 0, kv_b_stride = 0, k_pe_stride = 0, k_pe_offset = 0;
};

// Rows of `x` (each `width` wide) with `lead` NaN columns before and `pad` NaN columns after each:
// a view of a wider row (e.g. the fused q + kv_a projection without q LoRA, or the latent rows).
std::vector<float> widen_rows(const std::vector<float>& x, int64_t width, int64_t pad, int64_t lead = 0) {
  std::vector<float> out;
  for (size_t t = 0; t < x.size() / static_cast<size_t>(width); ++t) {
    out.insert(out.end(), static_cast<size_t>(lead), NAN);
    out.insert(out.end(), x.begin() + static_cast<int64_t>(t) * width, x.begin() + static_cast<int64_t>(t + 1) * width);
    out.insert(out.end(), static_cast<size_t>(pad), NAN);
  }
  return out;
}

// Runs expanded attention on one backend; the inputs are already laid out as `l` says.
std::vector<float> run_expanded(ops::Backend& be, const PrefillCase& c, const PrefillInputs& in,
                                const PrefillLayout& l = {}) {
  std::vector<int32_t> cu_q = {0}, cu_kv = {0};
  for (size_t b = 0; b < c.q_lens.size(); ++b) {
    cu_q.push_back(cu_q.back() + c.q_lens[b]);
    cu_kv.push_back(cu_kv.back() + c.kv_lens[b]);
  }
  auto tq = put(be, in.q), tkvb = put(be, in.kv_b), tkpe = put(be, in.k_pe), tcq = put_raw(be, cu_q, DType::I32),
       tck = put_raw(be, cu_kv, DType::I32);
  auto to = poisoned(be, static_cast<size_t>(cu_q.back() * c.heads * c.v));
  be.mla_expanded({.q = tq.f32(),
                   .kv_b = tkvb.f32(),
                   .k_pe = tkpe.f32() + l.k_pe_offset,
                   .out = to.f32(),
                   .seqs = {tcq.t.as<int32_t>(), tck.t.as<int32_t>(), static_cast<int64_t>(c.q_lens.size())},
                   .total_q = cu_q.back(),
                   .total_kv = cu_kv.back(),
                   .num_heads = c.heads,
                   .qk_dim = c.qk,
                   .v_dim = c.v,
                   .nope_dim = c.nope(),
                   .scale = 0.09f,
                   .q_stride = l.q_stride,
                   .kv_b_stride = l.kv_b_stride,
                   .k_pe_stride = l.k_pe_stride});
  return get(be, to);
}

std::string describe(const PrefillCase& c) {
  return std::to_string(c.heads) + " heads, qk " + std::to_string(c.qk) + " (rope " + std::to_string(c.rope) + "), v " +
         std::to_string(c.v) + ", " + std::to_string(c.q_lens.size()) + " seqs, first q_len " +
         std::to_string(c.q_lens[0]) + " kv_len " + std::to_string(c.kv_lens[0]);
}

// qk 192 / v 128 (the DeepSeek-V3 shape) runs on tensor cores: q, k, v and the softmax weights P
// are rounded to bf16 for the mma (2^-9 relative each, as FlashAttention does); scores, softmax and
// accumulation stay f32. A host emulation of the earlier mma.sync kernel, which rounds at the same
// points as the wgmma one (its fragment layouts, tiling and rounding), against a double reference
// gives a normalised error (max |ref - got| / max |ref|) of 1.7e-3..2.9e-3 on these inputs
// (contexts 37..16k, with and without prefixes); 1e-2 leaves margin
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
  cases.push_back({5, 30, 20, {17, 1}, {17, 9}, 7});                         // odd head dims (f32 kernel)
  cases.push_back({12, 32, 24, {300, 5}, {300, 40}, 16});                    // a fixture's dims (f32 kernel)
  cases.push_back({16, 192, 128, {2048}, {2048}});
  cases.push_back({2, 192, 128, {8192}, {8192}});
  cases.push_back({1, 192, 128, {1024, 300, 77}, {16384, 8000, 77}});  // 16k context, long prefixes
  cases.push_back({4, 192, 128, {100, 30}, {300, 30}, 32});            // nope 160: k_pe starts mid-panel
  {
    // 40 sequences (the tile map scans cu_q 32 at a time); no queries in 0, 7, 9, 10, 12 and 39, of
    // which 0, 9, 12 and 39 have no keys either (first, last, and next to each other).
    PrefillCase many{4, 192, 128, {}, {}};
    for (int32_t i = 0; i < 40; ++i) {
      const bool empty = i == 0 || i == 7 || i == 9 || i == 10 || i == 12 || i == 39;
      const int32_t q = empty ? 0 : 1 + (i * 37) % 150;
      many.q_lens.push_back(q);
      many.kv_lens.push_back(q + (i % 3) * 61);
    }
    cases.push_back(many);
  }
  uint64_t seed = 500;
  for (const auto& c : cases) {
    const auto in = make_prefill(c, seed += 4);
    auto ref = run_expanded(*cpu, c, in), got = run_expanded(*gpu, c, in);
    EXPECT_LE(norm_err(ref, got), expanded_bound(c)) << describe(c);
  }
}

// 12 heads alone and the same 12 heads inside a 16-head problem give identical outputs.
TEST(MlaParity, ExpandedTwelveHeadsInsideSixteen) {
  KILN_NEED_GPU();
  auto& gpu = backends().gpu;
  // Two sequences: 260 queries over 270 keys (a cached prefix), and 30 over 30.
  const int64_t qk = 192, vd = 128, kvd = 128 + vd;  // kvd: one head of kv_b (nope + v)
  PrefillCase c16{16, qk, vd, {260, 30}, {270, 30}};
  PrefillCase c12{12, qk, vd, {260, 30}, {270, 30}};
  const auto in16 = make_prefill(c16, 1);
  auto first12 = [&](const std::vector<float>& x, int64_t d) {
    std::vector<float> r;
    const auto rows = static_cast<int64_t>(x.size()) / (16 * d);
    for (int64_t t = 0; t < rows; ++t) r.insert(r.end(), x.begin() + t * 16 * d, x.begin() + (t * 16 + 12) * d);
    return r;
  };
  auto out16 = run_expanded(*gpu, c16, in16);
  auto out12 = run_expanded(*gpu, c12, {first12(in16.q, qk), first12(in16.kv_b, kvd), in16.k_pe});
  EXPECT_EQ(first12(out16, vd), out12);
}

// The tensor-core path's switches change the schedule, not the arithmetic: every pipeline depth
// (KILN_MLA_PREFILL_STAGES) and rounding of the heads' tile images (KILN_MLA_PREFILL_GROUP_HEADS:
// 12 heads in rounds of at most 5, evened out to 4 + 4 + 4, or one at a time) gives the default's
// output bit for bit, and that output matches the CPU.
TEST(MlaParity, ExpandedDepthsAndHeadGroupsAgree) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  const PrefillCase c{12, 192, 128, {260, 1, 70}, {400, 33, 70}};
  const auto in = make_prefill(c, 77);
  const auto base = run_expanded(*gpu, c, in);
  EXPECT_LE(norm_err(run_expanded(*cpu, c, in), base), expanded_bound(c));
  const std::vector<std::pair<const char*, const char*>> switches = {
      {"KILN_MLA_PREFILL_STAGES", "3"}, {"KILN_MLA_PREFILL_GROUP_HEADS", "5"}, {"KILN_MLA_PREFILL_GROUP_HEADS", "1"}};
  for (const auto& [name, value] : switches) {
    const ScopedEnv env(name, value);
    EXPECT_EQ(run_expanded(*gpu, c, in), base) << name << "=" << value;
  }
}

// The key-tile ring under load: ~900 CTAs (7 waves), a sequence of 8,192 keys whose stages wrap
// dozens of times and whose two warpgroups drift apart, run three times at each depth: bit for bit
// the same output each time and at both depths. A stage refilled while a warpgroup still reads it
// would show here as a change.
TEST(MlaParity, ExpandedRingRepeatsBitwise) {
  KILN_NEED_GPU();
  auto& gpu = backends().gpu;
  const PrefillCase c{16, 192, 128, {4096, 3000}, {8192, 3000}};
  const auto in = make_prefill(c, 91);
  const auto base = run_expanded(*gpu, c, in);
  for (const char* stages : {"3", "4"}) {
    const ScopedEnv env("KILN_MLA_PREFILL_STAGES", stages);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(run_expanded(*gpu, c, in), base) << "stages " << stages << ", run " << i;
  }
}

// Lays `in` out as `pad` (q, kv_b: spare columns after each row) and `lead`/`k_pe_row` (k_pe's
// columns at `lead` of rows `k_pe_row` wide) say; returns the layout to pass.
PrefillLayout lay_out(const PrefillCase& c, PrefillInputs& in, int64_t q_pad, int64_t kv_b_pad, int64_t lead,
                      int64_t k_pe_row) {
  const int64_t qw = c.heads * c.qk, kvw = c.heads * (c.nope() + c.v);
  in.q = widen_rows(in.q, qw, q_pad);
  in.kv_b = widen_rows(in.kv_b, kvw, kv_b_pad);
  in.k_pe = widen_rows(in.k_pe, c.rope, k_pe_row - lead - c.rope, lead);
  return {qw + q_pad, kvw + kv_b_pad, k_pe_row, lead};
}

// CPU only: strided q, kv_b and k_pe (k_pe inside wider rows, as the model's latent rows) give the
// dense result bit for bit.
TEST(MlaCpu, ExpandedReadsStridedRows) {
  auto& cpu = backends().cpu;
  for (const PrefillCase& c : {PrefillCase{5, 30, 20, {17, 1}, {17, 9}, 7}, PrefillCase{12, 192, 128, {40}, {70}}}) {
    const auto dense = make_prefill(c, 60);
    auto strided = dense;
    const PrefillLayout l = lay_out(c, strided, 580, 3, 512, 576);
    EXPECT_EQ(run_expanded(*cpu, c, dense), run_expanded(*cpu, c, strided, l)) << describe(c);
  }
}

// CPU only: the op over (kv_b, k_pe) is the per-head attention it stands for: key j of head h is
// (kv_b[j, h, :nope] ‖ k_pe[j]), its value kv_b[j, h, nope:]. A naive double-precision attention
// over per-head k and v assembled by hand, causal over each sequence's last q_len keys.
TEST(MlaCpu, ExpandedEqualsPerHeadAttention) {
  auto& cpu = backends().cpu;
  const float scale = 0.09f;  // run_expanded's
  const std::vector<PrefillCase> cases = {
      {5, 30, 20, {17, 1, 4}, {17, 9, 30}, 7},  // odd dims, prefixes (cu_kv > cu_q)
      {3, 192, 128, {40, 5}, {70, 5}},          // the DeepSeek-V3 dims over a prefix
      {2, 32, 24, {0, 6}, {3, 6}, 16},          // a sequence with no queries
  };
  uint64_t seed = 80;
  for (const auto& c : cases) {
    const auto in = make_prefill(c, seed += 4);
    const int64_t H = c.heads, qk = c.qk, vd = c.v, nope = c.nope(), rope = c.rope;
    const int64_t tkv = c.total_kv();
    // The old formulation's inputs: per-head k [tkv, H, qk] and v [tkv, H, vd].
    std::vector<double> k(static_cast<size_t>(tkv * H * qk)), v(static_cast<size_t>(tkv * H * vd));
    for (int64_t j = 0; j < tkv; ++j) {
      for (int64_t h = 0; h < H; ++h) {
        const float* kvb = in.kv_b.data() + (j * H + h) * (nope + vd);
        for (int64_t d = 0; d < nope; ++d) k[static_cast<size_t>((j * H + h) * qk + d)] = kvb[d];
        for (int64_t d = 0; d < rope; ++d)
          k[static_cast<size_t>((j * H + h) * qk + nope + d)] = in.k_pe[static_cast<size_t>(j * rope + d)];
        for (int64_t d = 0; d < vd; ++d) v[static_cast<size_t>((j * H + h) * vd + d)] = kvb[nope + d];
      }
    }
    std::vector<float> want(static_cast<size_t>(c.total_q() * H * vd));
    int64_t q0 = 0, kv0 = 0;
    for (size_t b = 0; b < c.q_lens.size(); ++b) {
      const int64_t q_len = c.q_lens[b], kv_len = c.kv_lens[b];
      for (int64_t i = 0; i < q_len; ++i) {
        for (int64_t h = 0; h < H; ++h) {
          const int64_t visible = kv_len - q_len + i + 1;
          std::vector<double> s(static_cast<size_t>(visible));
          double mx = -INFINITY, sum = 0;
          for (int64_t j = 0; j < visible; ++j) {
            double dot = 0;
            for (int64_t d = 0; d < qk; ++d)
              dot += in.q[static_cast<size_t>(((q0 + i) * H + h) * qk + d)] *
                     k[static_cast<size_t>(((kv0 + j) * H + h) * qk + d)];
            s[static_cast<size_t>(j)] = dot * scale;
            mx = std::max(mx, s[static_cast<size_t>(j)]);
          }
          for (auto& x : s) sum += (x = std::exp(x - mx));
          for (int64_t d = 0; d < vd; ++d) {
            double o = 0;
            for (int64_t j = 0; j < visible; ++j)
              o += s[static_cast<size_t>(j)] * v[static_cast<size_t>(((kv0 + j) * H + h) * vd + d)];
            want[static_cast<size_t>(((q0 + i) * H + h) * vd + d)] = static_cast<float>(o / sum);
          }
        }
      }
      q0 += q_len;
      kv0 += kv_len;
    }
    EXPECT_LE(norm_err(want, run_expanded(*cpu, c, in)), 1e-5) << describe(c);
  }
}

// The tensor-core kernel takes q rows a multiple of 4 floats apart; other strides fall back to the
// f32 kernel. Both read the right rows.
TEST(MlaParity, ExpandedStridedQ) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  const PrefillCase c{12, 192, 128, {260, 30}, {270, 30}};
  const auto dense = make_prefill(c, 70);
  const auto ref = run_expanded(*cpu, c, dense);
  for (int64_t pad : {580, 3}) {
    auto in = dense;
    const PrefillLayout l = lay_out(c, in, pad, 0, 0, c.rope);
    EXPECT_LE(norm_err(ref, run_expanded(*gpu, c, in, l)), expanded_bound(c)) << pad;
  }
}

// kv_b and k_pe rows apart by their strides: the model's layout (dense kv_b, k_pe at column 512 of
// 576-wide latent rows) and other multiples of 4 floats take the tensor cores; a stride or a k_pe
// start off 16 bytes falls back to the f32 kernel. All read the right rows.
TEST(MlaParity, ExpandedStridedKvBAndKPe) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  struct Layout {
    int64_t kv_b_pad, lead, k_pe_row;
  };
  const std::vector<Layout> layouts = {
      {0, 512, 576},  // the model's (tensor cores)
      {4, 0, 68},     // padded rows, multiples of 4 floats (tensor cores)
      {3, 512, 576},  // kv_b rows off 16 bytes (f32 kernel)
      {0, 1, 65},     // k_pe off 16 bytes (f32 kernel)
  };
  for (const PrefillCase& c : {PrefillCase{12, 192, 128, {260, 30}, {270, 30}}, PrefillCase{128, 192, 128, {77}, {300}},
                               PrefillCase{5, 30, 20, {17, 1}, {17, 9}, 7}}) {
    const auto dense = make_prefill(c, 90);
    const auto ref = run_expanded(*cpu, c, dense);
    for (const Layout& s : layouts) {
      auto in = dense;
      const PrefillLayout l = lay_out(c, in, 0, s.kv_b_pad, s.lead, s.k_pe_row);
      EXPECT_LE(norm_err(ref, run_expanded(*gpu, c, in, l)), expanded_bound(c))
          << describe(c) << ", kv_b pad " << s.kv_b_pad << ", k_pe at " << s.lead << " of " << s.k_pe_row;
    }
  }
}

}  // namespace
}  // namespace kiln::test
