// Prefill-sized gate projection of the router, logits [T, E] = x [T, H] · W [E, H]ᵀ, on the tensor
// cores at f32 accuracy (3xTF32): each f32 operand is split into a tf32 big part and the tf32
// rounding of its remainder, and acc += big·small + small·big + big·big (small·small, ~2^-22
// relative, is dropped). Not bf16x3: in a CPU emulation of the parity shapes its ~2^-17 per-product
// error put logits ~5e-6 (of their max) off, half the tests' 1e-5, and flipped a near-tie choice;
// 3xTF32 stayed below the error of a plain f32 loop. The SIMT f32 GEMM this replaces took ~0.27 ms at
// T=8192, E=64, H=2048 (Moonlight); cuBLASLt's f32 GEMM 1.6 ms (N = 64 is too narrow for it).
//
// CTAs of 64 tokens x 64 experts x one slice of H. With a CTA per token tile, 1000 tokens ran on
// 16 of 132 SMs, each CTA walking all 64 k steps alone: 72 us; 8000 tokens took 74 us, one 4-warp
// CTA per SM, latency-bound. Now H splits into S slices, so the busiest SM holds ~2 CTAs
// (gate_gemm_splits); slice s writes its partial logits to [s][T][E], and the routing kernel sums
// the slices in the order s = 0, 1, ... (fixed: the same bits on every run, no atomics). The k loop
// does less per MMA as well: the tf32 splits round with integer ops, not cvt.rna.tf32 (integer
// ops run at 64 a clock per SM, conversions at 16), and a W that is exactly tf32 (any bf16
// checkpoint's gate) skips the big·small third of the MMAs, bit for bit the same (gemm_step).
//
// Measured on an H200 (Nsight Compute, caches flushed): 13 us at T = 1000 and 66 us at T = 8000,
// against the estimate below; the 8k gap (tensor or integer pipe, W re-reads from L2) is not
// understood yet. The estimate (132 SMs, ~4 TB/s of HBM, mma.sync taken at ~60% of the 495
// TFLOP/s dense tf32 peak: ~300 TFLOP/s). 2·T·E·H flops, 3 tf32 MMAs each (2 with a tf32-exact W). Bytes: x once
// from HBM; W (E·H·4) once per token tile, from L2; partials S·T·E·4, written and read back
// through L2. Moonlight (E = 64, H = 2048):
//   T = 1000: 0.26 GFLOP = 0.79 GFLOP of tf32 MMAs, ~2.6 us (1.7 exact W); x 8.2 MB, ~2 us; W 8.4 MB
//     from L2; 16 token tiles x 16 slices = 256 CTAs of 4 k steps; partials 4.1 MB. ~4-5 us (was 72).
//   T = 8000: 2.1 GFLOP = 6.3 GFLOP of tf32 MMAs, ~21 us (14 exact W); x 65.5 MB, ~16 us; W 65.5 MB
//     from L2; 125 tiles x 2 slices = 250 CTAs of 32 k steps; partials 4.1 MB. ~22-25 us (~18 with
//     an exact W; was 74).
#include <algorithm>
#include <string>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/moe/router_internal.cuh"
#include "ops/cuda/pdl.cuh"

namespace kiln::ops::cuda::router_detail {
namespace {

constexpr int kTokens = 64, kExperts = 64, kK = 32, kStages = 4;
constexpr int kSteps = kK / 8;  // m16n8k8 steps in one k step
constexpr int kThreads = 128;   // 2 x 2 warps of 32 tokens x 32 experts
constexpr int kStageFloats = (kTokens + kExperts) * kK;
// 64 KiB: up to 3 CTAs an SM. 3 stages in flight hold 24 KiB of x per CTA: ~1300 clocks of an SM's
// ~18 B/clk share of HBM, about the loaded latency (the W tiles come from L2).
constexpr int kSmem = kStages * kStageFloats * static_cast<int>(sizeof(float));
constexpr int kMaxSplits = 32;  // slices of H at most (route_sum_kernel reads each token's)
static_assert(kTokens == kExperts, "load_tile fills x and W tiles of the same height");

// d += a·b for one m16n8k8 tf32 tile (A row-major 16x8, B column-major 8x8, f32 accumulators).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// f32 bits rounded to tf32, to nearest with ties away from zero (cvt.rna's rounding, for finite
// values), in two integer instructions.
__device__ __forceinline__ uint32_t round_tf32(uint32_t v) {
  return (v + 0x1000u) & 0xffffe000u;
}

// v (f32 bits) as big + small, both tf32 (the MMA would otherwise drop their low 13 bits).
__device__ __forceinline__ void split_tf32(uint32_t v, uint32_t& big, uint32_t& small) {
  big = round_tf32(v);
  small = round_tf32(__float_as_uint(__uint_as_float(v) - __uint_as_float(big)));  // the remainder is exact
}

// Rows of a stage tile are kK floats (8 chunks of 16 bytes); chunk c of row r sits at c ^ (r % 8),
// so the 8 rows an ldmatrix phase reads, and the 4 rows a warp's cp.async fills, hit all 32 banks.
__device__ __forceinline__ int swz(int r, int c) {
  return r * kK + ((c ^ (r & 7)) << 2);
}

// Rows [0, rows) of a 64-row tile that starts at src (rows H floats apart), columns [k0, k0 + 32) ∩
// [0, H), into a stage tile, zeros elsewhere. Each thread keeps one chunk column and steps 16 rows.
// kVec (H % 4 == 0, 16-byte aligned rows): cp.async, each chunk wholly in or out of range; otherwise
// plain loads (an odd H misaligns the rows), made visible by the same barrier.
template <bool kVec>
__device__ __forceinline__ void load_tile(float* dst, const float* src, int rows, int64_t k0, int64_t H) {
  constexpr int kChunks = kK / 4, kRowStep = kThreads / kChunks;
  const int r0 = threadIdx.x / kChunks, c = threadIdx.x % kChunks;
  const int64_t k = k0 + 4 * c;
  const float* p = src + r0 * H + k;
#pragma unroll
  for (int u = 0; u < kTokens / kRowStep; ++u, p += kRowStep * H) {
    const int r = r0 + u * kRowStep;
    float* d = dst + swz(r, c);
    if constexpr (kVec) {
      const bool ok = r < rows && k < H;
      cp_async16(d, ok ? p : src, ok);
    } else {
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = r < rows && k + j < H ? __ldg(p + j) : 0.0f;
      *reinterpret_cast<float4*>(d) = make_float4(v[0], v[1], v[2], v[3]);
    }
  }
}

// One 32-wide k step of a warp's 32 x 32 tile into part: x fragments from the stage tile sa, split
// here; b holds the step's W fragments as loaded ([m16n8k8 step][n8 tile][register]). kSmallB: W's
// tf32 remainders are not all zero, so split b too and add big·small. Without them (a W that is
// exactly tf32, e.g. a bf16 checkpoint's gate widened to f32) every big·small product is 0, and an
// MMA that adds only zero products returns its accumulator unchanged: skipping those 8 of the 24
// MMAs (and the W splits) gives the same bits.
// Each x value is split by the 2 warps of its token rows, each W value by the 2 of its expert
// columns: 16 splits of 5 ALU instructions per 24 MMAs (8 per 16 with an exact W).
template <bool kSmallB>
__device__ __forceinline__ void gemm_step(float (&part)[2][4][4], const float* sa, const uint32_t (&b)[kSteps][4][2],
                                          int wm, int lane) {
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    // ldmatrix's b16 8x8 matrices are 8x4 f32 blocks, each thread's word at (lane / 4, lane % 4):
    // the tf32 fragment layout. A: rows +0/+8 by lane bit 3, k +0/+4 (chunk + 1) by lane bit 4.
    uint32_t ab[2][4], as[2][4], bb[4][2], bs[4][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      uint32_t v[4];
      ldmatrix_x4(v, sa + swz(wm * 32 + i * 16 + (lane & 15), 2 * ks + (lane >> 4)));
#pragma unroll
      for (int j = 0; j < 4; ++j) split_tf32(v[j], ab[i][j], as[i][j]);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if constexpr (kSmallB)
          split_tf32(b[ks][q][j], bb[q][j], bs[q][j]);
        else
          bb[q][j] = b[ks][q][j];  // already tf32: round_tf32 would return it as is
      }
    // Term by term over the 8 tiles: 8 independent MMAs between two into one accumulator. The
    // order (small terms first) is the one the CPU emulation checked.
    if constexpr (kSmallB) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) mma_tf32(part[i][q], ab[i], bs[q][0], bs[q][1]);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) mma_tf32(part[i][q], as[i], bb[q][0], bb[q][1]);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) mma_tf32(part[i][q], ab[i], bb[q][0], bb[q][1]);
  }
}

// 64 tokens (blockIdx.y) x 64 experts (blockIdx.x) x k steps [z·steps, (z + 1)·steps) of H
// (z = blockIdx.z) per CTA, through a 4-stage cp.async ring; the partial sums go to out + z·T·E.
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    gate_gemm_kernel(const float* x, const float* w, float* out, int64_t T, int64_t E, int64_t H, int steps) {
  extern __shared__ __align__(128) float smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 1, wn = warp & 1;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTokens, e0 = static_cast<int64_t>(blockIdx.x) * kExperts;
  const int nk = static_cast<int>((H + kK - 1) / kK);
  const int kt0 = static_cast<int>(blockIdx.z) * steps, n = min(steps, nk - kt0);  // n >= 1 (gate_gemm_splits)
  const int t_rows = static_cast<int>(min(static_cast<int64_t>(kTokens), T - t0));
  const int e_rows = static_cast<int>(min(static_cast<int64_t>(kExperts), E - e0));
  const float* xt = x + t0 * H;
  const float* wt = w + e0 * H;
  out += static_cast<int64_t>(blockIdx.z) * T * E;
  auto xs = [&](int stage) { return smem + stage * kStageFloats; };
  auto ws = [&](int stage) { return smem + stage * kStageFloats + kTokens * kK; };
  auto k_of = [&](int i) { return static_cast<int64_t>(kt0 + i) * kK; };  // first column of this CTA's step i
  // The gate weight is constant: its first stages load while the previous kernel finishes. They
  // join the first x stage's commit group, so the wait for that group covers them too.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < n) load_tile<kVec>(ws(s), wt, e_rows, k_of(s), H);
  pdl_wait();
  pdl_trigger();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n) load_tile<kVec>(xs(s), xt, t_rows, k_of(s), H);
    cp_async_commit();  // empty groups keep the wait count uniform
  }
  float acc[2][4][4] = {};
  for (int i = 0; i < n; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // step i landed for everyone; step i - 1 is no longer read
    if (const int next = i + kStages - 1; next < n) {
      load_tile<kVec>(xs(next % kStages), xt, t_rows, k_of(next), H);
      load_tile<kVec>(ws(next % kStages), wt, e_rows, k_of(next), H);
    }
    cp_async_commit();
    const float* sa = xs(i % kStages);
    const float* sb = ws(i % kStages);
    // The warp's W fragments of the whole step, and whether any has a tf32 remainder.
    uint32_t b[kSteps][4][2], low = 0;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks)
#pragma unroll
      for (int q = 0; q < 4; q += 2) {  // one x4 load: n8 tiles q and q + 1, k halves 0 and 1
        const int r = wn * 32 + q * 8 + ((lane >> 4) << 3) + (lane & 7);
        uint32_t v[4];
        ldmatrix_x4(v, sb + swz(r, 2 * ks + ((lane >> 3) & 1)));
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          b[ks][q + j / 2][j % 2] = v[j];
          low |= v[j];
        }
      }
    // Tensor cores round their f32 sums toward zero (measured on V100-A100, Fasi et al. 2021): in an
    // emulation, 3 x 256 MMAs into one accumulator shrank H = 2048 logits by ~3e-5 relative, past
    // the tests' 1e-5. So each 32-wide k step (12 MMAs) sums into fresh registers, added to acc with
    // a rounded f32 add: ~6e-7 in the same emulation, below a plain f32 loop's error.
    float part[2][4][4] = {};
    if (__any_sync(0xffffffffu, (low & 0x1fffu) != 0))
      gemm_step<true>(part, sa, b, wm, lane);
    else
      gemm_step<false>(part, sa, b, wm, lane);
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[a][q][v] += part[a][q][v];
  }
  cp_async_wait<0>();
  // Accumulators v and v + 1 of tile (i, q): token lane / 4 (+8 for v = 2), experts 2 · (lane % 4)
  // and the next (one 8-byte store when E is even: then both are in range together).
  const bool pairs = E % 2 == 0 && (reinterpret_cast<uintptr_t>(out) & 7) == 0;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int v = 0; v < 4; v += 2) {
        const int64_t t = t0 + wm * 32 + i * 16 + (lane >> 2) + (v >> 1) * 8;
        const int64_t e = e0 + wn * 32 + q * 8 + 2 * (lane & 3);
        if (t >= T || e >= E) continue;
        float* o = out + t * E + e;
        if (pairs) {
          *reinterpret_cast<float2*>(o) = make_float2(acc[i][q][v], acc[i][q][v + 1]);
        } else {
          o[0] = acc[i][q][v];
          if (e + 1 < E) o[1] = acc[i][q][v + 1];
        }
      }
}

}  // namespace

// The fewest slices (none empty) that minimise the k steps on the busiest SM, tried up to the first
// count that gives every SM 2 CTAs on average: a CTA costs its steps plus ~3 (pipeline fill, its
// partials' write and read), and a lone CTA on an SM counts twice (4 warps alone hide little
// latency). Moonlight (E = 64, H = 2048) on 132 SMs: 257 tokens -> 32 slices of 2 k steps, 1000 ->
// 16 of 4, 2048 -> 8 of 8, 4096 -> 4 of 16, 8000 -> 2 of 32, 16384 -> 1. DeepSeek-V3 (E = 256,
// H = 7168): 1000 -> 4, 4096 -> 1.
int gate_gemm_splits(int64_t T, int64_t E, int64_t H) {
  const int nk = static_cast<int>((H + kK - 1) / kK);
  const int64_t tiles = static_cast<int64_t>(blocks_for(E, kExperts)) * blocks_for(T, kTokens);
  const int sms = sm_count();
  int best = 1;
  int64_t best_cost = INT64_MAX;
  for (int s = 1; s <= std::min(kMaxSplits, nk); ++s) {
    const int steps = (nk + s - 1) / s;
    if ((nk + steps - 1) / steps != s) continue;    // s would leave a slice empty
    const int64_t m = (tiles * s + sms - 1) / sms;  // CTAs on the busiest SM
    const int64_t cost = (m == 1 ? 2 : m) * (steps + 3);
    if (cost < best_cost) best_cost = cost, best = s;
    if (tiles * s >= 2 * sms) break;  // more would trade partials' traffic for a rounder last wave
  }
  return best;
}

void gate_gemm(const float* x, const float* w, float* out, int64_t T, int64_t E, int64_t H, int splits,
               cudaStream_t s) {
  KILN_REQUIRE(blocks_for(T, kTokens) <= 65535, "router: " + std::to_string(T) + " tokens exceed the gate GEMM's grid");
  const int nk = static_cast<int>((H + kK - 1) / kK), steps = (nk + splits - 1) / splits;
  KILN_REQUIRE(splits >= 1 && splits <= kMaxSplits && (nk + steps - 1) / steps == splits,
               "router: " + std::to_string(splits) + " gate GEMM slices of " + std::to_string(nk) + " k steps");
  const bool vec = H % 4 == 0 && aligned16(x) && aligned16(w);
  auto* kernel = vec ? gate_gemm_kernel<true> : gate_gemm_kernel<false>;
  static SmemGrants smem_done[2];
  allow_smem(kernel, kSmem, smem_done[vec ? 1 : 0]);
  const dim3 grid(blocks_for(E, kExperts), blocks_for(T, kTokens), static_cast<unsigned>(splits));
  launch_pdl(kernel, grid, dim3(kThreads), kSmem, s, x, w, out, T, E, H, steps);
}

}  // namespace kiln::ops::cuda::router_detail
