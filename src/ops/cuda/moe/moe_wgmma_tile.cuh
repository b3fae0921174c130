// The wgmma expert GEMMs' tile (moe_wgmma.cu): its sizes, shared-memory ring, arguments and the two
// epilogues, one for each accumulator layout the kernel's two forms leave.
//  - token-major: warpgroup wg's m64n256 wgmmas hold tokens 64 wg.. by the tile's 256 weight rows;
//  - weight-major: warpgroup wg's two m64nN blocks hold 64 weight rows each by the tile's first N
//    tokens (wgmma's A the weights, B the tokens).
// Accumulator element (column block j, v) of a 64-row block: row 16 wq + lane / 4 (+ 8 for v >= 2),
// column 8 j + 2 (lane % 4) + (v & 1) (wgmma.cuh). Only the tile's n_real real rows (a prefix:
// moe_align pads each expert's last tile at its end) are written: padding rows of act and y stay
// unwritten, as nothing reads them.
#pragma once

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/mma.cuh"

namespace kiln::ops::cuda::moe_detail::wgmma_tile {

constexpr int kBM = 128, kBN = 256, kBK = 64, kThreads = 256;
constexpr int kAPanel = kBM * 128, kBPanel = kBN * 128;                      // bytes: 16 KB, 32 KB
constexpr int kAChunks = kBM * 8 / kThreads, kBChunks = kBN * 8 / kThreads;  // 16-byte copies per thread

// Stage: the A panel of each activation part (hi, and lo when split), then the weight panel.
template <bool kSplit>
struct Pipe {
  static constexpr int kParts = kSplit ? 2 : 1;
  static constexpr int kStageBytes = kParts * kAPanel + kBPanel;  // 48 KB, 64 KB split
  static constexpr int kStages = kSplit ? 3 : 4;
  static constexpr size_t kSmemBytes = 1024 + size_t{kStages} * kStageBytes;  // +1024: aligning the base
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

struct Args {
  const __nv_bfloat16* a;      // gate/up: x parts [parts][T][lda]; down: act parts [parts][rows][lda]
  int64_t a_lo, lda;           // element offset of the lo part; row stride
  const int32_t* sorted_slot;  // slot of padded row r, -1 for padding; gate/up: its A row is slot / top_k
  int64_t top_k;
  const int32_t* tile_expert;  // [max_tiles] of 128-row tiles; -1 past the real ones
  const __nv_bfloat16* w;      // [E, w_rows, K]
  int64_t w_rows, K, n;        // n: output columns (inter or hidden)
  __nv_bfloat16* act;          // gate/up out: [parts][rows][ldo] (lo at act + act_lo)
  int64_t act_lo, ldo;
  void* y;               // down out: [rows, n], f32 (split) or bf16
  int weight_major_max;  // tiles of at most this many real rows take the weight-major form
};

// The epilogue's staging for bf16 outputs (act; y with bf16 activations): the tile's outputs as
// token rows of kRowBytes (one part), kPitch apart, in the ring's shared memory (idle once the K
// loop is done). The 16 bytes of padding spread one fragment store's rows over the banks.
template <bool kGateUp, bool kSplit>
struct Staging {
  static constexpr int kRowBytes = (kGateUp ? kBN / 2 : kBN) * 2;  // 256 or 512
  static constexpr int kPitch = kRowBytes + 16;
  static constexpr int kParts = kGateUp && kSplit ? 2 : 1;  // act hi and lo
  static constexpr int kChunks = kRowBytes / 16;            // 16-byte copies a row
  static_assert(size_t{kParts} * kBM * kPitch <= Pipe<kSplit>::kSmemBytes - 1024, "staging fits the ring");
};

// Staged rows out: chunk c of staged token row r is columns n0 + 8 c.. of padded row tile * kBM + r,
// 16 bytes a thread, a warp's stores contiguous. Stored straight from the fragments, a warp's store
// had covered 8 rows x 16 bytes, and at a 1k-token prefill the down kernel's epilogue held 21% of
// its warps' stall samples (the gate/up kernel's 8%; Nsight Compute, H200, session 21); with one
// CTA per SM, no loads overlap it.
template <bool kGateUp, bool kSplit>
__device__ __forceinline__ void copy_out(const Args& p, int64_t tile, int n_real, int64_t n0,
                                         const unsigned char* smem) {
  using St = Staging<kGateUp, kSplit>;
  __syncthreads();
  __nv_bfloat16* const dst = kGateUp ? p.act : static_cast<__nv_bfloat16*>(p.y);
  const int64_t ld = kGateUp ? p.ldo : p.n;
  for (int i = threadIdx.x; i < n_real * St::kChunks; i += kThreads) {
    const int r = i / St::kChunks, c = i % St::kChunks;
    const int64_t row = tile * kBM + r, col = n0 + 8 * c;
    if (col >= p.n) continue;
#pragma unroll
    for (int part = 0; part < St::kParts; ++part)
      *reinterpret_cast<uint4*>(dst + (part ? p.act_lo : 0) + row * ld + col) =
          *reinterpret_cast<const uint4*>(smem + (part * kBM + r) * St::kPitch + c * 16);
  }
}

// Token-major accumulators: acc[4 j + v] of warpgroup wg is token 64 wg + 16 wq + lane / 4 (+ 8)
// by weight row 8 j + 2 (lane % 4) (+ 1); for gate/up, columns c and c + 128 are the gate and up
// values of the same (token, j). f32 y (down, split activations) is stored straight: a warp's
// float2 stores cover 8 rows x 32 bytes, whole sectors; staged, it was slower at 8k than these
// direct stores in the same run (853-860 vs 841-844 us; H200, session 21).
template <bool kGateUp, bool kSplit>
__device__ __forceinline__ void store_token_major(const Args& p, const float (&acc)[128], int64_t tile, int n_real,
                                                  int64_t n0, int wg, int wq, int lane, unsigned char* smem) {
  const int row_base = wg * 64 + wq * 16 + lane / 4;
  const int col_base = 2 * (lane % 4);
  if constexpr (!kGateUp && kSplit) {
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
      const int64_t col = n0 + 8 * j + col_base;
      if (col >= p.n) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (row_base + 8 * h < n_real)
          *reinterpret_cast<float2*>(static_cast<float*>(p.y) + (tile * kBM + row_base + 8 * h) * p.n + col) =
              make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    }
  } else {
    using St = Staging<kGateUp, kSplit>;
    __syncthreads();  // both warpgroups' wgmmas are done reading the ring
    if constexpr (kGateUp) {
#pragma unroll
      for (int j = 0; j < kBN / 16; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v[2];
#pragma unroll
          for (int i = 0; i < 2; ++i) v[i] = silu_mul(acc[4 * j + 2 * h + i], acc[4 * (j + kBN / 16) + 2 * h + i]);
          const int at = (row_base + 8 * h) * St::kPitch + (8 * j + col_base) * 2;
          __nv_bfloat16 hi[2], lo[2];
          store_bf16_parts(v[0], &hi[0], &lo[0]);
          store_bf16_parts(v[1], &hi[1], &lo[1]);
          *reinterpret_cast<__nv_bfloat162*>(smem + at) = __halves2bfloat162(hi[0], hi[1]);
          if constexpr (kSplit)
            *reinterpret_cast<__nv_bfloat162*>(smem + kBM * St::kPitch + at) = __halves2bfloat162(lo[0], lo[1]);
        }
    } else {
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<uint32_t*>(smem + (row_base + 8 * h) * St::kPitch + (8 * j + col_base) * 2) =
              pack_bf16(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    }
    copy_out<kGateUp, kSplit>(p, tile, n_real, n0, smem);
  }
}

// Weight-major accumulators: acc[64 b + 4 j + v] of warpgroup wg is weight row wrow(b) + 16 wq +
// lane / 4 (+ 8) by token 8 j + 2 (lane % 4) (+ 1), j < N / 8: wrow(b) = 64 wg (gate) and 128 +
// 64 wg (up) of the panel for gate/up, so a thread's two blocks hold the gate and up values of
// the same (token, j); 128 wg + 64 b (output columns) for down. A warp's store then covers 8
// output columns of 4 tokens: 2-byte stores into the staging, 4-byte ones of f32 y (4 tokens x 32
// bytes, whole sectors).
template <bool kGateUp, bool kSplit>
__device__ __forceinline__ void store_weight_major(const Args& p, const float (&acc)[128], int64_t tile, int n_real,
                                                   int64_t n0, int wg, int wq, int lane, unsigned char* smem) {
  const int wr = wq * 16 + lane / 4, tok = 2 * (lane % 4);
  if constexpr (!kGateUp && kSplit) {
    float* const y = static_cast<float*>(p.y) + tile * kBM * p.n + n0;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      if (8 * j >= n_real) break;
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const int t = 8 * j + tok + (v & 1), col = 128 * wg + 64 * b + wr + 8 * (v >> 1);
          if (t < n_real && n0 + col < p.n) y[int64_t{t} * p.n + col] = acc[64 * b + 4 * j + v];
        }
    }
  } else {
    using St = Staging<kGateUp, kSplit>;
    __syncthreads();  // both warpgroups' wgmmas are done reading the ring
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      if (8 * j >= n_real) break;
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int t = 8 * j + tok + (v & 1), r = wr + 8 * (v >> 1);
        if constexpr (kGateUp) {
          __nv_bfloat16 hi, lo;
          store_bf16_parts(silu_mul(acc[4 * j + v], acc[64 + 4 * j + v]), &hi, &lo);
          const int at = t * St::kPitch + (64 * wg + r) * 2;
          *reinterpret_cast<__nv_bfloat16*>(smem + at) = hi;
          if constexpr (kSplit) *reinterpret_cast<__nv_bfloat16*>(smem + kBM * St::kPitch + at) = lo;
        } else {
#pragma unroll
          for (int b = 0; b < 2; ++b)
            *reinterpret_cast<__nv_bfloat16*>(smem + t * St::kPitch + (128 * wg + 64 * b + r) * 2) =
                __float2bfloat16_rn(acc[64 * b + 4 * j + v]);
        }
      }
    }
    copy_out<kGateUp, kSplit>(p, tile, n_real, n0, smem);
  }
}

}  // namespace kiln::ops::cuda::moe_detail::wgmma_tile
