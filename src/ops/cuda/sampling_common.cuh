// Device helpers of the sample op (sampling.cu): order codes, fixed-point weights, block
// reductions, chunked row loads and the per-row state the multi-CTA passes hand each other.
#pragma once

#include <cub/block/block_scan.cuh>

#include "ops/cuda/cuda_common.cuh"
#include "ops/params.h"

namespace kiln::ops::cuda::sampling {

using u64 = unsigned long long;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kDigitBits = 11;  // radix digits of 11, 11 and 10 bits: 3 passes over a row
constexpr int kBins = 1 << kDigitBits;
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kItems = 8;              // consecutive tokens per thread in the draw scan (id order)
constexpr int kMaxTop = 20;            // = kMaxTopLogprobs
constexpr float kMassScale = 0x1p42f;  // vocab < 2^22 keeps sums of 2^42-scaled weights in u64
constexpr uint32_t kAllTies = 0xFFFFFFFFu;

// Ascending code <=> descending value (the cut order); -0 folds into +0 so equal floats tie.
__device__ __forceinline__ uint32_t order_code(float x) {
  const uint32_t u = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (u & 0x80000000u) ? u : (~u & 0x7FFFFFFFu);
}
__device__ __forceinline__ float code_value(uint32_t c) {
  return __uint_as_float((c & 0x80000000u) ? c : (~c & 0x7FFFFFFFu));
}

// The fixed-point weight of a logit; exactly 2^42 at the max.
__device__ __forceinline__ u64 weight_q(float x, float mx, float temp) {
  return __float2ull_rn(expf(__fdiv_rn(__fsub_rn(x, mx), temp)) * kMassScale);
}

struct ArgMax {
  float v;
  int i;
};
// (value desc, index asc); an empty slot (v -inf, i INT_MAX) loses to any real -inf.
__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  return (a.v > b.v || (a.v == b.v && a.i < b.i)) ? a : b;
}

// A kept prefix of the order: tokens with code < `code`, plus the first `ties` (lowest ids) of
// those with code == `code` (kAllTies: all of them).
struct Cut {
  uint32_t code, ties, count;
  u64 mass;
};

// What the passes of one row hand each other (global scratch, zero at first use).
struct RowState {
  float lse, mx;  // logsumexp of the raw row; max of the (penalised) row
  int arg;        // its argmax
  int dead;       // the running radix select found no bin (unreachable with exact sums)
  u64 z_all, z_min;
  uint32_t c_min;  // tokens with l >= the min-p threshold, and their mass
  uint32_t prefix, mask, above_count;
  u64 above_mass;
  Cut cut;
};

// Per (row, chunk) partials, merged by the row's last CTA.
struct Partial {
  float m, s;  // online softmax
  ArgMax am;
  u64 mass;       // kept mass below the cut code (draw)
  uint32_t ties;  // tokens at the cut code (draw)
};

struct Reduce {
  union {
    cub::BlockScan<u64, kThreads>::TempStorage scan64;
    cub::BlockScan<uint32_t, kThreads>::TempStorage scan32;
  } scan;
  ArgMax am[kWarps];
  float m[kWarps], s[kWarps];
  u64 u[kWarps][2];
  uint32_t c[kWarps];
  int flag;
};

__device__ __forceinline__ ArgMax block_argmax(ArgMax a, Reduce& sm) {
  for (int o = 16; o > 0; o >>= 1)
    a = better(a, ArgMax{__shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.i, o)});
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sm.am[threadIdx.x >> 5] = a;
  __syncthreads();
  a = sm.am[0];
  for (int w = 1; w < kWarps; ++w) a = better(a, sm.am[w]);
  return a;
}

// Online softmax partials (running max m, sum s of exp(x - m)).
__device__ __forceinline__ void merge_ms(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}
__device__ __forceinline__ void block_ms(float& m, float& s, Reduce& sm) {
  for (int o = 16; o > 0; o >>= 1)
    merge_ms(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sm.m[threadIdx.x >> 5] = m, sm.s[threadIdx.x >> 5] = s;
  __syncthreads();
  m = sm.m[0], s = sm.s[0];
  for (int w = 1; w < kWarps; ++w) merge_ms(m, s, sm.m[w], sm.s[w]);
}

// Sums of (a, b, c) across the block, in a fixed order (exact: integers).
__device__ __forceinline__ void block_sum3(u64& a, u64& b, uint32_t& c, Reduce& sm) {
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
    c += __shfl_xor_sync(0xffffffffu, c, o);
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sm.u[threadIdx.x >> 5][0] = a, sm.u[threadIdx.x >> 5][1] = b, sm.c[threadIdx.x >> 5] = c;
  __syncthreads();
  a = b = 0, c = 0;
  for (int w = 0; w < kWarps; ++w) a += sm.u[w][0], b += sm.u[w][1], c += sm.c[w];
}

// Up to 4 consecutive logits [i, i + 4) of [.., end): one float4 load when the row is 16-byte
// aligned (chunks start at multiples of 4), -inf past the end. Returns how many are real.
__device__ __forceinline__ int load4(const float* row, int64_t i, int64_t end, bool aligned, float (&x)[4]) {
  if (aligned && i + 4 <= end) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(row + i));
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    return 4;
  }
  for (int k = 0; k < 4; ++k) x[k] = i + k < end ? row[i + k] : -INFINITY;
  return static_cast<int>(max(int64_t{0}, min(int64_t{4}, end - i)));
}

// Every CTA of a row calls this once its partials are written; true in the row's last CTA, which
// then sees all of them (read them with __ldcg). The counter is back at 0 for the next launch.
__device__ __forceinline__ bool arrive_last(unsigned* counter, unsigned ctas, Reduce& sm) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const bool last = atomicAdd(counter, 1u) == ctas - 1;
    if (last) atomicExch(counter, 0u), __threadfence();
    sm.flag = last;
  }
  __syncthreads();
  return sm.flag != 0;
}

// Per-row global scratch that must be zero when a launch starts: every user leaves it zero.
struct ZeroRow {
  u64 mass[kBins];
  uint32_t count[kBins];
  unsigned counter;
  unsigned pad[3];
};

struct Plan {
  int64_t chunks, chunk_len;
  RowState* rs;   // [rows]
  Partial* part;  // [rows, chunks]
  float* top_v;   // [rows, chunks, kMaxTop]
  int* top_i;     // [rows, chunks, kMaxTop]
  float* copy;    // [rows, vocab] when penalties
  ZeroRow* zero;  // [rows]
};

struct RowCtx {
  int64_t r, ch, n, c0, c1;
  const float* raw;
  bool penalised;
};

__device__ __forceinline__ RowCtx row_ctx(const SampleParams& p, const Plan& P) {
  RowCtx c;
  c.r = blockIdx.y, c.ch = blockIdx.x, c.n = p.vocab;
  c.c0 = c.ch * P.chunk_len, c.c1 = min(c.n, c.c0 + P.chunk_len);
  c.raw = p.logits + c.r * (p.logits_stride ? p.logits_stride : c.n);
  const float rep = p.repetition[c.r], pres = p.presence[c.r], freq = p.frequency[c.r];
  const int b = p.pen_offsets ? p.pen_offsets[c.r] : 0, e = p.pen_offsets ? p.pen_offsets[c.r + 1] : 0;
  c.penalised = e > b && (rep != 1.0f || pres != 0.0f || freq != 0.0f);
  return c;
}

}  // namespace kiln::ops::cuda::sampling
