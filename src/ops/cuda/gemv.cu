// Decode-sized GEMVs: m <= kGemvMaxRows rows of f32 activations against bf16 weights, bound by
// reading the weights once. Three kernels:
//  - gemv_kernel: one warp per weight row, 4 16-byte loads in flight per lane (any k);
//  - gemv_staged_kernel: the same with each warp's row copied into shared memory first (k <= 2048);
//  - gemv_mma_kernel: 2-8 rows on tensor cores (k % 32 == 0), the default there.
#include "ops/cuda/gemv.h"

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/env.h"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/pdl.cuh"

namespace kiln::ops::cuda {
namespace {

// Small-m GEMV over bf16 weights with f32 activations: one warp per output row reads the weight
// row once for all m <= kGemvMaxRows activation rows; blockIdx.y picks the head; add (laid out as
// y, may be null) is added in the epilogue. Decode is this kernel reading weights, so it must keep
// enough bytes in flight to saturate HBM: every lane issues kUnroll 16-byte weight loads before it
// uses any of them. (8 instead of 4 took 60 instead of 39 registers, fewer CTAs fit, and a
// single-stream step got 0.1 ms slower on H200.) It serves what the two kernels below do not: one
// row of more than kStagedMaxK weights, or 2-8 rows whose k is not a multiple of 32.
//
// Measured and removed: the input RMSNorm inside the GEMV (each warp summing the squares of the x
// rows it reads, norm_weight folded into the weights). It saved a launch, but the staged GEMV after
// a separate rms_norm copies its weights while the norm runs, and that won: H200 whole steps,
// separate vs fused at 1 / 2 / 8 rows, 2.65 vs 2.77, 3.84 vs 4.03, 10.31 vs 11.23 ms. The norm
// folded into the staged kernel (every warp summing v² beside its dot product, y scaled after)
// lost too (session 10: 2.80-2.88 vs 2.61 ms at one row, 11.16 vs 10.58 at 8): without the norm
// launch between them the GEMV follows the MoE down kernel, whose CTAs fill every SM, so its
// CTAs become resident, and start their copies, only as that kernel drains.
constexpr int kGemvWarps = 8;
constexpr int kUnroll = 4;

// y[t, h, r] for this warp's row r: the warp-partial sums in acc, plus add.
template <int M>
__device__ __forceinline__ void gemv_store(const LinearHeadsParams& p, const float* add, int64_t h, int64_t r,
                                           float (&acc)[M]) {
#pragma unroll
  for (int t = 0; t < M; ++t) {
    if (t >= p.m) break;
    const float v = warp_sum(acc[t]);
    const int64_t o = t * p.y_stride + h * p.y_head_stride + r;
    if ((threadIdx.x & 31) == 0) p.y[o] = add ? v + add[o] : v;
  }
}

template <int M>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(LinearHeadsParams p, const float* add) {
  const int lane = threadIdx.x & 31;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kGemvWarps, h = blockIdx.y;
  if (threadIdx.x == 0 && p.k % 8 == 0) {  // weights are constant: fetch them early
    const auto* rows = static_cast<const __nv_bfloat16*>(p.w) + h * p.w_head_stride + r0 * p.k;
    if (aligned16(rows))
      prefetch_l2(rows, static_cast<uint32_t>(min(static_cast<int64_t>(kGemvWarps), p.n - r0) * p.k * 2));
  }
  pdl_wait();  // activations (x, add) only from here on
  pdl_trigger();
  const int rows = static_cast<int>(p.m);  // <= M: launch_gemv picks M
  const float* x = p.x + h * p.x_head_stride;
  const int64_t r = r0 + (threadIdx.x >> 5);
  if (r >= p.n) return;
  const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(p.w) + h * p.w_head_stride + r * p.k;
  float acc[M] = {};
  const bool vec = p.k % 8 == 0 && aligned16(w) && aligned16(x) && p.x_stride % 4 == 0 && p.x_head_stride % 4 == 0;
  if (vec) {
    const uint4* w4 = reinterpret_cast<const uint4*>(w);
    const int64_t n8 = p.k / 8;
    for (int64_t base = lane; base < n8; base += kUnroll * 32) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (base + u * 32 < n8) v[u] = __ldcs(w4 + base + u * 32);  // streamed once: keep L2 for x
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (base + u * 32 < n8) dot8_accumulate<M>(v[u], x, p.x_stride, (base + u * 32) * 8, rows, acc);
    }
  } else {
    for (int64_t i = lane; i < p.k; i += 32) {
      const float wv = __bfloat162float(w[i]);
#pragma unroll
      for (int t = 0; t < M; ++t)
        if (t < rows) acc[t] += wv * x[t * p.x_stride + i];
    }
  }
  gemv_store<M>(p, add, h, r, acc);
}

// The one-row GEMV for rows of at most kStagedMaxK weights (Moonlight: q + kv_a, W_uv, o_proj, the
// dense gate/up and lm_head; not the dense down or anything at DeepSeek-V3's hidden 7,168; 2-8 rows
// with k % 32 == 0 take the tensor-core kernel below, other 2-8 row shapes this one): each warp
// first starts copying its whole weight row into shared memory with cp.async, before the wait, so
// the weights must not be written by the kernel launched just before (they are constant). The
// copies are in flight without holding registers, so a CTA keeps all 8 rows in flight where
// gemv_kernel kept 4 chunks per lane, and with programmatic dependent launch a CTA that starts
// early has its rows on the way while the kernel before it still runs: a latency-bound kernel
// there (an RMSNorm, MLA decode) costs the weight stream nothing. Dynamic shared memory:
// kGemvWarps · k bf16. Measured and left out (session 10): x copied into shared memory too, every
// thread's loads issued at once, so the dot products wait for one round trip instead of k / 256
// (same single-stream steps, 2.64 / 2.59 vs 2.64 / 2.54 ms; 3.81 vs 3.67 at two rows). Also left
// out (session 12): this kernel preferring the most shared memory (the carveout attribute), so
// that o_proj keeps W_uv's L1/shared split and becomes resident while W_uv runs: the two cost 6.7
// instead of 9.4 us a layer in the kernel trace, but whole single-stream steps took 2.53 / 2.53 vs
// 2.50 / 2.51 ms (H200).
constexpr int kStagedMaxK = 2048;
static_assert(kGemvWarps * kStagedMaxK * 2 <= 48 * 1024, "past 48 KB the launch needs cudaFuncSetAttribute first");

template <int M>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_staged_kernel(LinearHeadsParams p, const float* add) {
  extern __shared__ uint4 rows_s[];  // [kGemvWarps][k / 8]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n8 = static_cast<int>(p.k / 8);
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kGemvWarps, h = blockIdx.y;
  const int64_t r = min(r0 + warp, p.n - 1);  // rows past n copy row n - 1 and write nothing
  const uint4* w4 =
      reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.w) + h * p.w_head_stride + r * p.k);
  uint4* row = rows_s + warp * n8;
  for (int i = lane; i < n8; i += 32) cp_async16(row + i, w4 + i, true);
  cp_async_commit();
  pdl_wait();  // activations (x, add) only from here on
  pdl_trigger();
  const float* x = p.x + h * p.x_head_stride;
  cp_async_wait<0>();  // this lane's own chunks of the row
  float acc[M] = {};
  for (int i = lane; i < n8; i += 32) dot8_accumulate<M>(row[i], x, p.x_stride, i * 8, static_cast<int>(p.m), acc);
  if (r0 + warp < p.n) gemv_store<M>(p, add, h, r, acc);
}

// 2-8 rows on tensor cores. Past one row the CUDA-core kernels above are bound by their x loads,
// not the weights: every 16-byte weight load pairs with two float4 of x per row (256 bytes of L1
// traffic per 16 weight bytes at 8 rows), and a batch-8 step spent 5x the single-stream time in
// its projections (session 10 ablation, H200: 3.17 vs 0.64 ms; 1.64 ms with this kernel's first
// form, its tile staged in shared memory). Here one m16n8k16 MMA takes 16 weight rows x 16 columns
// against every activation row at once (the MMA's N of 8), so a warp reads each x column once per
// 16 weight rows. f32 x enters as two bf16 parts (x ≈ hi + lo, ~16 mantissa bits, as in the
// cuBLASLt path's split activations; the CUDA-core kernels keep all 24): the parity bounds of the
// f32 path hold. It splits x even under --activation-dtype bf16: the second MMA costs nothing in a
// kernel bound by its weight bytes.
//
// CTA: weight rows [r0, r0 + 16) of head blockIdx.y; warp w takes the 32-column blocks w, w + 8, ...
// (any k, k % 32 == 0), its lanes' weight loads held in registers, the first 2048 columns' issued
// before the wait (the weights are constant); the warps' partial sums are added in warp order (the
// same bits on every run).
// Fragments: mma_gemv_block below.
// Measured and left out (session 11, H200): the tile staged in shared memory by cp.async (66.5 KB
// a CTA at k 2048, which leaves the L1 ~30 KB for x): batch 8 steps 8.62-8.67 vs 8.52-8.58 ms here
// (separate runs).
constexpr int kMmaRows = 16;  // weight rows per CTA: the MMA's M
constexpr int kMmaWarps = 8;
constexpr int kMmaCols = 32;   // columns per block: 4 lanes x 8
constexpr int kMmaBlocks = 8;  // blocks a warp holds at once
static_assert(kMmaRows * kGemvMaxRows <= kMmaWarps * 32, "one thread per output of the tile");

// The bf16 parts of two f32 (lower k first): hi = bf16(v), lo = bf16(v - hi) (store_bf16_parts,
// two at a time, as one bf16x2 register each).
__device__ __forceinline__ void split_pair(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 f = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(a - f.x, b - f.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// Columns [0, 8) of an activation row (16-byte aligned; null: zeros) as mma_gemv_block's parts.
__device__ __forceinline__ void split_x8(const float* x, uint32_t (&hi)[4], uint32_t (&lo)[4]) {
  float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
  if (x) x0 = __ldg(reinterpret_cast<const float4*>(x)), x1 = __ldg(reinterpret_cast<const float4*>(x) + 1);
  split_pair(x0.x, x0.y, hi[0], lo[0]);
  split_pair(x0.z, x0.w, hi[1], lo[1]);
  split_pair(x1.x, x1.y, hi[2], lo[2]);
  split_pair(x1.z, x1.w, hi[3], lo[3]);
}

// One 32-column block: 16 weight rows against up to 8 activation rows (the MMA's N). A dot product
// does not care which column meets which MMA k index, only that A and B agree: lane (g, c) = (lane
// / 4, lane % 4) holds the block's 8 columns [8c, 8c + 8) of weight rows g (ra) and g + 8 (rb), one
// 16-byte load each, and of activation row g as bf16 hi/lo pairs (columns 8c + 2i and 8c + 2i + 1
// in hi[i], lo[i]); columns 8c..8c+3 are the first MMA's k indices 2c, 2c+1, 2c+8, 2c+9 (A's and
// B's register order), 8c+4..8c+7 the second's. acc ends as {row g, act 2c}, {g, 2c+1}, {g+8, 2c},
// {g+8, 2c+1}.
__device__ __forceinline__ void mma_gemv_block(float (&acc)[4], const uint4& ra, const uint4& rb,
                                               const uint32_t (&hi)[4], const uint32_t (&lo)[4]) {
  const uint32_t a0[4] = {ra.x, rb.x, ra.y, rb.y}, a1[4] = {ra.z, rb.z, ra.w, rb.w};
  mma_bf16(acc, a0, hi[0], hi[1]);
  mma_bf16(acc, a0, lo[0], lo[1]);
  mma_bf16(acc, a1, hi[2], hi[3]);
  mma_bf16(acc, a1, lo[2], lo[3]);
}

__global__ void __launch_bounds__(kMmaWarps * 32) gemv_mma_kernel(LinearHeadsParams p, const float* add) {
  __shared__ float4 part_s[kMmaWarps][32];  // every lane's accumulators
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kMmaRows, h = blockIdx.y, blocks = p.k / kMmaCols;
  const auto* w = static_cast<const __nv_bfloat16*>(p.w) + h * p.w_head_stride;
  // Rows past n load row n - 1 and write nothing.
  const uint4* wa = reinterpret_cast<const uint4*>(w + min(r0 + g, p.n - 1) * p.k) + c;
  const uint4* wb = reinterpret_cast<const uint4*>(w + min(r0 + g + 8, p.n - 1) * p.k) + c;
  // k is taken in chunks of kMmaWarps · kMmaBlocks blocks (2048 columns): the first chunk's loads
  // are in flight before the wait, each later one's as the warp reaches it.
  uint4 ra[kMmaBlocks], rb[kMmaBlocks];
  auto load = [&](int64_t base) {
#pragma unroll
    for (int i = 0; i < kMmaBlocks; ++i) {
      const int64_t j = base + warp + i * kMmaWarps;
      if (j < blocks) ra[i] = __ldcs(wa + 4 * j), rb[i] = __ldcs(wb + 4 * j);
    }
  };
  load(0);
  pdl_wait();  // activations (x, add) only from here on
  pdl_trigger();
  const float* x = g < p.m ? p.x + h * p.x_head_stride + g * p.x_stride + 8 * c : nullptr;
  float acc[4] = {};
  for (int64_t base = 0; base < blocks; base += kMmaWarps * kMmaBlocks) {
    if (base > 0) load(base);
#pragma unroll
    for (int i = 0; i < kMmaBlocks; ++i) {
      const int64_t j = base + warp + i * kMmaWarps;
      if (j >= blocks) break;
      uint32_t hi[4], lo[4];
      split_x8(x ? x + kMmaCols * j : nullptr, hi, lo);
      mma_gemv_block(acc, ra[i], rb[i], hi, lo);
    }
  }
  part_s[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  __syncthreads();
  if (threadIdx.x >= kMmaRows * kGemvMaxRows) return;
  const int row = threadIdx.x % kMmaRows, t = threadIdx.x / kMmaRows;  // neighbours write neighbouring rows
  const int64_t r = r0 + row;
  if (t >= p.m || r >= p.n) return;
  // Output (row, t) is accumulator (row >> 3) * 2 + (t & 1) of lane (row & 7) * 4 + (t >> 1)
  // (mma_gemv_block's layout): the float4s of part_s read as one array of floats.
  const float* part = reinterpret_cast<const float*>(&part_s[0][(row & 7) * 4 + (t >> 1)]) + (row >> 3) * 2 + (t & 1);
  float v = 0.0f;
#pragma unroll
  for (int w = 0; w < kMmaWarps; ++w) v += part[w * 32 * 4];
  const int64_t o = t * p.y_stride + h * p.y_head_stride + r;
  p.y[o] = add ? v + add[o] : v;
}

// Fewest rows the tensor-core GEMV takes (KILN_GEMV_MMA_MIN_ROWS, default 2; past kGemvMaxRows:
// never).
int gemv_mma_min_rows() {
  static const int v = static_cast<int>(env_int("KILN_GEMV_MMA_MIN_ROWS", 2, 1, kGemvMaxRows + 1));
  return v;
}

}  // namespace

void launch_gemv(const LinearHeadsParams& p, const float* add, cudaStream_t s) {
  KILN_REQUIRE(p.m >= 1 && p.m <= kGemvMaxRows, "gemv: " + std::to_string(p.m) + " rows (1 to 8)");
  const dim3 grid(blocks_for(p.n, kGemvWarps), static_cast<unsigned>(p.heads));
  using Kernel = void (*)(LinearHeadsParams, const float*);
  // rows as a template parameter: no dead accumulators, fully unrolled x loads
  static const Kernel plain[] = {gemv_kernel<1>, gemv_kernel<2>, gemv_kernel<3>, gemv_kernel<4>,
                                 gemv_kernel<5>, gemv_kernel<6>, gemv_kernel<7>, gemv_kernel<8>};
  static const Kernel staged[] = {gemv_staged_kernel<1>, gemv_staged_kernel<2>, gemv_staged_kernel<3>,
                                  gemv_staged_kernel<4>, gemv_staged_kernel<5>, gemv_staged_kernel<6>,
                                  gemv_staged_kernel<7>, gemv_staged_kernel<8>};
  const int64_t i = p.m - 1;
  const bool strides4 = p.x_stride % 4 == 0 && p.x_head_stride % 4 == 0 && p.w_head_stride % 8 == 0;
  if (p.m >= gemv_mma_min_rows() && p.k % kMmaCols == 0 && strides4 && aligned16(p.w) && aligned16(p.x)) {
    launch_pdl(gemv_mma_kernel, dim3(blocks_for(p.n, kMmaRows), static_cast<unsigned>(p.heads)), dim3(kMmaWarps * 32),
               0, s, p, add);
    return;
  }
  if (p.k % 8 == 0 && p.k <= kStagedMaxK && strides4 && aligned16(p.w) && aligned16(p.x)) {
    launch_pdl(staged[i], grid, dim3(kGemvWarps * 32), static_cast<size_t>(kGemvWarps * p.k * 2), s, p, add);
    return;
  }
  launch_pdl(plain[i], grid, dim3(kGemvWarps * 32), 0, s, p, add);
}

}  // namespace kiln::ops::cuda
