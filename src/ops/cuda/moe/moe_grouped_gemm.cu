// The two grouped expert GEMMs (see moe_internal.cuh for the layout they read).
//
// One kernel template, mma.sync m16n8k16 (bf16 in, f32 accumulate) with ldmatrix and a cp.async
// multi-stage pipeline. A CTA owns one bm-row tile (one expert) and 128 weight rows, K in steps of
// 64 (128-byte shared rows, 16-byte chunks XOR-swizzled by row so ldmatrix is conflict-free):
//  - gate/up: the 128 weight rows are gate rows j0..j0+63 and up rows I+j0..I+j0+63, and each warp
//    holds the gate and up accumulators of the same (row, j), so SwiGLU runs in the epilogue.
//  - down: 128 output columns of hidden.
// The activation operand is the bf16 pair (hi, lo) of an f32 value: two mma per fragment into one
// f32 accumulator, the weights read once (the precision gemm.cu keeps for every other GEMM). With
// split activations off (KernelArgs::split false; a template parameter of the kernels, kSplit,
// so the inner loops carry no branch) the lo part is neither stored, loaded, multiplied nor
// written: half the tensor work, A traffic and A shared memory.
// Ragged edges: A rows of padding slots, weight rows past N and k past K load as zeros (cp.async
// zero-fill); weights whose K is not a multiple of 8 (odd test sizes only) take a scalar load path.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/env.h"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/moe/moe_internal.cuh"

namespace kiln::ops::cuda::moe_detail {
namespace {

constexpr int kBK = 64;        // k per pipeline stage
constexpr int kBRows = 128;    // weight rows per CTA
constexpr int kGateCols = 64;  // gate (and up) columns per CTA in the gate/up GEMM

struct KernelArgs {
  const __nv_bfloat16* a;  // [2][a_rows][lda]: hi rows then lo rows (lo at a + a_lo); [a_rows][lda] unsplit
  int64_t a_lo, lda;
  bool split;                  // false: no lo part in a or act (bf16-rounded activations)
  const int32_t* sorted_slot;  // gate/up only: A row of padded row r is sorted_slot[r] / top_k
  int64_t top_k;
  const int32_t* tile_expert;  // [max_tiles]
  const __nv_bfloat16* w;      // [E, w_rows, K]
  int64_t w_rows, K, n;        // n: output columns (inter or hidden)
  bool w_vec;                  // K % 8 == 0 and w 16-byte aligned: weights go through cp.async
  __nv_bfloat16* act;          // gate/up out: [2][rows][ldo], lo at act + act_lo (unsplit: [rows][ldo])
  int64_t act_lo, ldo;
  float* y;  // down out: [rows, n]
};

// Element offset of 16-byte chunk `ch` (0..7) of shared row `r`: chunks XOR-swizzled by row.
__device__ __forceinline__ int swz(int r, int ch) {
  return r * kBK + ((ch ^ (r & 7)) << 3);
}

// Element offset of padded row r's A row inside one part: gate/up gathers the token of its slot
// (-1: a padding row, loaded as zeros); down reads its own row.
template <bool kGateUp>
__device__ __forceinline__ int64_t a_row_offset(const KernelArgs& p, int64_t r) {
  if (!kGateUp) return r * p.lda;
  const int32_t slot = p.sorted_slot[r];
  return slot < 0 ? -1 : (slot / p.top_k) * p.lda;
}

template <int BM, int WM, int WN, bool kSplit>
struct Tile {
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int kWarpRows = BM / WM, kMI = kWarpRows / 16;
  static constexpr int kNT = kBRows / (8 * WN);  // n8 tiles per warp (gate/up: half gate, half up)
  static constexpr int kParts = kSplit ? 2 : 1;  // A parts: hi (and lo)
  static constexpr int kAElems = BM * kBK, kStageElems = kParts * kAElems + kBRows * kBK;
  static_assert(kWarpRows % 16 == 0 && kNT % 4 == 0, "warp tile must be whole m16 rows and n8 pairs per set");
};

// grid: (ceil(n / cols per CTA), max_tiles); dynamic smem: STAGES x (A hi, A lo (kSplit), W) bf16 tiles.
template <int BM, int WM, int WN, int STAGES, bool kGateUp, bool kSplit>
__global__ void __launch_bounds__(WM* WN * 32) grouped_gemm_kernel(KernelArgs p) {
  using TL = Tile<BM, WM, WN, kSplit>;
  constexpr int kThreads = TL::kThreads, kMI = TL::kMI, kNT = TL::kNT;
  const int64_t tile = blockIdx.y;
  const int e = p.tile_expert[tile];
  if (e < 0) return;  // past the real tiles: the grid is sized by the bound
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __shared__ int64_t a_off[BM];  // element offset of each A row inside one part; -1 = zero row
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp / WN, wn = warp % WN;
  const int64_t row0 = tile * BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * (kGateUp ? kGateCols : kBRows);
  for (int r = tid; r < BM; r += kThreads) a_off[r] = a_row_offset<kGateUp>(p, row0 + r);
  __syncthreads();
  const __nv_bfloat16* w_e = p.w + static_cast<int64_t>(e) * p.w_rows * p.K;
  // Weight row of shared B row rr, or -1 past N.
  auto w_row = [&](int rr) -> int64_t {
    if (kGateUp) {
      const int64_t j = n0 + (rr & (kGateCols - 1));
      return j < p.n ? (rr < kGateCols ? j : p.n + j) : -1;
    }
    const int64_t j = n0 + rr;
    return j < p.n ? j : -1;
  };
  const int KT = static_cast<int>((p.K + kBK - 1) / kBK);

  auto load_stage = [&](int stage, int kt) {
    __nv_bfloat16* sa = smem + stage * TL::kStageElems;
    __nv_bfloat16* sb = sa + TL::kParts * TL::kAElems;
    const int64_t k0 = static_cast<int64_t>(kt) * kBK;
    for (int c = tid; c < TL::kParts * BM * 8; c += kThreads) {
      const int part = c / (BM * 8), r = (c >> 3) % BM, ch = c & 7;
      const int64_t k = k0 + ch * 8, off = a_off[r];
      const bool ok = off >= 0 && k < p.lda;  // A pad columns [K, lda) hold zeros
      cp_async16(sa + part * TL::kAElems + swz(r, ch), ok ? p.a + part * p.a_lo + off + k : p.a, ok);
    }
    for (int c = tid; c < kBRows * 8; c += kThreads) {
      const int rr = c >> 3, ch = c & 7;
      const int64_t k = k0 + ch * 8, wr = w_row(rr);
      __nv_bfloat16* dst = sb + swz(rr, ch);
      if (p.w_vec) {
        const bool ok = wr >= 0 && k < p.K;
        cp_async16(dst, ok ? w_e + wr * p.K + k : p.w, ok);
      } else {
        alignas(16) __nv_bfloat16 v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = wr >= 0 && k + i < p.K ? w_e[wr * p.K + k + i] : __float2bfloat16(0.0f);
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(v);
      }
    }
  };

  // Shared B row of the first row of warp n8 tile q: gate/up keeps q < kNT/2 on gate rows and
  // q >= kNT/2 on the matching up rows, so acc[.][q] and acc[.][q + kNT/2] hold the same (row, j).
  auto b_row = [&](int q) -> int {
    if (kGateUp) {
      constexpr int kHalf = kNT / 2;
      return (q / kHalf) * kGateCols + wn * (kGateCols / WN) + (q % kHalf) * 8;
    }
    return wn * (kBRows / WN) + q * 8;
  };

  float acc[kMI][kNT][4];
#pragma unroll
  for (int i = 0; i < kMI; ++i)
#pragma unroll
    for (int q = 0; q < kNT; ++q)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][q][v] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();  // empty groups keep the wait count uniform
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed for everyone; stage kt-1 is no longer read
    if (kt + STAGES - 1 < KT) load_stage((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
    cp_async_commit();
    const __nv_bfloat16* sa = smem + (kt % STAGES) * TL::kStageElems;
    const __nv_bfloat16* sb = sa + TL::kParts * TL::kAElems;
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t ahi[kMI][4], alo[kMI][4], b[kNT][2];
#pragma unroll
      for (int i = 0; i < kMI; ++i) {
        const int r = wm * TL::kWarpRows + i * 16 + (lane & 15), ch = ks * 2 + (lane >> 4);
        ldmatrix_x4(ahi[i], sa + swz(r, ch));
        if (kSplit) ldmatrix_x4(alo[i], sa + TL::kAElems + swz(r, ch));
      }
#pragma unroll
      for (int q = 0; q < kNT; q += 2) {  // one x4 load: n8 tiles q and q+1, k halves 0 and 1
        uint32_t t[4];
        ldmatrix_x4(t, sb + swz(b_row(q) + ((lane >> 4) << 3) + (lane & 7), ks * 2 + ((lane >> 3) & 1)));
        b[q][0] = t[0];
        b[q][1] = t[1];
        b[q + 1][0] = t[2];
        b[q + 1][1] = t[3];
      }
#pragma unroll
      for (int i = 0; i < kMI; ++i)
#pragma unroll
        for (int q = 0; q < kNT; ++q) {
          mma_bf16(acc[i][q], ahi[i], b[q][0], b[q][1]);
          if (kSplit) mma_bf16(acc[i][q], alo[i], b[q][0], b[q][1]);
        }
    }
  }
  cp_async_wait<0>();

  // Accumulator v of tile (i, q): row g (+8 for v >= 2), columns 2*tq and 2*tq+1.
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int i = 0; i < kMI; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + wm * TL::kWarpRows + i * 16 + g + h * 8;
      if (kGateUp) {
#pragma unroll
        for (int q = 0; q < kNT / 2; ++q) {
          const int64_t j = n0 + wn * (kGateCols / WN) + q * 8 + 2 * tq;
          if (j >= p.ldo) continue;  // ldo is a multiple of 8, so j + 1 < ldo too
          float v[2];
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float gt = acc[i][q][2 * h + c], up = acc[i][q + kNT / 2][2 * h + c];
            v[c] = j + c < p.n ? silu_mul(gt, up) : 0.0f;  // pad columns stay 0
          }
          const __nv_bfloat162 hi = __floats2bfloat162_rn(v[0], v[1]);
          *reinterpret_cast<__nv_bfloat162*>(p.act + row * p.ldo + j) = hi;
          if (!kSplit) continue;
          const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0] - __low2float(hi), v[1] - __high2float(hi));
          *reinterpret_cast<__nv_bfloat162*>(p.act + p.act_lo + row * p.ldo + j) = lo;
        }
      } else {
#pragma unroll
        for (int q = 0; q < kNT; ++q) {
          const int64_t j = n0 + wn * (kBRows / WN) + q * 8 + 2 * tq;
          float* dst = p.y + row * p.n + j;
          const float v0 = acc[i][q][2 * h], v1 = acc[i][q][2 * h + 1];
          if (j + 1 < p.n && (p.n & 1) == 0) {
            *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
          } else {
            if (j < p.n) dst[0] = v0;
            if (j + 1 < p.n) dst[1] = v1;
          }
        }
      }
    }
  }
}

template <int BM, int WM, int WN, int STAGES, bool kGateUp, bool kSplit>
void launch(const KernelArgs& args, int64_t max_tiles, cudaStream_t s) {
  using TL = Tile<BM, WM, WN, kSplit>;
  constexpr size_t kSmem = static_cast<size_t>(STAGES) * TL::kStageElems * sizeof(__nv_bfloat16);
  auto* kernel = grouped_gemm_kernel<BM, WM, WN, STAGES, kGateUp, kSplit>;
  static SmemGrants smem_devices;
  allow_smem(kernel, static_cast<int>(kSmem), smem_devices);
  const int64_t cols = kGateUp ? kGateCols : kBRows;
  // Column blocks fastest. Tiles fastest (an expert's tiles side by side, so that a second tile's
  // weight block would come from L2) measured within spread at 32-256 streams (session 10).
  const dim3 grid(static_cast<unsigned>((args.n + cols - 1) / cols), static_cast<unsigned>(max_tiles));
  kernel<<<grid, TL::kThreads, kSmem, s>>>(args);
}

// Decode batches (16-row M tiles) stream the weights: the kernel above reads each weight row 128
// bytes per pipeline stage, and with ~30k such row streams in flight DRAM pages rarely serve more
// than one request (~2 TB/s on H200 at 64 tokens). The skinny variant reads 512 contiguous bytes
// of each of 32 weight rows per stage (kSkBK = 256 columns) and splits each stage's k range over
// its 4 warps (64 columns each); the warps' partial sums meet in shared memory at the end.
constexpr int kSkBK = 256, kSkRows = 32, kSkWarps = 4, kSkStages = 3, kSkBM = 16;
constexpr int kSkAElems = kSkBM * kSkBK;
template <bool kSplit>  // A parts (hi, lo) then the weight rows
constexpr int kSkStageElems = (kSplit ? 2 : 1) * kSkAElems + kSkRows* kSkBK;
template <bool kSplit>  // 96 KiB split, 72 KiB not: 2 or 3 CTAs per SM
constexpr size_t kSkSmem = kSkStages* kSkStageElems<kSplit> * sizeof(__nv_bfloat16);
// Element offset of 16-byte chunk `ch` (0..31) of a 256-column shared row: the low 3 chunk bits
// XOR-swizzled by row, so the 8 rows one ldmatrix phase reads hit 8 different bank groups.
__device__ __forceinline__ int swz_sk(int r, int ch) {
  return r * kSkBK + ((ch ^ (r & 7)) << 3);
}

// grid: (ceil(n / cols per CTA), max_tiles), 128 threads. gate/up: weight rows j0..j0+15 (gate)
// and I+j0..I+j0+15 (up); down: 32 output columns.
template <bool kGateUp, bool kSplit>
__global__ void __launch_bounds__(kSkWarps * 32) grouped_skinny_kernel(KernelArgs p) {
  constexpr int kStageElems = kSkStageElems<kSplit>, kParts = kSplit ? 2 : 1;
  const int64_t tile = blockIdx.y;
  const int e = p.tile_expert[tile];
  if (e < 0) return;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __shared__ int64_t a_off[kSkBM];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t row0 = tile * kSkBM;
  constexpr int kCols = kGateUp ? kSkRows / 2 : kSkRows;  // output columns per CTA
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kCols;
  if (tid < kSkBM) a_off[tid] = a_row_offset<kGateUp>(p, row0 + tid);
  __syncthreads();
  const __nv_bfloat16* w_e = p.w + static_cast<int64_t>(e) * p.w_rows * p.K;
  const int KT = static_cast<int>((p.K + kSkBK - 1) / kSkBK);

  auto load_stage = [&](int stage, int kt) {
    __nv_bfloat16* sa = smem + stage * kStageElems;
    __nv_bfloat16* sb = sa + kParts * kSkAElems;
    const int64_t k0 = static_cast<int64_t>(kt) * kSkBK;
    // A: 2 parts x 16 rows x 32 chunks; W: 32 rows x 32 chunks (a warp reads one row's 512 bytes).
#pragma unroll
    for (int i = 0; i < kParts * kSkBM * 32 / (kSkWarps * 32); ++i) {
      const int c = tid + i * kSkWarps * 32, part = c / (kSkBM * 32), r = (c >> 5) % kSkBM, ch = c & 31;
      const int64_t k = k0 + ch * 8, off = a_off[r];
      const bool ok = off >= 0 && k < p.lda;
      cp_async16(sa + part * kSkAElems + swz_sk(r, ch), ok ? p.a + part * p.a_lo + off + k : p.a, ok);
    }
#pragma unroll
    for (int i = 0; i < kSkRows * 32 / (kSkWarps * 32); ++i) {
      const int c = tid + i * kSkWarps * 32, rr = c >> 5, ch = c & 31;
      const int64_t j = n0 + (kGateUp ? rr % kCols : rr);
      const int64_t wr = j < p.n ? (kGateUp && rr >= kCols ? p.n + j : j) : -1;
      const int64_t k = k0 + ch * 8;
      const bool ok = wr >= 0 && k < p.K;
      cp_async16(sb + swz_sk(rr, ch), ok ? w_e + wr * p.K + k : p.w, ok);
    }
  };

  float acc[4][4];  // n8 tiles 0..3 (gate/up: 0-1 gate, 2-3 the matching up columns)
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int v = 0; v < 4; ++v) acc[q][v] = 0.0f;

#pragma unroll
  for (int st = 0; st < kSkStages - 1; ++st) {
    if (st < KT) load_stage(st, st);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kSkStages - 2>();
    __syncthreads();
    if (kt + kSkStages - 1 < KT) load_stage((kt + kSkStages - 1) % kSkStages, kt + kSkStages - 1);
    cp_async_commit();
    const __nv_bfloat16* sa = smem + (kt % kSkStages) * kStageElems;
    const __nv_bfloat16* sb = sa + kParts * kSkAElems;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const int ch0 = warp * 8 + ks * 2;  // this warp's 64 columns of the stage, 16 at a time
      uint32_t ahi[4], alo[4], b[4][2];
      ldmatrix_x4(ahi, sa + swz_sk(lane & 15, ch0 + (lane >> 4)));
      if (kSplit) ldmatrix_x4(alo, sa + kSkAElems + swz_sk(lane & 15, ch0 + (lane >> 4)));
#pragma unroll
      for (int q = 0; q < 4; q += 2) {
        uint32_t t[4];
        ldmatrix_x4(t, sb + swz_sk(q * 8 + ((lane >> 4) << 3) + (lane & 7), ch0 + ((lane >> 3) & 1)));
        b[q][0] = t[0];
        b[q][1] = t[1];
        b[q + 1][0] = t[2];
        b[q + 1][1] = t[3];
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        mma_bf16(acc[q], ahi, b[q][0], b[q][1]);
        if (kSplit) mma_bf16(acc[q], alo, b[q][0], b[q][1]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stages: reuse them for the cross-warp sum

  // red[w][r][c]: warp w's partial for row r, column c (c < 32 weight rows of the CTA).
  float* red = reinterpret_cast<float*>(smem_raw);
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int v = 0; v < 4; ++v) red[(warp * kSkBM + g + (v >> 1) * 8) * kSkRows + q * 8 + 2 * tq + (v & 1)] = acc[q][v];
  __syncthreads();
  auto total = [&](int r, int c) {
    float t = 0.0f;
#pragma unroll
    for (int w = 0; w < kSkWarps; ++w) t += red[(w * kSkBM + r) * kSkRows + c];  // fixed order
    return t;
  };
  for (int o = tid; o < kSkBM * kCols; o += kSkWarps * 32) {
    const int r = o / kCols, c = o % kCols;
    const int64_t row = row0 + r, j = n0 + c;
    if (kGateUp) {
      if (j >= p.ldo) continue;
      const float gt = total(r, c), up = total(r, kCols + c);
      const float v = j < p.n ? silu_mul(gt, up) : 0.0f;
      store_bf16_parts(v, p.act + row * p.ldo + j, kSplit ? p.act + p.act_lo + row * p.ldo + j : nullptr);
    } else if (j < p.n) {
      p.y[row * p.n + j] = total(r, c);
    }
  }
}

// KILN_MOE_SKINNY=0 keeps 16-row tiles on the kernel above (for the A/B).
bool skinny_enabled() {
  static const bool on = env_int("KILN_MOE_SKINNY", 1) != 0;
  return on;
}

template <bool kGateUp, bool kSplit>
void launch_skinny(const KernelArgs& args, int64_t max_tiles, cudaStream_t s) {
  auto* kernel = grouped_skinny_kernel<kGateUp, kSplit>;
  constexpr size_t kSmem = kSkSmem<kSplit>;
  static SmemGrants smem_devices;
  allow_smem(kernel, static_cast<int>(kSmem), smem_devices);
  const int64_t cols = kGateUp ? kSkRows / 2 : kSkRows;
  const dim3 grid(static_cast<unsigned>((args.n + cols - 1) / cols), static_cast<unsigned>(max_tiles));
  kernel<<<grid, kSkWarps * 32, kSmem, s>>>(args);
}

// Tile shapes by M tile: 16 and 32 rows (decode-sized batches, weight-bandwidth bound: small
// tiles waste little on padding, 4 warps side by side along N), 64 rows (prefill: 2 x 2 warps,
// 32 x 64 warp tiles). Two CTAs fit per SM in every case (80-96 KiB of shared memory each with the
// hi/lo split, less without).
template <bool kGateUp, bool kSplit>
void dispatch_tile(const KernelArgs& args, const AlignedLayout& l, cudaStream_t s) {
  switch (l.bm) {
    case 16:
      if (args.w_vec && skinny_enabled())
        launch_skinny<kGateUp, kSplit>(args, l.max_tiles, s);
      else
        launch<16, 1, 4, 4, kGateUp, kSplit>(args, l.max_tiles, s);
      break;
    case 32: launch<32, 1, 4, 4, kGateUp, kSplit>(args, l.max_tiles, s); break;
    case 64: launch<64, 2, 2, 3, kGateUp, kSplit>(args, l.max_tiles, s); break;
    default: throw_error("moe: no grouped GEMM for an M tile of " + std::to_string(l.bm));
  }
}

template <bool kGateUp>
void dispatch(const KernelArgs& args, const AlignedLayout& l, cudaStream_t s) {
  KILN_REQUIRE(l.max_tiles <= 65535, "moe: " + std::to_string(l.max_tiles) + " expert tiles exceed the grid limit");
  if (args.split)
    dispatch_tile<kGateUp, true>(args, l, s);
  else
    dispatch_tile<kGateUp, false>(args, l, s);
}

bool vec_ok(const void* w, int64_t K) {
  return K % 8 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

}  // namespace

void moe_gate_up_swiglu(const GateUpArgs& a, const AlignedLayout& l, cudaStream_t s) {
  KernelArgs k{};
  k.a = a.x_split;
  k.a_lo = a.num_tokens * a.hidden_pad;
  k.lda = a.hidden_pad;
  k.split = a.split;
  k.sorted_slot = l.sorted_slot;
  k.top_k = a.top_k;
  k.tile_expert = l.tile_expert;
  k.w = a.w_gate_up;
  k.w_rows = 2 * a.inter;
  k.K = a.hidden;
  k.n = a.inter;
  k.w_vec = vec_ok(a.w_gate_up, a.hidden);
  k.act = a.act_split;
  k.act_lo = l.max_tiles * l.bm * a.inter_pad;
  k.ldo = a.inter_pad;
  dispatch<true>(k, l, s);
}

void moe_down(const DownArgs& a, const AlignedLayout& l, cudaStream_t s) {
  KernelArgs k{};
  k.a = a.act_split;
  k.a_lo = l.max_tiles * l.bm * a.inter_pad;
  k.lda = a.inter_pad;
  k.split = a.split;
  k.tile_expert = l.tile_expert;
  k.top_k = 1;
  k.w = a.w_down;
  k.w_rows = a.hidden;
  k.K = a.inter;
  k.n = a.hidden;
  k.w_vec = vec_ok(a.w_down, a.inter);
  k.y = static_cast<float*>(a.y);  // the mma.sync kernels write f32
  dispatch<false>(k, l, s);
}

}  // namespace kiln::ops::cuda::moe_detail
