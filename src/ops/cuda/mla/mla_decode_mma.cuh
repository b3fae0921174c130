// Absorbed MLA decode over the bf16 latent pool on tensor cores (mma.sync m16n8k16, bf16 operands,
// f32 accumulation). Included by mla_decode.cu only; specialised to the DeepSeek-V3 latent shape
// (kv_lora 512, rope 64: 576-wide rows), which every model of the family shares.
//
// Bytes: a query row of sequence b reads its visible rows once, kv_len * 576 * 2 bytes per sequence
// (1152 B a row; 9.4 MB at 8k context), plus q (heads * 576 * 4) and out (heads * 512 * 4). The
// arithmetic per row is heads * (576 + 512) * 2 FLOPs, i.e. 30 FLOP/byte at 16 heads (~145 TFLOP/s
// at 4.8 TB/s: memory bound for mma.sync) but 240 FLOP/byte at 128 heads (compute bound).
//
// CTA: one query row, one split of its context, HT tiles of 16 heads (warps 4t..4t+3 own tile t).
// The KV tile (32 rows x 576) is streamed once per CTA through a cp.async ring of STAGES stages,
// all STAGES tiles in flight, and shared by all its head tiles. Tiles of rows that earlier steps
// wrote are requested before pdl_wait, while the kernel before (mla_prepare, which writes this
// step's rows) still runs, and so are the earlier rows of the tile that holds this step's first
// row (its new rows join the same commit group after the wait; not A/B'd: H200 traces of other
// machines put the last split done 3.01 us after its release before, 2.82-2.86 after); so at
// short contexts the KV has landed by the time q is ready. Per tile
// of 16 heads:
//   S = Q·Kᵀ  each warp takes a quarter of the 576 dims (9 k-steps; its Q fragments stay in
//             registers) for all 32 rows, and the four partial S meet in shared memory;
//   softmax   every warp sums the four partials in the same order (identical S in all four), then
//             runs the online softmax in f32 in registers; P is rounded to bf16 as the A operand;
//   O += P·V  V is the first 512 columns of the same smem rows (no second read); each warp owns
//             128 output columns (16 n-tiles: 64 f32 accumulators per thread).
// Splits: CTAs over (query, split, head group) fill the GPU once; a split covers a 32-row-aligned
// chunk of the context of at least min_split_rows rows (a launch argument; with CLUSTER, contexts
// up to 8 x min_split_rows take as few 32-row tiles a split as fill 8 splits), computed in the kernel
// from kv_len, so the launch never depends on context lengths and a short context occupies only a
// few splits (the rest exit at once). The splits that saw rows merge in the same kernel, up a
// binary tree over split indices (see the end of the kernel): no second launch, and no scan of
// empty splits. With CLUSTER (one 16-head tile; the launcher uses it for 1-2 query rows of at most
// 16 heads), the splits of a query row form clusters of 8 CTAs, split fastest, that merge in
// distributed shared memory first (mla_decode_merge.cuh); a context up to 8 x min_split_rows is
// one cluster, 32-row tiles spread over its CTAs.
#pragma once

#include <cstdint>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/mla/mla_decode_config.cuh"
#include "ops/cuda/mla/mla_decode_merge.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/pdl.cuh"  // pdl_wait is per translation unit: include this header from one .cu only

namespace kiln::ops::cuda {
namespace mma_decode {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, bypassing L1; src_bytes 0 zero-fills (rows past the context). The
// 128-byte L2 prefetch hint fetches whole lines: a warp's request covers 64 B of each of 8 rows.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// grid.x = total_q * splits * head_groups, head group fastest (CLUSTER: split fastest): the CTAs that read the same KV
// rows run side by side and meet in L2. The root of each merge tree writes normalised outputs to p.out; part_out
// [splits, total_q, heads, 512], part_ml [splits, total_q, heads, 2] (max in log2 units, sum) and counters [total_q *
// head_groups, tree_width(splits)] serve the merge and are unused (may be null) when splits == 1. The counters are zero
// before a launch and left zero after it.
template <int HT, int STAGES, bool CLUSTER>
__global__ void __launch_bounds__(HT* kWarpsPerTile * 32, HT == 1 ? 2 : 1)
    mla_decode_mma_kernel(MlaAbsorbedParams p, int splits, int head_groups, int min_split_rows, float* part_out,
                          float* part_ml, int* counters) {
  constexpr int kThreads = HT * kWarpsPerTile * 32;
  constexpr int kTpr = kThreads / kTileRows;  // loader threads per KV row
  static_assert(!CLUSTER || HT == 1, "cluster merge: one tile of heads");
  extern __shared__ __align__(16) unsigned char smem[];
  float* sx_all = reinterpret_cast<float*>(smem + STAGES * kStageBytes);

  // Before pdl_wait only what the host wrote (cu_q, kv_lens, block tables) and KV rows of earlier
  // steps are read; nothing is written.
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ht = warp / kWarpsPerTile, wq = warp % kWarpsPerTile;
  const int g = lane >> 2, q4 = lane & 3;  // mma fragment coordinates: row group, thread in group
  // Grid order: head group fastest (see above), or with CLUSTER split fastest (a cluster's CTAs
  // are consecutive: 8 splits of one query row and head group).
  const int hg = static_cast<int>(CLUSTER ? blockIdx.x / splits % head_groups : blockIdx.x % head_groups);
  const int split = static_cast<int>(CLUSTER ? blockIdx.x % splits : blockIdx.x / head_groups % splits);
  const int64_t qi = blockIdx.x / head_groups / splits, H = p.num_heads;
  const int64_t h0 = (static_cast<int64_t>(hg) * HT + ht) * 16;
  const bool active = h0 < H;  // a whole tile past the last head only helps load KV

  const int64_t b = seq_of(p.cu_q, p.num_seqs, qi);
  const int64_t q_len = p.cu_q[b + 1] - p.cu_q[b], kv_len = p.kv.kv_lens[b];
  // Causal suffix: query i of q_len sees kv_len - q_len + i + 1 rows; kv_len 0 (padding) sees none.
  const int64_t visible = kv_len > 0 ? max(int64_t{0}, kv_len - q_len + (qi - p.cu_q[b]) + 1) : 0;
  const int64_t chunk =
      CLUSTER ? cluster_chunk(visible, splits, STAGES, min_split_rows)
              : max(int64_t{min_split_rows}, ((visible + splits - 1) / splits + kTileRows - 1) / kTileRows * kTileRows);
  // Splits with rows: 1..splits (chunk >= visible / splits). A padding row keeps split 0, to write its zeros.
  const int used = visible > 0 ? static_cast<int>((visible + chunk - 1) / chunk) : 1;
  // Nothing read but launch inputs: may leave before the kernel before ends. Split 0 never leaves
  // here (used >= 1), so every launch has CTAs that wait (the PDL invariant in pdl.cuh). A cluster
  // leaves only as a whole: its CTAs past `used` take no rows but join its barriers.
  if ((CLUSTER ? split / kCluster * kCluster : split) >= used) {
    pdl_trigger();
    return;
  }
  if constexpr (CLUSTER) cluster_arrive_relaxed();  // started: the others may store into this CTA's receive buffer
  const int64_t j0 = split * chunk, j1 = min(visible, j0 + chunk);
  const int ntiles = j1 > j0 ? static_cast<int>((j1 - j0 + kTileRows - 1) / kTileRows) : 0;

  // Loader: thread -> one row of the tile, chunks lr, lr + kTpr, ... (one block-table lookup a tile).
  const int lrow = tid / kTpr, lr = tid % kTpr;
  const __nv_bfloat16* pool = static_cast<const __nv_bfloat16*>(p.kv.pool);
  const int32_t* table = p.kv.block_table + b * p.kv.max_blocks;
  // Rows [fresh, j1) are this step's, written by the kernel before: `rows` picks all of a tile's
  // rows, those before `fresh` (and zero fills), or only this step's.
  const int64_t fresh = kv_len - q_len;
  enum Rows { kAll, kOld, kNew };
  auto issue = [&](int t, Rows rows = kAll) {
    const int64_t j = j0 + static_cast<int64_t>(t) * kTileRows + lrow;
    if (rows != kAll && (rows == kNew) != (j >= fresh && j < j1)) return;
    const __nv_bfloat16* src = pool;  // any valid address when zero-filling
    int bytes = 0;
    if (j < j1) {
      const int64_t slot = static_cast<int64_t>(table[j / p.kv.block_size]) * p.kv.block_size + j % p.kv.block_size;
      src = pool + slot * kRow;
      bytes = 16;
    }
    const uint32_t dst = smem_u32(smem + (t % STAGES) * kStageBytes + lrow * kRowStride);
#pragma unroll
    for (int c = lr; c < kChunks; c += kTpr) cp_async16(dst + c * 16, src + c * 8, bytes);
  };
  // The first STAGES tiles: those whose rows all precede this step's are requested now; of the
  // first tile holding one of this step's rows, the earlier rows now and this step's once the kernel
  // before is done (one commit group: the tile lands as a whole); later tiles then. Either way
  // before q is read, so the latencies overlap.
  int issued = 0;
  bool split_tile = false;
  for (; issued < STAGES && issued < ntiles; ++issued) {
    if (min(j1, j0 + (issued + 1) * static_cast<int64_t>(kTileRows)) > fresh) {
      issue(issued, kOld);
      split_tile = true;
      break;
    }
    issue(issued);
    cp_async_commit();
  }
  pdl_wait();  // PDL: q and this step's latent rows come from the kernel before
  pdl_trigger();
  if (split_tile) {
    issue(issued++, kNew);
    cp_async_commit();
  }
  for (; issued < STAGES; ++issued) {
    if (issued < ntiles) issue(issued);
    cp_async_commit();  // empty groups keep the wait count uniform
  }

  // Q fragments of this warp's 144 dims, f32 -> bf16 once (padding heads are zeros).
  uint32_t qf[kKSteps][4];
  {
    const float* q_lo = p.q + (qi * H + h0 + g) * kRow;
    const float* q_hi = q_lo + 8 * kRow;
    const bool lo_ok = active && h0 + g < H, hi_ok = active && h0 + g + 8 < H;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const int d = (wq * kKSteps + ks) * 16 + 2 * q4;
      const float2 zero = make_float2(0.0f, 0.0f);
      const float2 a = lo_ok ? *reinterpret_cast<const float2*>(q_lo + d) : zero;
      const float2 bb = hi_ok ? *reinterpret_cast<const float2*>(q_hi + d) : zero;
      const float2 c = lo_ok ? *reinterpret_cast<const float2*>(q_lo + d + 8) : zero;
      const float2 e = hi_ok ? *reinterpret_cast<const float2*>(q_hi + d + 8) : zero;
      qf[ks][0] = pack_bf16(a.x, a.y);
      qf[ks][1] = pack_bf16(bb.x, bb.y);
      qf[ks][2] = pack_bf16(c.x, c.y);
      qf[ks][3] = pack_bf16(e.x, e.y);
    }
  }
  // Kernel trace (CTA 0: split 0 of head group 0): 0 q loaded, 1 tiles attended, 2 merged; with
  // CLUSTER also 3 the last split with rows done with its tiles (that CTA's stamp), 4 the cluster's
  // slices all received, 5 merged within the cluster (mla_decode_merge.cuh).
  trace_phase(0);

  float o[kWarpCols / 8][4];
#pragma unroll
  for (int j = 0; j < kWarpCols / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // rows g and g + 8, log2 units
  const float sl2 = p.scale * kLog2e;
  float* sx = sx_all + ht * (kSBytes / 4);

  // One KV tile t (in stage t % STAGES) into this warp's softmax state and output columns.
  auto attend_tile = [&](int t) {
    const uint32_t base = smem_u32(smem + (t % STAGES) * kStageBytes);
    // S partial over this warp's dims: 4 n-tiles of 8 rows.
    float sp[4][4] = {};
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const int col = (wq * kKSteps + ks) * 16 + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        const int row = np * 16 + (lane & 7) + ((lane >> 4) << 3);
        uint32_t kb[4];
        ldsm_x4(kb, base + row * kRowStride + col * 2);
        mma_bf16(sp[2 * np], qf[ks], kb[0], kb[1]);
        mma_bf16(sp[2 * np + 1], qf[ks], kb[2], kb[3]);
      }
    }
    float* mine = sx + wq * 16 * kSStride;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      *reinterpret_cast<float2*>(mine + g * kSStride + 8 * n + 2 * q4) = make_float2(sp[n][0], sp[n][1]);
      *reinterpret_cast<float2*>(mine + (g + 8) * kSStride + 8 * n + 2 * q4) = make_float2(sp[n][2], sp[n][3]);
    }
    named_barrier_sync(1 + ht, kWarpsPerTile * 32);
    // Full S in log2 units, masked past the chunk's end; the same order of sums in every warp.
    const int64_t jt = j0 + static_cast<int64_t>(t) * kTileRows;
    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int c = 8 * n + 2 * q4;
        float2 v = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < kWarpsPerTile; ++w) {
          const float2 x = *reinterpret_cast<const float2*>(sx + (w * 16 + g + 8 * r) * kSStride + c);
          v.x += x.x;
          v.y += x.y;
        }
        s[n][2 * r] = jt + c < j1 ? v.x * sl2 : -INFINITY;
        s[n][2 * r + 1] = jt + c + 1 < j1 ? v.y * sl2 : -INFINITY;
      }
    }
    // Online softmax per row; each row's 32 scores sit in one quad (4 lanes x 8).
    uint32_t pa[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 4; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[r], mx);  // finite: every tile has a visible row
      const float corr = exp2f(m_run[r] - m_new);
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        s[n][2 * r] = exp2f(s[n][2 * r] - m_new);
        s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] - m_new);
        sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l_run[r] = l_run[r] * corr + sum;
      m_run[r] = m_new;
#pragma unroll
      for (int j = 0; j < kWarpCols / 8; ++j) {
        o[j][2 * r] *= corr;
        o[j][2 * r + 1] *= corr;
      }
    }
    // The S accumulators of n-tiles 2k, 2k+1 are exactly the A fragment of k-step k.
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      pa[k][0] = pack_bf16(s[2 * k][0], s[2 * k][1]);
      pa[k][1] = pack_bf16(s[2 * k][2], s[2 * k][3]);
      pa[k][2] = pack_bf16(s[2 * k + 1][0], s[2 * k + 1][1]);
      pa[k][3] = pack_bf16(s[2 * k + 1][2], s[2 * k + 1][3]);
    }
    // O += P·V over this warp's 128 columns; ldmatrix.trans turns row-major V into B fragments.
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int row = k * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int jp = 0; jp < kWarpCols / 16; ++jp) {
        const int col = wq * kWarpCols + jp * 16 + (lane >> 4) * 8;
        uint32_t vb[4];
        ldsm_x4_t(vb, base + row * kRowStride + col * 2);
        mma_bf16(o[2 * jp], pa[k], vb[0], vb[1]);
        mma_bf16(o[2 * jp + 1], pa[k], vb[2], vb[3]);
      }
    }
  };

  for (int t = 0; t < ntiles; ++t) {
    cp_async_wait<STAGES - 1>();  // this thread's chunks of tile t have landed (STAGES + t groups so far)
    __syncthreads();              // everyone's have
    if (active) attend_tile(t);
    if (t + STAGES < ntiles) {
      __syncthreads();  // everyone is done with tile t's stage: refill it
      issue(t + STAGES);
    }
    cp_async_commit();
  }
  cp_async_wait<0>();  // nothing may land in shared memory after the CTA exits
  trace_phase(1);
  if constexpr (CLUSTER) {
    trace_phase(3, split == used - 1);
    cluster_merge(p, reinterpret_cast<float*>(smem + smem_bytes<HT, STAGES, false>()), o, m_run, l_run, ntiles > 0, qi,
                  h0, hg, head_groups, split, splits, used, part_out, part_ml, counters);
    trace_phase(2);
    return;
  }

  // Merge up a binary tree whose leaves are the splits with rows, in split order: node n of level
  // k covers splits [n << k, (n + 1) << k) and is always combined as left ⊕ right, whichever CTA
  // gets there last, so the result does not depend on timing. Of two siblings the first to finish
  // stores its node in the slot of its first split and leaves; the second (told by the parent's
  // counter, which it resets for the next launch) reads it back and carries the parent. A left node
  // without a right sibling moves up as it is. The CTA that carries the root writes the output.
  // Own partials stay in registers: a thread stores and reads the same fragment positions.
  int64_t node = split;
  for (int level = 0; (used - 1) >> level; ++level, node >>= 1) {
    const bool left = (node & 1) == 0;
    const int64_t sib = node ^ 1;
    if (left && (sib << level) >= used) continue;
    __syncthreads();  // the (max, sum) of this slot may still be being read, by other warps, a level down
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t h = h0 + g + 8 * r;
      if (!active || h >= H) continue;
      const int64_t at = ((node << level) * p.total_q + qi) * H + h;
      float* dst = part_out + at * kLora + wq * kWarpCols;
#pragma unroll
      for (int j = 0; j < kWarpCols / 8; ++j)
        __stcg(reinterpret_cast<float2*>(dst + 8 * j + 2 * q4), make_float2(o[j][2 * r], o[j][2 * r + 1]));
      if (wq == 0 && q4 == 0) __stcg(reinterpret_cast<float2*>(part_ml + at * 2), make_float2(m_run[r], l_run[r]));
    }
    const int tw = tree_width(splits);
    if (!arrived_second(counters + (qi * head_groups + hg) * tw + (tw >> (level + 1)) + (node >> 1))) return;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t h = h0 + g + 8 * r;
      if (!active || h >= H) continue;
      // L2 loads (.cg): another CTA wrote the data in this kernel, and L1 may hold an older copy.
      const int64_t at = ((sib << level) * p.total_q + qi) * H + h;
      const float* src = part_out + at * kLora + wq * kWarpCols;
      const float2 ml = __ldcg(reinterpret_cast<const float2*>(part_ml + at * 2));
      // Every node saw rows (finite maxima). merge_value's explicit roundings: the same operations
      // whichever side sits in registers (no contraction).
      const MergeWeights w = left ? merge_weights(m_run[r], ml.x) : merge_weights(ml.x, m_run[r]);
      l_run[r] = left ? merge_value(l_run[r], ml.y, w) : merge_value(ml.y, l_run[r], w);
      m_run[r] = w.m;
#pragma unroll
      for (int j = 0; j < kWarpCols / 8; ++j) {
        const float2 x = __ldcg(reinterpret_cast<const float2*>(src + 8 * j + 2 * q4));
        float& a = o[j][2 * r];
        float& c = o[j][2 * r + 1];
        a = left ? merge_value(a, x.x, w) : merge_value(x.x, a, w);
        c = left ? merge_value(c, x.y, w) : merge_value(x.y, c, w);
      }
    }
  }

  // The root (or the only split): normalise. l is 0 only for a row with no visible rows.
  trace_phase(2);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t h = h0 + g + 8 * r;
    if (!active || h >= H) continue;
    const float inv = l_run[r] > 0.0f ? 1.0f / l_run[r] : 0.0f;
    float* dst = p.out + (qi * H + h) * kLora + wq * kWarpCols;
#pragma unroll
    for (int j = 0; j < kWarpCols / 8; ++j)
      *reinterpret_cast<float2*>(dst + 8 * j + 2 * q4) = make_float2(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
  }
}

}  // namespace mma_decode
}  // namespace kiln::ops::cuda
