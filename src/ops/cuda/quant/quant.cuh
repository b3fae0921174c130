// Quantized weights as the CUDA kernels read them (params.h WeightScales): a device view of one
// [n, k] weight or a stack of them (heads, experts), and the lane-partial dot products of its rows
// with f32 activations that the decode GEMVs and the MoE decode kernels share. Weights are decoded
// in registers: e4m3 pairs through the f16x2 conversion (exact), INT4 nibbles by the 2^23 trick
// (exact), each 16-byte chunk's dot product scaled once (a chunk never straddles a scale block).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "ops/cuda/cuda_common.cuh"
#include "ops/params.h"

namespace kiln::ops::cuda::quant {

enum class Fmt : int32_t { BF16 = 0, FP8 = 1, INT4 = 2 };

// Columns one 16-byte chunk of a row holds.
template <Fmt F>
constexpr int kChunkCols = F == Fmt::BF16 ? 8 : (F == Fmt::FP8 ? 16 : 32);

struct QView {
  const uint8_t* w = nullptr;   // matrix m, row r at w + m * mat_bytes + r * row_bytes
  const void* scale = nullptr;  // null: no scales (bf16, or unscaled e4m3)
  int64_t k = 0, row_bytes = 0, mat_bytes = 0;
  int64_t scale_mat = 0;  // scale elements between matrices
  int64_t grid_k = 0;     // ceil(k / block_k): scales per scale row
  int32_t block_n = 1, block_k = 1;
  Fmt fmt = Fmt::BF16;
  bool scale_bf16 = false;
  bool vec = false;  // rows in whole 16-byte chunks on 16-byte boundaries, no chunk across a scale block
};

// The view of weight w (dtype t, scales s) of [n, k] per matrix, matrices mat_elems elements of t
// and scale_mat_elems scales apart. Throws on what the kernels cannot read.
QView make_view(const char* what, const void* w, DType t, const WeightScales& s, int64_t k, int64_t mat_elems,
                int64_t scale_mat_elems);
// Whether (t, s) needs this folder's kernels (anything but plain bf16 / f32).
inline bool is_quantized(DType t, const WeightScales& s) {
  return s.quantized() || t == DType::F8E4M3 || t == DType::I4X8;
}

// Scale of column c in the scale row starting at srow.
__device__ __forceinline__ float scale_at(const QView& q, int64_t srow, int64_t c) {
  if (!q.scale) return 1.0f;
  const int64_t i = srow + static_cast<uint32_t>(c) / static_cast<uint32_t>(q.block_k);
  return q.scale_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(q.scale)[i])
                      : static_cast<const float*>(q.scale)[i];
}

// Element c of a row, unscaled (the scalar path).
template <Fmt F>
__device__ __forceinline__ float raw_value(const uint8_t* row, int64_t c) {
  if constexpr (F == Fmt::BF16) {
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(row)[c]);
  } else if constexpr (F == Fmt::FP8) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(row[c], __NV_E4M3);
    return __half2float(__half(h));
  } else {
    const uint32_t word = reinterpret_cast<const uint32_t*>(row)[c / 8];
    return static_cast<float>(static_cast<int>((word >> (4 * (c % 8))) & 0xfu) - 8);
  }
}

// Values 8 * sub .. 8 * sub + 7 of a chunk, in column order.
template <Fmt F>
__device__ __forceinline__ void decode8(const uint4& v, int sub, float (&f)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  if constexpr (F == Fmt::BF16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 p = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
      f[2 * i] = p.x, f[2 * i + 1] = p.y;
    }
  } else if constexpr (F == Fmt::FP8) {
    // Bytes 8 * sub ..: words 2 * sub and 2 * sub + 1, the lowest byte the first column.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t word = words[2 * sub + i / 2];
      const auto pair = static_cast<__nv_fp8x2_storage_t>(i % 2 == 0 ? word & 0xffffu : word >> 16);
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);  // low byte -> .x
      const float2 p = __half22float2(__half2(h));
      f[2 * i] = p.x, f[2 * i + 1] = p.y;
    }
  } else {
    // Word `sub`, nibble j (bits 4j up) is column 8 * sub + j: (2^23 + nibble) - (2^23 + 8), exact.
    const uint32_t word = words[sub];
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = __uint_as_float(0x4b000000u | ((word >> (4 * j)) & 0xfu)) - 8388616.0f;
  }
}

// acc[r][t] += lane-partial dot products of R weight rows (rows[r] of matrix mat) with `rows`
// (<= M) activation rows x + t * xs, over all k columns. xvec: x and xs allow 16-byte loads.
template <Fmt F, int M, int R>
__device__ __forceinline__ void rows_dot_fmt(const QView& q, int64_t mat, const int64_t (&r)[R], const float* x,
                                             int64_t xs, int rows, bool xvec, int lane, float (&acc)[R][M]) {
  const uint8_t* row[R];
  int64_t srow[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    row[i] = q.w + mat * q.mat_bytes + r[i] * q.row_bytes;
    srow[i] = q.scale ? r[i] / q.block_n * q.grid_k + mat * q.scale_mat : 0;
  }
  if (q.vec && xvec) {
    constexpr int C = kChunkCols<F>, U = R == 1 ? 4 : 2;  // 16-byte loads a lane per stage: 4
    const int64_t chunks = q.k / C;
    // Two stages: the next U chunks' loads are issued before the current ones are decoded, so a warp
    // keeps bytes in flight while it computes (FP8 and INT4 carry 2-4x bf16's values a byte).
    auto load = [&](uint4(&v)[U][R], int64_t base) {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int i = 0; i < R; ++i)
          if (base + u * 32 < chunks) v[u][i] = __ldcs(reinterpret_cast<const uint4*>(row[i]) + base + u * 32);
    };
    // x is loaded once per 8 columns for all R rows.
    auto compute = [&](const uint4(&v)[U][R], int64_t base) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t ch = base + u * 32;
        if (ch >= chunks) break;
        const int64_t c0 = ch * C;
        float part[R][M] = {};
#pragma unroll
        for (int sub = 0; sub < C / 8; ++sub) {
          float f[R][8];
#pragma unroll
          for (int i = 0; i < R; ++i) decode8<F>(v[u][i], sub, f[i]);
#pragma unroll
          for (int t = 0; t < M; ++t) {
            if (t >= rows) break;
            const float4* xp = reinterpret_cast<const float4*>(x + t * xs + c0 + 8 * sub);
            const float4 a = __ldg(xp), b = __ldg(xp + 1);
#pragma unroll
            for (int i = 0; i < R; ++i)
              part[i][t] += f[i][0] * a.x + f[i][1] * a.y + f[i][2] * a.z + f[i][3] * a.w + f[i][4] * b.x +
                            f[i][5] * b.y + f[i][6] * b.z + f[i][7] * b.w;
          }
        }
#pragma unroll
        for (int i = 0; i < R; ++i) {
          const float s = scale_at(q, srow[i], c0);
#pragma unroll
          for (int t = 0; t < M; ++t) acc[i][t] += s * part[i][t];
        }
      }
    };
    uint4 va[U][R], vb[U][R];
    load(va, lane);
    for (int64_t base = lane; base < chunks; base += 2 * U * 32) {
      load(vb, base + U * 32);
      compute(va, base);
      load(va, base + 2 * U * 32);
      compute(vb, base + U * 32);
    }
  } else {
    for (int64_t c = lane; c < q.k; c += 32)
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const float wv = raw_value<F>(row[i], c) * scale_at(q, srow[i], c);
#pragma unroll
        for (int t = 0; t < M; ++t)
          if (t < rows) acc[i][t] += wv * x[t * xs + c];
      }
  }
}

// rows_dot_fmt for the view's format (a uniform branch; the loops inside are specialised).
template <int M, int R>
__device__ __forceinline__ void rows_dot(const QView& q, int64_t mat, const int64_t (&r)[R], const float* x, int64_t xs,
                                         int rows, bool xvec, int lane, float (&acc)[R][M]) {
  switch (q.fmt) {
    case Fmt::BF16: rows_dot_fmt<Fmt::BF16, M, R>(q, mat, r, x, xs, rows, xvec, lane, acc); break;
    case Fmt::FP8: rows_dot_fmt<Fmt::FP8, M, R>(q, mat, r, x, xs, rows, xvec, lane, acc); break;
    case Fmt::INT4: rows_dot_fmt<Fmt::INT4, M, R>(q, mat, r, x, xs, rows, xvec, lane, acc); break;
  }
}

// The dequantizing row pass (quant_dequant.cu): mats stacked matrices of [n, k] -> bf16
// [mats, n, k] at out (scaled values rounded to nearest even).
void dequantize_bf16(const QView& q, int64_t mats, int64_t n, __nv_bfloat16* out, cudaStream_t s);

}  // namespace kiln::ops::cuda::quant
