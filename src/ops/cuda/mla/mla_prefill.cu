// Expanded MLA (prefill form): flash-attention over per-head k = (k_nope ‖ k_pe) and v, causal,
// variable-length sequences whose earlier context came from the paged cache (gathered). k_nope and v
// are read straight from the kv_b_proj output (per head k_nope ‖ v) and the shared k_pe straight from
// the gathered latent rows: both kernels assemble a key row in shared memory from the two sources.
//
// Two kernels:
//  - qk 192 / v 128 (every DeepSeek-V3-family checkpoint): flash-attention-2 on tensor cores,
//    mma_flash::kernel below (mma.sync m16n8k16 bf16 -> f32).
//  - any other head dims (small test configs): the f32 CUDA-core kernel mla_prefill_kernel.
//
// The f32 kernel: a CTA takes 16 query rows of one head and streams 32-key tiles through shared
// memory with an online softmax. Rows of a tile may belong to different sequences (at sequence
// boundaries); each row masks keys outside its own causal range. Any head count works: heads are a
// grid dimension.
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/mma.cuh"

namespace kiln::ops::cuda {
namespace {

constexpr int kQ = 16;  // query rows per CTA
constexpr int kK = 32;  // keys per tile
constexpr int kThreads = 256;
constexpr int kMaxV = 256;  // v_head_dim limit: 256 threads x 16 rows x 1 column

// grid: (ceil(total_q / kQ), num_heads)
__global__ void __launch_bounds__(kThreads) mla_prefill_kernel(MlaExpandedParams p, int64_t total_q) {
  extern __shared__ float smem[];
  const int64_t qk = p.qk_dim, vd = p.v_dim, qpad = qk + 1, vpad = vd + 1;
  float* q_s = smem;                      // [kQ][qpad]
  float* k_s = q_s + kQ * qpad;           // [kK][qpad]
  float* v_s = k_s + kK * qpad;           // [kK][vpad]
  float* p_s = v_s + kK * vpad;           // [kQ][kK]
  float* sc_s = p_s + kQ * kK;            // [kQ]
  float* m_s = sc_s + kQ;                 // [kQ]
  float* l_s = m_s + kQ;                  // [kQ]
  __shared__ int64_t lo_s[kQ], hi_s[kQ];  // each row's key range [lo, hi) in the gathered k/v

  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kQ, h = blockIdx.y;
  const int tid = threadIdx.x;
  const int64_t nq = min(static_cast<int64_t>(kQ), total_q - q0);
  if (tid < kQ) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
    lo_s[tid] = 0;
    hi_s[tid] = 0;
    if (tid < nq) {
      const int64_t row = q0 + tid, b = seq_of(p.seqs.cu_q, p.seqs.num_seqs, row);
      const int64_t q_len = p.seqs.cu_q[b + 1] - p.seqs.cu_q[b];
      const int64_t kv0 = p.seqs.cu_kv[b], kv_len = p.seqs.cu_kv[b + 1] - kv0;
      lo_s[tid] = kv0;
      hi_s[tid] = kv0 + kv_len - q_len + (row - p.seqs.cu_q[b]) + 1;
    }
  }
  for (int64_t i = tid; i < kQ * qk; i += kThreads) {
    const int64_t r = i / qk, d = i % qk;
    q_s[r * qpad + d] = r < nq ? p.q[(q0 + r) * p.q_stride + h * qk + d] : 0.0f;
  }
  __syncthreads();
  int64_t klo = INT64_MAX, khi = 0;
  for (int r = 0; r < nq; ++r) {
    klo = min(klo, lo_s[r]);
    khi = max(khi, hi_s[r]);
  }
  // Output: thread -> (row tid / 16, columns tid % 16 + 16 * c).
  const int orow = tid / 16, ocol = tid % 16;
  float acc[kMaxV / 16];
#pragma unroll
  for (int c = 0; c < kMaxV / 16; ++c) acc[c] = 0.0f;

  // Key row j of this head: columns [0, nope) from kv_b, [nope, qk) from the shared k_pe; value
  // row j: kv_b's columns [nope, nope + vd) of this head.
  const int64_t nope = p.nope_dim;
  const float* kvb_h = p.kv_b + h * (nope + vd);  // row j at kvb_h + j * kv_b_stride
  for (int64_t kb = klo; kb < khi; kb += kK) {
    const int64_t n = min(static_cast<int64_t>(kK), khi - kb);
    for (int64_t i = tid; i < n * qk; i += kThreads) {
      const int64_t r = i / qk, d = i % qk;
      k_s[r * qpad + d] =
          d < nope ? kvb_h[(kb + r) * p.kv_b_stride + d] : p.k_pe[(kb + r) * p.k_pe_stride + (d - nope)];
    }
    for (int64_t i = tid; i < n * vd; i += kThreads) {
      const int64_t r = i / vd, d = i % vd;
      v_s[r * vpad + d] = kvb_h[(kb + r) * p.kv_b_stride + nope + d];
    }
    __syncthreads();
    for (int pair = tid; pair < kQ * kK; pair += kThreads) {  // scores
      const int r = pair / kK, c = pair % kK;
      const int64_t key = kb + c;
      float s = -INFINITY;
      if (r < nq && c < n && key >= lo_s[r] && key < hi_s[r]) {
        s = 0.0f;
        for (int64_t d = 0; d < qk; ++d) s += q_s[r * qpad + d] * k_s[c * qpad + d];
        s *= p.scale;
      }
      p_s[r * kK + c] = s;
    }
    __syncthreads();
    if (tid < kQ) {
      sc_s[tid] = online_softmax_step(p_s + tid * kK, kK, m_s[tid], l_s[tid]);
    }
    __syncthreads();
    const float sc = sc_s[orow];
#pragma unroll
    for (int c = 0; c < kMaxV / 16; ++c) {
      const int64_t col = ocol + 16 * c;
      if (col >= vd) break;
      float a = acc[c] * sc;
      for (int64_t j = 0; j < n; ++j) a += p_s[orow * kK + j] * v_s[j * vpad + col];
      acc[c] = a;
    }
    __syncthreads();
  }
  if (orow < nq) {
    const float inv = l_s[orow] > 0 ? 1.0f / l_s[orow] : 0.0f;
#pragma unroll
    for (int c = 0; c < kMaxV / 16; ++c) {
      const int64_t col = ocol + 16 * c;
      if (col >= vd) break;
      p.out[((q0 + orow) * p.num_heads + h) * vd + col] = acc[c] * inv;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Flash-attention-2 on tensor cores for qk 192 / v 128.
//
// CTA: one head, one 128-query tile of one sequence; 8 warps, warp w owns query rows 16w..16w+15
// of the tile. Keys stream in 64-row tiles. Inputs are f32 in global memory, so a tile is copied
// raw (cp.async, 16 B chunks, rows past the visible range zero-filled; a key row's chunks come from
// kv_b for k_nope and from k_pe for the rest) into an f32 staging area and
// then converted once by the whole CTA into padded bf16 tiles for ldmatrix; the copy of tile j+1 is
// in flight while tile j is computed (the staging area is a second buffer beside the bf16 one).
//   S = Q·Kᵀ   Q fragments (16 x 192 bf16 per warp) stay in registers for the whole CTA; K via
//              ldmatrix (rows = keys, so no transpose), 8 n-tiles x 12 k-steps per warp;
//   softmax    f32 online softmax in registers with exp2 (scale·log2e folded into one FMA); each
//              row's four partial maxima/sums live in the quad of lanes that holds the row;
//   O += P·V   the S accumulators are rounded to bf16 and reused directly as A fragments (the
//              m16n8 C layout of two adjacent n-tiles is the m16k16 A layout); V via ldmatrix.trans.
// Causal masking only on tiles that reach past the first row's diagonal. Varlen: the grid is
// total_q / 128 + num_seqs CTAs wide (an upper bound on sum ceil(q_len / 128)); warp 0 maps the
// CTA index to (sequence, query tile) with a warp scan over cu_q, and spare CTAs exit. Query tiles
// of a sequence are issued last-first (most keys first) so the causal tail stays short.
//
// Shared memory: Q 128 x 200 bf16 (51,200 B) + K 64 x 200 bf16 (25,600 B) + V 64 x 136 bf16
// (17,408 B) + f32 staging K 64 x 192 and V 64 x 128 (81,920 B) = 176,128 B; the +8 bf16 per row
// put the 8 rows of an ldmatrix on distinct 16-byte bank groups.
namespace mma_flash {

constexpr int kQk = 192, kV = 128;
constexpr int kBM = 128, kBN = 64, kWarps = kBM / 16, kThreads = kWarps * 32;
constexpr int kQkPad = kQk + 8, kVPad = kV + 8;  // bf16 row strides
constexpr int kQBytes = kBM * kQkPad * 2, kKBytes = kBN * kQkPad * 2, kVBytes = kBN * kVPad * 2;
constexpr int kKfBytes = kBN * kQk * 4, kVfBytes = kBN * kV * 4;
constexpr size_t kSmem = static_cast<size_t>(kQBytes + kKBytes + kVBytes + kKfBytes + kVfBytes);
constexpr int kQkSteps = kQk / 16, kSTiles = kBN / 8, kOTiles = kV / 8, kPvSteps = kBN / 16;
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kQk % 32 == 0 && kV % 16 == 0 && kBN % 16 == 0, "fragment shapes");
static_assert(kSmem <= 227 * 1024, "shared memory");

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared through L2 only; src_bytes 0 zero-fills the destination.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ float fast_exp2(float x) {  // ex2.approx: exp2(-inf) = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// Four f32 as four bf16 (8 bytes) at dst.
__device__ __forceinline__ void store_bf16x4(__nv_bfloat16* dst, float4 v) {
  uint2 u;
  u.x = pack_bf16(v.x, v.y);
  u.y = pack_bf16(v.z, v.w);
  *reinterpret_cast<uint2*>(dst) = u;
}

// grid: (total_q / kBM + num_seqs, num_heads); block kThreads.
__global__ void __launch_bounds__(kThreads, 1) kernel(MlaExpandedParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem);                            // [kBM][kQkPad]
  __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(smem + kQBytes);                  // [kBN][kQkPad]
  __nv_bfloat16* v_s = reinterpret_cast<__nv_bfloat16*>(smem + kQBytes + kKBytes);        // [kBN][kVPad]
  float* kf_s = reinterpret_cast<float*>(smem + kQBytes + kKBytes + kVBytes);             // [kBN][kQk]
  float* vf_s = reinterpret_cast<float*>(smem + kQBytes + kKBytes + kVBytes + kKfBytes);  // [kBN][kV]
  __shared__ int tile_seq, tile_qb;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t H = p.num_heads, h = blockIdx.y;

  // CTA index -> (sequence, query tile): tiles of sequence b are ceil(q_len_b / kBM) consecutive
  // indices; a warp scan over 32 sequences at a time finds the one holding blockIdx.x.
  if (warp == 0) {
    const int t = static_cast<int>(blockIdx.x);
    int found_b = -1, found_local = 0, base = 0;
    for (int64_t b0 = 0; b0 < p.seqs.num_seqs; b0 += 32) {
      const int64_t b = b0 + lane;
      const int n = b < p.seqs.num_seqs ? (p.seqs.cu_q[b + 1] - p.seqs.cu_q[b] + kBM - 1) / kBM : 0;
      int incl = n;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      const int excl = incl - n;
      const unsigned hit = __ballot_sync(0xffffffffu, t >= base + excl && t < base + incl);
      if (hit) {
        const int src = __ffs(static_cast<int>(hit)) - 1;
        found_b = static_cast<int>(b0) + src;
        found_local = t - base - __shfl_sync(0xffffffffu, excl, src);
        break;
      }
      base += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) {
      tile_seq = found_b;
      tile_qb = found_local;
    }
  }
  __syncthreads();
  if (tile_seq < 0) return;  // a spare CTA of the upper-bound grid
  const int64_t b = tile_seq;
  const int64_t q0 = p.seqs.cu_q[b], q_len = p.seqs.cu_q[b + 1] - q0;
  const int64_t kv0 = p.seqs.cu_kv[b], kv_len = p.seqs.cu_kv[b + 1] - kv0;
  const int64_t n_qb = (q_len + kBM - 1) / kBM;
  const int64_t i0 = (n_qb - 1 - tile_qb) * kBM;  // last tile first: it has the most keys
  const int64_t rows = min(static_cast<int64_t>(kBM), q_len - i0);
  const int64_t diag = kv_len - q_len + i0;  // query row r of the tile sees keys [0, diag + r]
  const int64_t k_end = diag + rows;         // keys any valid row sees
  const int n_tiles = static_cast<int>((k_end + kBN - 1) / kBN);

  // Key j of the sequence: k_nope at kvb_base + j * kv_b_stride (nope floats), k_pe at
  // kpe_base + j * k_pe_stride (kQk - nope floats), v at kvb_base + j * kv_b_stride + nope. nope,
  // both strides and both bases are multiples of 4 floats (uses_mma), so every 16-byte chunk of a
  // key row lies in one source.
  const int64_t nope = p.nope_dim, nope_chunks = nope / 4;
  const float* kvb_base = p.kv_b + kv0 * p.kv_b_stride + h * (nope + kV);
  const float* kpe_base = p.k_pe + kv0 * p.k_pe_stride;
  auto issue_tile = [&](int j) {
    const int64_t j0 = static_cast<int64_t>(j) * kBN;
    constexpr int kKChunks = kQk / 4, kVChunks = kV / 4;  // 16-byte chunks per row
    for (int c = tid; c < kBN * kKChunks; c += kThreads) {
      const int r = c / kKChunks, col = c % kKChunks;
      const bool in = j0 + r < k_end;
      const float* src = kvb_base;  // any valid address when zero-filling
      if (in) {
        src = col < nope_chunks ? kvb_base + (j0 + r) * p.kv_b_stride + col * 4
                                : kpe_base + (j0 + r) * p.k_pe_stride + (col - nope_chunks) * 4;
      }
      cp_async16(smem_u32(kf_s + c * 4), src, in ? 16 : 0);
    }
    for (int c = tid; c < kBN * kVChunks; c += kThreads) {
      const int r = c / kVChunks, col = c % kVChunks;
      const bool in = j0 + r < k_end;
      const float* src = kvb_base + (in ? (j0 + r) * p.kv_b_stride + nope + col * 4 : 0);
      cp_async16(smem_u32(vf_s + c * 4), src, in ? 16 : 0);
    }
    cp_async_commit();
  };
  auto convert_tile = [&]() {
    for (int c = tid; c < kBN * kQk / 4; c += kThreads) {
      const int r = c / (kQk / 4), col = c % (kQk / 4);
      store_bf16x4(k_s + r * kQkPad + col * 4, reinterpret_cast<const float4*>(kf_s)[c]);
    }
    for (int c = tid; c < kBN * kV / 4; c += kThreads) {
      const int r = c / (kV / 4), col = c % (kV / 4);
      store_bf16x4(v_s + r * kVPad + col * 4, reinterpret_cast<const float4*>(vf_s)[c]);
    }
  };

  issue_tile(0);
  // Q tile -> bf16 in shared memory (rows past the sequence are zero), then into registers.
  {
    const float* q_base = p.q + (q0 + i0) * p.q_stride + h * kQk;
    constexpr int kChunks = kQk / 4;
#pragma unroll 4
    for (int c = tid; c < kBM * kChunks; c += kThreads) {
      const int r = c / kChunks, col = c % kChunks;
      float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r < rows) x = __ldg(reinterpret_cast<const float4*>(q_base + r * p.q_stride) + col);
      store_bf16x4(q_s + r * kQkPad + col * 4, x);
    }
  }
  cp_async_wait_all();
  __syncthreads();
  uint32_t qf[kQkSteps][4];
  {
    const __nv_bfloat16* base = q_s + (warp * 16 + lane % 16) * kQkPad + (lane / 16) * 8;
#pragma unroll
    for (int kk = 0; kk < kQkSteps; ++kk) ldsm_x4(qf[kk], smem_u32(base + kk * 16));
  }
  convert_tile();
  __syncthreads();
  if (n_tiles > 1) issue_tile(1);

  const float sl2 = p.scale * kLog2e;
  const int g = lane / 4, t4 = lane % 4;
  const int64_t row_lim0 = diag + warp * 16 + g;  // last key visible to this thread's first row
  float o[kOTiles][4];
#pragma unroll
  for (int d = 0; d < kOTiles; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  // ldmatrix lane addresses (bf16 elements): K rows = keys (x4 = one 8-key n-tile, two k-steps);
  // V rows = keys, transposed (x4 = one 16-key k-step, two 8-column n-tiles).
  const __nv_bfloat16* k_lane = k_s + (lane % 8) * kQkPad + (lane / 8) * 8;
  const __nv_bfloat16* v_lane = v_s + (lane % 16) * kVPad + (lane / 16) * 8;

  for (int j = 0; j < n_tiles; ++j) {
    const int64_t j0 = static_cast<int64_t>(j) * kBN;
    float s[kSTiles][4];
#pragma unroll
    for (int n = 0; n < kSTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kQkSteps; kk += 2) {
#pragma unroll
      for (int n = 0; n < kSTiles; ++n) {
        uint32_t bk[4];
        ldsm_x4(bk, smem_u32(k_lane + n * 8 * kQkPad + kk * 16));
        mma_bf16(s[n], qf[kk], bk[0], bk[1]);
        mma_bf16(s[n], qf[kk + 1], bk[2], bk[3]);
      }
    }
    if (j0 + kBN - 1 > diag) {  // the tile reaches past some row's diagonal: mask
#pragma unroll
      for (int n = 0; n < kSTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t key = j0 + n * 8 + 2 * t4 + (e & 1);
          if (key > row_lim0 + (e >= 2 ? 8 : 0)) s[n][e] = -INFINITY;
        }
      }
    }
    // Online softmax per row (r = 0: row g, r = 1: row g + 8); scores stay in raw units, the
    // exponent is s * scale * log2e - m * scale * log2e.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int n = 0; n < kSTiles; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float ms = mx == -INFINITY ? 0.0f : mx * sl2;
      const float alpha = fast_exp2(m[r] * sl2 - ms);  // 0 while m was -inf
      m[r] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kSTiles; ++n) {
        s[n][2 * r] = fast_exp2(fmaf(s[n][2 * r], sl2, -ms));
        s[n][2 * r + 1] = fast_exp2(fmaf(s[n][2 * r + 1], sl2, -ms));
        sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      l[r] = l[r] * alpha + sum;
#pragma unroll
      for (int d = 0; d < kOTiles; ++d) {
        o[d][2 * r] *= alpha;
        o[d][2 * r + 1] *= alpha;
      }
    }
    // O += P·V over the tile's 64 keys, 16 at a time.
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) {
      uint32_t a[4];
      a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int d = 0; d < kOTiles; d += 2) {
        uint32_t bv[4];
        ldsm_x4_t(bv, smem_u32(v_lane + kk * 16 * kVPad + d * 8));
        mma_bf16(o[d], a, bv[0], bv[1]);
        mma_bf16(o[d + 1], a, bv[2], bv[3]);
      }
    }
    if (j + 1 < n_tiles) {
      cp_async_wait_all();
      __syncthreads();  // every warp is done with tile j; tile j+1's staging copy is visible
      convert_tile();
      __syncthreads();  // bf16 tile j+1 visible; staging free again
      if (j + 2 < n_tiles) issue_tile(j + 2);
    }
  }

  // Normalise and store: thread holds rows g and g+8 of its warp, columns 8d + 2*t4 (+1).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int64_t row = warp * 16 + g + 8 * r;
    if (row >= rows) continue;
    const float inv = 1.0f / sum;
    float* dst = p.out + ((q0 + i0 + row) * H + h) * kV + 2 * t4;
#pragma unroll
    for (int d = 0; d < kOTiles; ++d)
      *reinterpret_cast<float2*>(dst + d * 8) = make_float2(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
  }
}

}  // namespace mma_flash

}  // namespace

namespace {

// Opt each kernel into its shared memory once per device (the attribute is per device context).
template <typename Kernel>
void allow_smem(Kernel* k, int bytes) {
  static std::atomic<uint64_t> done{0};
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t{1} << (dev % 64);
  if (done.load(std::memory_order_acquire) & bit) return;
  KILN_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.fetch_or(bit, std::memory_order_release);
}

// qk 192 / v 128 with 16-byte aligned tensors (always, from the allocator), q, kv_b and k_pe rows a
// multiple of 4 floats apart and nope_dim a multiple of 4 (the model's k_pe: columns 512.. of
// 576-wide latent rows) take the tensor cores; anything else the f32 kernel.
bool uses_mma(const MlaExpandedParams& p) {
  return p.qk_dim == mma_flash::kQk && p.v_dim == mma_flash::kV && p.nope_dim % 4 == 0 && aligned16(p.q) &&
         p.q_stride % 4 == 0 && aligned16(p.kv_b) && p.kv_b_stride % 4 == 0 && aligned16(p.k_pe) &&
         p.k_pe_stride % 4 == 0 && aligned16(p.out);
}

}  // namespace

void mla_expanded(const MlaExpandedParams& params, cudaStream_t s) {
  MlaExpandedParams p = params;
  KILN_REQUIRE(p.nope_dim >= 0 && p.nope_dim <= p.qk_dim,
               "mla_expanded: nope_dim " + std::to_string(p.nope_dim) + " outside qk_dim " + std::to_string(p.qk_dim));
  // The kernels read explicit rows.
  if (p.q_stride == 0) p.q_stride = p.num_heads * p.qk_dim;
  if (p.kv_b_stride == 0) p.kv_b_stride = p.num_heads * (p.nope_dim + p.v_dim);
  if (p.k_pe_stride == 0) p.k_pe_stride = p.qk_dim - p.nope_dim;
  const int64_t total_q = p.total_q;
  if (total_q == 0 || p.num_heads == 0) return;
  if (uses_mma(p)) {
    allow_smem(mma_flash::kernel, static_cast<int>(mma_flash::kSmem));
    // Upper bound on sum_b ceil(q_len_b / kBM): total_q / kBM + num_seqs; spare CTAs exit at once.
    const int64_t ctas = total_q / mma_flash::kBM + p.seqs.num_seqs;
    dim3 grid(static_cast<unsigned>(ctas), static_cast<unsigned>(p.num_heads));
    mma_flash::kernel<<<grid, mma_flash::kThreads, mma_flash::kSmem, s>>>(p);
    KILN_CUDA_CHECK(cudaGetLastError());
    return;
  }
  KILN_REQUIRE(p.v_dim <= kMaxV,
               "mla_expanded: v_head_dim " + std::to_string(p.v_dim) + " exceeds " + std::to_string(kMaxV));
  const size_t smem =
      sizeof(float) * static_cast<size_t>((kQ + kK) * (p.qk_dim + 1) + kK * (p.v_dim + 1) + kQ * kK + 3 * kQ);
  allow_smem(mla_prefill_kernel, 160 * 1024);
  dim3 grid(static_cast<unsigned>((total_q + kQ - 1) / kQ), static_cast<unsigned>(p.num_heads));
  mla_prefill_kernel<<<grid, kThreads, smem, s>>>(p, total_q);
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kiln::ops::cuda
