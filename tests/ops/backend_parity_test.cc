// The dense ops and mla_prepare: CUDA against the CPU reference on fresh random inputs (the MoE
// ops: moe_parity_test.cc, moe_stream_parity_test.cc). The OpsCpu tests need no GPU (they run in CI).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "parity_util.h"

namespace kiln::test {
namespace {

using ops::OwnedTensor;

TEST(Parity, RmsNormAddSwigluCopy) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 64}, {5, 90}, {257, 7168}, {64, 513}}) {
    auto x = randn(static_cast<size_t>(rows * dim), 1), w = bf16_round(randn(static_cast<size_t>(dim), 2));
    std::vector<float> out[2], bcast[2];
    ops::Backend* be[2] = {cpu.get(), gpu.get()};
    for (int b = 0; b < 2; ++b) {
      auto tx = put(*be[b], x), tw = put(*be[b], w, b ? DType::BF16 : DType::F32);
      auto to = poisoned(*be[b], x.size());
      be[b]->rms_norm({tx.f32(), 0, tw.t.data, tw.t.dtype, to.f32(), 0, rows, dim, 1e-6f});
      be[b]->add({to.f32(), tx.f32(), to.f32(), rows * dim});
      auto tgu = put(*be[b], randn(static_cast<size_t>(rows * dim), 3));
      auto ts = poisoned(*be[b], static_cast<size_t>(rows * dim / 2));
      be[b]->swiglu({tgu.f32(), ts.f32(), rows, dim / 2});
      be[b]->copy({ts.f32(), dim / 2, to.f32() + 1, dim, rows, dim / 2 - 1});
      out[b] = get(*be[b], to);
      // Broadcast: every source row into 3 consecutive destination rows (the expanded form's k_pe).
      auto tb = poisoned(*be[b], static_cast<size_t>(3 * rows * dim));
      be[b]->copy({tx.f32() + 1, dim, tb.f32(), dim, 3 * rows, dim - 1, 3});
      bcast[b] = get(*be[b], tb);
    }
    EXPECT_LE(norm_err(out[0], out[1]), 1e-5) << rows << "x" << dim;
    for (int b = 0; b < 2; ++b)
      for (int64_t r = 0; r < 3 * rows; ++r)
        for (int64_t c = 0; c < dim - 1; ++c)
          ASSERT_EQ(bcast[b][static_cast<size_t>(r * dim + c)], x[static_cast<size_t>(r / 3 * dim + c + 1)])
              << "backend " << b << " row " << r << " col " << c;
  }
}

// The fused residual add: x + residual written back in place, its norm out.
// x + residual normalised, with the sum kept in place of x (`sum` = x) or not kept (`sum` null).
std::vector<float> run_rms_norm_residual(ops::Backend& be, int64_t rows, int64_t dim, bool keep_sum,
                                         std::vector<float>* sum_out) {
  auto x = randn(static_cast<size_t>(rows * dim), 4), r = randn(static_cast<size_t>(rows * dim), 5);
  auto w = bf16_round(randn(static_cast<size_t>(dim), 6));
  const bool gpu = be.device() == Device::CUDA;
  auto tx = put(be, x), tr = put(be, r), tw = put(be, w, gpu ? DType::BF16 : DType::F32);
  auto to = poisoned(be, x.size());
  ops::RmsNormParams p{tx.f32(), 0, tw.t.data, tw.t.dtype, to.f32(), 0, rows, dim, 1e-6f};
  p.residual = tr.f32();
  if (keep_sum) p.sum = tx.f32();
  be.rms_norm(p);
  if (sum_out) *sum_out = get(be, tx);
  return get(be, to);
}

const std::pair<int64_t, int64_t> kRmsNormShapes[] = {{1, 2048}, {7, 90}, {256, 7168}};

TEST(OpsCpu, RmsNormWithoutSumEqualsWithSum) {
  auto& cpu = *backends().cpu;
  for (auto [rows, dim] : kRmsNormShapes)
    EXPECT_EQ(run_rms_norm_residual(cpu, rows, dim, false, nullptr),
              run_rms_norm_residual(cpu, rows, dim, true, nullptr))
        << rows << "x" << dim;
}

TEST(Parity, RmsNormWithResidual) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  for (auto [rows, dim] : kRmsNormShapes) {
    std::vector<float> sum[2];
    const auto want = run_rms_norm_residual(*cpu, rows, dim, true, &sum[0]);
    const auto got = run_rms_norm_residual(*gpu, rows, dim, true, &sum[1]);
    EXPECT_EQ(sum[0], sum[1]) << rows << "x" << dim;  // one f32 add: exact on both
    EXPECT_LE(norm_err(want, got), 1e-5) << rows << "x" << dim;
    EXPECT_EQ(run_rms_norm_residual(*gpu, rows, dim, false, nullptr), got) << rows << "x" << dim << ", sum not kept";
  }
}

TEST(Parity, EmbeddingRopeLogSoftmax) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  const int64_t V = 1000, H = 96, T = 37;
  auto table = bf16_round(randn(static_cast<size_t>(V * H), 4));
  std::vector<int32_t> ids(T), pos(T);
  for (int64_t i = 0; i < T; ++i)
    ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % V),
    pos[static_cast<size_t>(i)] = static_cast<int32_t>(i * 883 % 32768);
  std::vector<float> inv(8);
  for (size_t i = 0; i < inv.size(); ++i) inv[i] = std::pow(10000.0f, -static_cast<float>(2 * i) / 16.0f);
  for (bool interleaved : {true, false}) {
    std::vector<float> out[2], lsm[2];
    ops::Backend* be[2] = {cpu.get(), gpu.get()};
    for (int b = 0; b < 2; ++b) {
      auto tt = put(*be[b], table, b ? DType::BF16 : DType::F32);
      auto ti = put_raw(*be[b], ids, DType::I32), tp = put_raw(*be[b], pos, DType::I32), tf = put(*be[b], inv);
      auto to = poisoned(*be[b], static_cast<size_t>(T * H));
      be[b]->embedding({ti.t.as<int32_t>(), tt.t.data, tt.t.dtype, to.f32(), T, V, H});
      // 6 heads of 16 rotary dims at stride 16 inside each 96-wide row.
      be[b]->rope({to.f32(), T, 6, H, 16, 16, tp.t.as<int32_t>(), tf.f32(), 1.3f, interleaved});
      out[b] = get(*be[b], to);
      auto tl = put(*be[b], randn(static_cast<size_t>(T * V), 5, 3.0f));
      auto tls = poisoned(*be[b], static_cast<size_t>(T * V));
      be[b]->log_softmax({tl.f32(), tls.f32(), T, V});
      lsm[b] = get(*be[b], tls);
    }
    EXPECT_LE(norm_err(out[0], out[1]), 1e-5) << "interleaved " << interleaved;
    EXPECT_LE(norm_err(lsm[0], lsm[1]), 1e-5);
  }
}

TEST(Parity, Linear) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  struct S {
    int64_t m, n, k;
  };
  // 2-8 rows with k % 32 == 0 take the tensor-core GEMV: n not a multiple of its 16-row tile, fewer
  // 32-column blocks (3) than warps (8), Moonlight's q + kv_a at 8 rows, and k past one 2048-column
  // chunk (DeepSeek-V3's hidden 7168: 3.5 chunks).
  // 601 x 96: split halves past 512 rows whose lo rows start off a 256-byte boundary (one GEMM of
  // 2m rows then, not two).
  for (S s : {S{1, 64, 64}, S{7, 300, 129}, S{1, 2048, 7168}, S{256, 512, 1000}, S{33, 4096, 512}, S{128, 163, 90},
              S{5, 300, 2048}, S{2, 100, 96}, S{8, 3648, 2048}, S{4, 300, 7168}, S{601, 512, 96}}) {
    // The GPU multiplies bf16 operands: round x too, so the comparison measures accumulation only.
    auto x = bf16_round(randn(static_cast<size_t>(s.m * s.k), 6)),
         w = bf16_round(randn(static_cast<size_t>(s.n * s.k), 7));
    std::vector<float> out[2], bcast[2];
    ops::Backend* be[2] = {cpu.get(), gpu.get()};
    for (int b = 0; b < 2; ++b) {
      auto tx = put(*be[b], x), tw = put(*be[b], w, b ? DType::BF16 : DType::F32);
      auto ty = poisoned(*be[b], static_cast<size_t>(s.m * s.n));
      be[b]->linear({tx.f32(), 0, tw.t.data, tw.t.dtype, ty.f32(), 0, s.m, s.n, s.k});
      out[b] = get(*be[b], ty);
    }
    EXPECT_LE(norm_err(out[0], out[1]), 1e-4) << s.m << "x" << s.n << "x" << s.k;
  }
}

TEST(Parity, LinearHeads) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  // GEMV to 8 rows (tensor cores from 2), batched GEMM beyond (split halves as two GEMMs from 512)
  for (int64_t m : {1, 2, 3, 8, 9, 33, 64, 300, 600}) {
    for (int64_t heads : {1, 5, 12, 16}) {
      const int64_t n = 512, k = 128, xs = heads * (k + 64), ys = heads * (n + 64);  // strided like the model
      // x not rounded: its lo parts must count (from 600 rows a GEMM of their own per head).
      auto x = randn(static_cast<size_t>(m * xs), 20);
      auto w = bf16_round(randn(static_cast<size_t>(heads * (n + 128) * k), 21, 0.1f));
      std::vector<float> out[2];
      ops::Backend* be[2] = {cpu.get(), gpu.get()};
      for (int b = 0; b < 2; ++b) {
        auto tx = put(*be[b], x), tw = put(*be[b], w, b ? DType::BF16 : DType::F32);
        auto ty = put(*be[b], std::vector<float>(static_cast<size_t>(m * ys), 0.0f));
        be[b]->linear_heads(
            {tx.f32(), xs, k + 64, tw.t.data, (n + 128) * k, tw.t.dtype, ty.f32(), ys, n + 64, heads, m, n, k});
        out[b] = get(*be[b], ty);
      }
      EXPECT_LE(norm_err(out[0], out[1]), 1e-4) << m << " rows, " << heads << " heads";
    }
  }
}

// --activation-dtype bf16: the cuBLASLt GEMMs (> 8 rows) round x to bf16 once, so on the CPU the
// same x rounded first gives the same products (only accumulation order differs); the GEMVs (<= 8
// rows) do not round x (f32 on CUDA cores, bf16 hi + lo on tensor cores from 2 rows, k % 32 == 0:
// the 4-row case, strided y with an addend; x is unrounded, so the lo parts count). Cases: y
// written in place by the GEMM (aligned, n % 64 == 0), through scratch (n 163, strided y), with a
// fused addend (the GEMM's C operand at 33 and 600 rows, y aligned), and batched heads.
TEST(Parity, LinearBf16Activations) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  const GpuActivations bf16(DType::BF16);
  struct S {
    int64_t m, n, k, heads, ys;
    bool add;
  };
  for (S s : {S{3, 300, 129, 1, 300, false}, S{256, 512, 1000, 1, 512, false}, S{33, 4096, 512, 1, 4096, true},
              S{128, 163, 90, 1, 163, false}, S{300, 512, 128, 1, 600, false}, S{64, 512, 128, 5, 0, false},
              S{9, 128, 64, 16, 0, false}, S{4, 300, 256, 1, 304, true}, S{600, 512, 256, 1, 512, true}}) {
    const int64_t ys = s.heads > 1 ? s.heads * s.n : s.ys;
    const auto x = randn(static_cast<size_t>(s.m * s.heads * s.k), 30);
    const auto w = bf16_round(randn(static_cast<size_t>(s.heads * s.n * s.k), 31, 0.1f));
    const auto add = randn(static_cast<size_t>(s.m * ys), 32);
    const bool gemv = s.m <= 8;
    std::vector<float> out[2];
    ops::Backend* be[2] = {cpu.get(), gpu.get()};
    for (int b = 0; b < 2; ++b) {
      auto tx = put(*be[b], b || gemv ? x : bf16_round(x)), tw = put(*be[b], w, b ? DType::BF16 : DType::F32);
      auto ty = poisoned(*be[b], static_cast<size_t>(s.m * ys)), ta = put(*be[b], add);
      if (s.heads > 1) {
        be[b]->linear_heads(
            {tx.f32(), 0, s.k, tw.t.data, s.n * s.k, tw.t.dtype, ty.f32(), 0, s.n, s.heads, s.m, s.n, s.k});
      } else {
        ops::LinearParams p{tx.f32(), 0, tw.t.data, tw.t.dtype, ty.f32(), ys, s.m, s.n, s.k};
        if (s.add) p.add = ta.f32();
        be[b]->linear(p);
      }
      out[b] = get(*be[b], ty);
      for (int64_t r = 0; r < s.m; ++r)  // columns past n of a strided y are never written
        for (int64_t j = s.heads * s.n; j < ys; ++j) out[b][static_cast<size_t>(r * ys + j)] = 0.0f;
    }
    EXPECT_LE(norm_err(out[0], out[1]), 1e-4) << s.m << "x" << s.n << "x" << s.k << ", " << s.heads << " heads";
  }
}

// LinearParams::x_bf16 (rows gathered from a bf16 cache): with split activations the GEMM skips the
// lo part, which is zero for such x. The same bits from 512 rows (y = hi · wᵀ either way), the
// same up to summation order below (one GEMM of m rows against one of 2m), and the CPU's result.
// The hint is trusted: given x that is not bf16, CUDA rounds it, so the product is the rounded x's
// (this is what shows the lo part skipped), ~1e-3 away from x's own.
TEST(Parity, LinearBf16InputSkipsTheLoPart) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  for (int64_t m : {9, 64, 600}) {
    const int64_t n = 512, k = 576;  // k: the latent row's width, read as the first 512 of 576 below
    const auto x_f32 = randn(static_cast<size_t>(m * k), 40), x = bf16_round(x_f32);
    const auto w = bf16_round(randn(static_cast<size_t>(n * 512), 41, 0.1f));
    auto run = [&](ops::Backend& be, const std::vector<float>& in, bool hint) {
      const bool gpu_run = be.device() == Device::CUDA;
      auto tx = put(be, in), tw = put(be, w, gpu_run ? DType::BF16 : DType::F32);
      auto ty = poisoned(be, static_cast<size_t>(m * n));
      ops::LinearParams p{tx.f32(), k, tw.t.data, tw.t.dtype, ty.f32(), 0, m, n, 512};
      p.x_bf16 = hint;
      be.linear(p);
      return get(be, ty);
    };
    const auto want = run(*cpu, x, false), without = run(*gpu, x, false), with = run(*gpu, x, true);
    EXPECT_LE(norm_err(want, with), 1e-4) << m << " rows";
    if (m >= 512)
      EXPECT_EQ(without, with) << m << " rows";
    else
      EXPECT_LE(norm_err(without, with), 1e-6) << m << " rows";
    const auto probe = run(*gpu, x_f32, true);
    EXPECT_LE(norm_err(want, probe), 1e-5) << m << " rows";
    EXPECT_GT(norm_err(run(*cpu, x_f32, false), probe), 1e-4) << m << " rows";
  }
}

// What decode layers fuse into linear: their RMSNorm (of x + residual) inside the first projection
// and the residual add inside the last, against the op sequence it replaces.
struct FusedLinearCase {
  int64_t m, n, k;
  // 0: norm; 1: norm + residual + add, strided rows; 2: add alone, strided; 3: f32 norm weight +
  // residual; 4: as 1 with dense rows (cuBLASLt adds through the GEMM's C operand)
  int variant;
  bool norm() const { return variant != 2; }
  bool residual() const { return variant == 1 || variant == 3 || variant == 4; }
  bool add() const { return variant == 1 || variant == 2 || variant == 4; }
  int64_t xs() const { return variant == 1 || variant == 2 ? k + 4 : k; }
  int64_t ys() const { return variant == 1 || variant == 2 ? n + 3 : n; }
  std::string str() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + ", variant " +
           std::to_string(variant);
  }
};

struct FusedLinearInputs {
  std::vector<float> x, res, norm_w, w, add;  // [m, xs], [m, xs], [k], [n, k], [m, ys]
};

FusedLinearInputs fused_linear_inputs(const FusedLinearCase& c, uint64_t seed) {
  return {randn(static_cast<size_t>(c.m * c.xs()), seed), randn(static_cast<size_t>(c.m * c.xs()), seed + 1),
          bf16_round(randn(static_cast<size_t>(c.k), seed + 2)),
          bf16_round(randn(static_cast<size_t>(c.n * c.k), seed + 3, 0.05f)),
          randn(static_cast<size_t>(c.m * c.ys()), seed + 4)};
}

// y [m, n] of the fused op, or (fused false) of rms_norm, then linear, then the add (on the host).
std::vector<float> run_fused_linear(ops::Backend& be, const FusedLinearCase& c, const FusedLinearInputs& in,
                                    bool fused) {
  const int64_t m = c.m, n = c.n, k = c.k, xs = c.xs(), ys = c.ys();
  const bool gpu = be.device() == Device::CUDA;
  const DType wdt = gpu ? DType::BF16 : DType::F32, ndt = gpu && c.variant != 3 ? DType::BF16 : DType::F32;
  auto x = put(be, in.x), res = put(be, in.res), nw = put(be, in.norm_w, ndt), w = put(be, in.w, wdt);
  auto add = put(be, in.add), y = poisoned(be, static_cast<size_t>(m * ys));
  if (fused) {
    ops::LinearParams p{x.f32(), xs, w.t.data, wdt, y.f32(), ys, m, n, k};
    if (c.norm()) p.norm_weight = nw.t.data, p.norm_weight_dtype = ndt, p.norm_eps = 1e-6f;
    if (c.residual()) p.norm_residual = res.f32();
    if (c.add()) p.add = add.f32();
    be.linear(p);
  } else {
    auto xn = poisoned(be, static_cast<size_t>(m * k)), sum = poisoned(be, static_cast<size_t>(m * xs));
    const float* xin = x.f32();
    int64_t xin_stride = xs;
    if (c.norm()) {
      ops::RmsNormParams nrm{x.f32(), xs, nw.t.data, ndt, xn.f32(), k, m, k, 1e-6f};
      if (c.residual()) nrm.residual = res.f32(), nrm.sum = sum.f32();
      be.rms_norm(nrm);
      xin = xn.f32(), xin_stride = k;
    }
    be.linear({xin, xin_stride, w.t.data, wdt, y.f32(), ys, m, n, k});
  }
  const auto got = get(be, y);
  std::vector<float> out;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const size_t i = static_cast<size_t>(r * ys + j);
      out.push_back(!fused && c.add() ? got[i] + in.add[i] : got[i]);
    }
  return out;
}

std::vector<FusedLinearCase> fused_linear_cases() {
  std::vector<FusedLinearCase> cases;
  // GEMV to 8 rows (k 2048: one row the staged kernel, 3 and 8 the tensor-core one; 1000 the staged
  // kernel; 2056 the plain one, 7 its scalar path; 11264: one row the plain kernel, 3 and 8 the
  // tensor-core one in 5.5 chunks), cuBLASLt beyond
  for (int64_t m : {1, 3, 8, 9, 64})
    for (int64_t k : {2048, 1000, 7, 2056, 11264})
      for (int variant = 0; variant < 4; ++variant) cases.push_back({m, 300, k, variant});
  // cuBLASLt writing y itself (rows 256-byte aligned) with split activations: the halves as two
  // GEMMs from 512 rows, the lo one accumulating, the add (variant 4) as the hi one's C operand
  // (below 512 rows the halves still go through scratch; LinearBf16Activations covers the C
  // operand with one part).
  for (int64_t m : {9, 64, 600})
    for (int variant = 0; variant < 5; ++variant) cases.push_back({m, 512, 2048, variant});
  return cases;
}

TEST(OpsCpu, FusedLinearEqualsNormLinearAdd) {
  auto& cpu = *backends().cpu;
  uint64_t seed = 700;
  for (const FusedLinearCase& c : fused_linear_cases()) {
    const FusedLinearInputs in = fused_linear_inputs(c, seed += 5);
    EXPECT_EQ(run_fused_linear(cpu, c, in, true), run_fused_linear(cpu, c, in, false)) << c.str();
  }
}

TEST(Parity, LinearWithFusedNormAndAdd) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  uint64_t seed = 800;
  for (const FusedLinearCase& c : fused_linear_cases()) {
    const FusedLinearInputs in = fused_linear_inputs(c, seed += 5);
    EXPECT_LE(norm_err(run_fused_linear(*cpu, c, in, true), run_fused_linear(*gpu, c, in, true)), 1e-4) << c.str();
  }
}

// Past the GEMV sizes the input norm writes the GEMM's bf16 parts itself: the same bits as the
// rms_norm op's f32 rows split by the GEMM, with split and with bf16-rounded activations.
TEST(Parity, LinearNormPartsEqualNormThenLinear) {
  KILN_NEED_GPU();
  auto& gpu = *backends().gpu;
  uint64_t seed = 900;
  for (DType act : {DType::F32, DType::BF16}) {
    const GpuActivations mode(act);
    for (int64_t m : {9, 64, 600})
      for (int64_t k : {2048, 1000, 7})
        for (int variant : {0, 3})
          for (int64_t n : {300, 512}) {
            const FusedLinearCase c{m, n, k, variant};
            const FusedLinearInputs in = fused_linear_inputs(c, seed += 5);
            EXPECT_EQ(run_fused_linear(gpu, c, in, true), run_fused_linear(gpu, c, in, false))
                << c.str() << ", activations " << dtype_name(act);
          }
  }
}

TEST(Parity, KvScatterGather) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  const int64_t row = 576, bs = 64, blocks = 10;
  std::vector<int32_t> slots = {5, 64, 130, 639, 0};
  auto rows = randn(slots.size() * row, 13);
  std::vector<int32_t> table = {3, 1, 9, 0, 2, 5}, lens = {100, 70}, cu = {0, 100, 170};
  // Both pool types; bf16 stores round to nearest even on both backends, so results stay exact.
  for (DType dt : {DType::F32, DType::BF16}) {
    std::vector<float> out[2];
    ops::Backend* be[2] = {cpu.get(), gpu.get()};
    for (int b = 0; b < 2; ++b) {
      auto pool = put(*be[b], randn(static_cast<size_t>(blocks * bs * row), 14), dt);
      auto tr = put(*be[b], rows), ts = put_raw(*be[b], slots, DType::I32);
      be[b]->kv_scatter({tr.f32(), ts.t.as<int32_t>(), pool.t.data, dt, static_cast<int64_t>(slots.size()), row});
      auto tt = put_raw(*be[b], table, DType::I32), tl = put_raw(*be[b], lens, DType::I32),
           tc = put_raw(*be[b], cu, DType::I32);
      auto to = poisoned(*be[b], static_cast<size_t>(170 * row));
      be[b]->kv_gather({{pool.t.data, dt, tt.t.as<int32_t>(), tl.t.as<int32_t>(), bs, 3},
                        tc.t.as<int32_t>(),
                        2,
                        row,
                        170,
                        to.f32()});
      out[b] = get(*be[b], to);
    }
    EXPECT_EQ(norm_err(out[0], out[1]), 0.0) << dtype_name(dt);
  }
}

// mla_prepare's inputs laid out as the model has them: q and kva are strided views of one fused
// projection row (every head's nope ‖ rope, then c_kv ‖ k_pe, then 3 spare columns).
struct PrepareCase {
  int64_t heads, tokens, nope, rope, lora;
  DType pool_dtype = DType::F32;
  bool interleaved = true;
  bool in_place = true;  // q_out = q_in (expanded form); else into [T, heads, lora + rope] (absorbed)
  int64_t qk() const { return nope + rope; }
  int64_t row() const { return lora + rope; }
  int64_t ld() const { return heads * qk() + row() + 3; }
  int64_t num_slots() const { return tokens + 37; }
  std::string str() const {
    return std::to_string(heads) + " heads, " + std::to_string(tokens) + " tokens, rope " + std::to_string(rope) +
           ", lora " + std::to_string(lora) + ", " + dtype_name(pool_dtype) + " pool" +
           (interleaved ? ", interleaved" : ", NeoX") + (in_place ? ", in place" : ", into qa");
  }
};

struct PrepareInputs {
  std::vector<float> proj, norm_w, inv_freq;  // [T, ld], [lora] (bf16-representable), [rope / 2]
  std::vector<int32_t> pos, slots;            // [T]: slots distinct, scattered over the pool
};

PrepareInputs prepare_inputs(const PrepareCase& c, uint64_t seed) {
  PrepareInputs in;
  in.proj = randn(static_cast<size_t>(c.tokens * c.ld()), seed);
  in.norm_w = bf16_round(randn(static_cast<size_t>(c.lora), seed + 1));
  for (int64_t i = 0; i < c.rope / 2; ++i)
    in.inv_freq.push_back(std::pow(10000.0f, -static_cast<float>(2 * i) / static_cast<float>(c.rope)));
  std::mt19937_64 g(seed + 2);
  std::vector<int32_t> all(static_cast<size_t>(c.num_slots()));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), g);
  in.slots.assign(all.begin(), all.begin() + c.tokens);
  for (int64_t t = 0; t < c.tokens; ++t) in.pos.push_back(static_cast<int32_t>(g() % 32768));
  return in;
}

// What the op leaves behind: the projection buffer (q_pe rotated in place or not at all), the
// separate q buffer (absorbed form; NaN where nothing may be written) and the pool (NaN-poisoned
// before), all as raw bits.
struct PrepareOut {
  std::vector<float> proj, q, pool;
};

// Pool contents widened to f32 (NaN poison survives the round trip through bf16).
std::vector<float> get_pool(ops::Backend& be, const OwnedTensor& pool) {
  if (pool.t.dtype == DType::F32) return get(be, pool);
  std::vector<uint16_t> bits(static_cast<size_t>(pool.t.numel()));
  be.download(bits.data(), pool.t);
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_f32(bits[i]);
  return v;
}

// fused: mla_prepare; otherwise the op sequence it replaced (DeepseekV3Model::attention before the
// fusion: rope(q) in place, then the absorbed form's copy; kv_a's output contiguous, rms_norm and
// rope in place, kv_scatter).
PrepareOut run_prepare(ops::Backend& be, const PrepareCase& c, const PrepareInputs& in, bool fused) {
  const int64_t T = c.tokens, H = c.heads, ld = c.ld(), row = c.row();
  const DType wdt = be.device() == Device::CUDA ? DType::BF16 : DType::F32;
  auto proj = put(be, in.proj), w = put(be, in.norm_w, wdt), inv = put(be, in.inv_freq);
  auto pos = put_raw(be, in.pos, DType::I32), slots = put_raw(be, in.slots, DType::I32);
  auto pool = put(be, std::vector<float>(static_cast<size_t>(c.num_slots() * row), NAN), c.pool_dtype);
  auto q = poisoned(be, static_cast<size_t>(c.in_place ? 1 : T * H * row));
  float* q_in = proj.f32() + c.nope;  // head h of token t at q_in + t * ld + h * qk
  const float* kva = proj.f32() + H * c.qk();
  float* q_out = c.in_place ? q_in : q.f32() + c.lora;
  const int64_t out_stride = c.in_place ? ld : H * row, out_head = c.in_place ? c.qk() : row;
  if (fused) {
    be.mla_prepare({.q_in = q_in,
                    .q_in_stride = ld,
                    .q_in_head_stride = c.qk(),
                    .q_out = q_out,
                    .q_out_stride = out_stride,
                    .q_out_head_stride = out_head,
                    .num_heads = H,
                    .kva = kva,
                    .kva_stride = ld,
                    .norm_weight = w.t.data,
                    .norm_weight_dtype = w.t.dtype,
                    .eps = 1e-6f,
                    .positions = pos.t.as<int32_t>(),
                    .inv_freq = inv.f32(),
                    .attention_factor = 1.3f,
                    .interleaved = c.interleaved,
                    .slots = slots.t.as<int32_t>(),
                    .pool = pool.t.data,
                    .pool_dtype = c.pool_dtype,
                    .num_tokens = T,
                    .kv_lora = c.lora,
                    .rope_dim = c.rope});
  } else {
    be.rope({q_in, T, H, ld, c.qk(), c.rope, pos.t.as<int32_t>(), inv.f32(), 1.3f, c.interleaved});
    for (int64_t t = 0; t < T && !c.in_place; ++t)
      be.copy({q_in + t * ld, c.qk(), q_out + t * out_stride, out_head, H, c.rope});
    auto kv = poisoned(be, static_cast<size_t>(T * row));
    be.copy({kva, ld, kv.f32(), row, T, row});
    be.rms_norm({kv.f32(), row, w.t.data, w.t.dtype, kv.f32(), row, T, c.lora, 1e-6f});
    be.rope({kv.f32() + c.lora, T, 1, row, 0, c.rope, pos.t.as<int32_t>(), inv.f32(), 1.3f, c.interleaved});
    be.kv_scatter({kv.f32(), slots.t.as<int32_t>(), pool.t.data, c.pool_dtype, T, row});
  }
  return {get(be, proj), get(be, q), get_pool(be, pool)};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every heads count, 1..300 tokens, both pool types and rope layouts, in place and into qa.
std::vector<PrepareCase> prepare_cases(std::initializer_list<int64_t> heads, std::initializer_list<int64_t> tokens) {
  std::vector<PrepareCase> cases;
  for (int64_t h : heads)
    for (int64_t t : tokens)
      for (DType dt : {DType::F32, DType::BF16})
        for (bool inter : {true, false})
          for (bool in_place : {true, false}) cases.push_back({h, t, 128, 64, 512, dt, inter, in_place});
  // A small model's shape (odd latent width, narrow rope).
  for (bool in_place : {true, false}) cases.push_back({5, 9, 16, 8, 36, DType::BF16, true, in_place});
  return cases;
}

TEST(OpsCpu, MlaPrepareEqualsTheOpSequenceItReplaces) {
  auto& cpu = *backends().cpu;
  uint64_t seed = 500;
  for (const PrepareCase& c : prepare_cases({1, 5, 24, 128}, {1, 3, 64})) {
    const PrepareInputs in = prepare_inputs(c, ++seed);
    const PrepareOut fused = run_prepare(cpu, c, in, true), ops = run_prepare(cpu, c, in, false);
    EXPECT_TRUE(same_bits(fused.q, ops.q)) << c.str();
    EXPECT_TRUE(same_bits(fused.pool, ops.pool)) << c.str();  // the new rows, and nothing else
    // In place: q_pe rotated alike. Into qa: q_in only read (the old sequence rotated it first).
    // Either way kva stays as projected.
    EXPECT_TRUE(same_bits(fused.proj, c.in_place ? ops.proj : in.proj)) << c.str();
  }
}

TEST(Parity, MlaPrepare) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  uint64_t seed = 600;
  for (const PrepareCase& c : prepare_cases({1, 5, 8, 12, 16, 24, 64, 128}, {1, 2, 37, 300})) {
    const PrepareInputs in = prepare_inputs(c, ++seed);
    const PrepareOut want = run_prepare(*cpu, c, in, true), got = run_prepare(*gpu, c, in, true);
    EXPECT_LE(norm_err(want.proj, got.proj), 1e-5) << c.str();
    // Poison where the op must not write stays poison; everything else is checked below.
    for (size_t i = 0; i < want.q.size(); ++i)
      ASSERT_EQ(std::isnan(want.q[i]), std::isnan(got.q[i])) << c.str() << ", q[" << i << "]";
    std::vector<float> wq, gq;
    for (size_t i = 0; i < want.q.size(); ++i)
      if (!std::isnan(want.q[i])) wq.push_back(want.q[i]), gq.push_back(got.q[i]);
    EXPECT_LE(norm_err(wq, gq), 1e-5) << c.str();
    int64_t written = 0;
    compare_pool(want.pool, got.pool, c.pool_dtype == DType::BF16, c.str(), written);
    if (HasFatalFailure()) return;
    EXPECT_EQ(written, c.tokens * c.row()) << c.str();
  }
}

}  // namespace
}  // namespace kiln::test
