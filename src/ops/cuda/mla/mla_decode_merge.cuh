// Merging the tensor-core MLA decode kernel's splits (mla_decode_mma.cuh; included from there
// only): the log-sum-exp combine and the tree handshake both merges use, and the merge through a
// thread-block cluster (CLUSTER).
//
// Why: at short contexts a decode row is latency-bound. The global merge tree stores a 32 KB
// partial per split, fences, counts and reads it back, ~3.2-3.4 us a level on H200 (kernel traces
// at context 128-192, sessions 13-14), so splits were kept at 128 rows or more and one CTA walked its 4 tiles one
// after another (~0.9 us each). In a cluster of 8 CTAs the splits' partials meet in distributed
// shared memory instead: each CTA stores each 64-column slice of its 16 heads x 512 partial
// straight into the receive buffer of the CTA that merges that slice, one cluster barrier, and
// rank r merges columns [64r, 64r + 64) of all 8 from its own shared memory. A context up to
// 8 x 128 rows is one cluster, 1-4 tiles a CTA, and no global round trip. Measured (H200 kernel
// trace, one stream, context 128-192): pulling the slices from the other CTAs' shared memory
// instead took 3.8 us; pushed, the slices have all arrived ~2 us after the last split is done
// (sending none from CTAs without rows, or 16 instead of 8 bytes a store, did not move that) and
// are merged 0.5 us later; the kernel costs the step's chain 6.7-8.6 us (median 6.9) instead of
// 8.8-11.5 (median 10.2). Longer contexts merge
// the clusters' results up the same binary tree as the tree kernel, each rank for its own 64
// columns (a 4 KB slice).
//
// Order of sums: the 8 ranks' partials in rank order, then the tree's left ⊕ right: fixed by split
// index, so the result does not depend on timing.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/mla/mla_decode_config.cuh"
#include "ops/cuda/pdl.cuh"  // trace_phase; one .cu includes this header

namespace kiln::ops::cuda {
namespace mma_decode {

// Rows a split takes: every context that fits one cluster at STAGES tiles a split stays in one
// (the fewest rows a CTA can take, one tile, rounded up to tiles); longer ones as the tree kernel.
__device__ __forceinline__ int64_t cluster_chunk(int64_t visible, int splits, int stages, int min_split_rows) {
  const int64_t in_one = max(int64_t{1}, (visible + kCluster - 1) / kCluster);
  const int64_t in_one_tiles = (in_one + kTileRows - 1) / kTileRows * kTileRows;
  if (in_one_tiles <= int64_t{stages} * kTileRows) return in_one_tiles;
  return max(int64_t{min_split_rows}, ((visible + splits - 1) / splits + kTileRows - 1) / kTileRows * kTileRows);
}

// Combines (m_a, l_a, x_a) ⊕ (m_b, l_b, x_b), left operand first, with explicit roundings: the same
// operations whichever side a thread holds in registers.
struct MergeWeights {
  float wl, wr, m;
};
__device__ __forceinline__ MergeWeights merge_weights(float m_left, float m_right) {
  const float m = fmaxf(m_left, m_right);
  if (m == -INFINITY) return {0.0f, 0.0f, m};  // both sides empty
  return {exp2f(m_left - m), exp2f(m_right - m), m};
}
__device__ __forceinline__ float merge_value(float left, float right, const MergeWeights& w) {
  return __fmaf_rn(left, w.wl, __fmul_rn(right, w.wr));
}

// A merge tree's handshake at a parent node, by every thread of a CTA once it has stored its node:
// true for the CTA that arrives second, which carries the parent (and resets the counter for the
// next launch); the first leaves the tree.
__device__ __forceinline__ bool arrived_second(int* counter) {
  __threadfence();  // this node is visible GPU-wide before the counter says so
  __syncthreads();
  int second = 0;
  if (threadIdx.x == 0) {
    second = atomicAdd(counter, 1);
    if (second) {
      *counter = 0;
      __threadfence();  // the sibling's stores, published before its increment, are read after ours
    }
  }
  return __syncthreads_or(second);
}

// Called by every thread of every CTA of a cluster whose splits saw rows (others left at once,
// the rest called cluster_arrive_relaxed() when they started), after the CTA's tiles: o, m_run,
// l_run as the kernel holds them (rows g and g + 8 of warp wq's 128 columns; every warp holds the
// same max and sum), has_rows = the CTA attended at least one row (else its max is -inf and it
// sends only that), recv = this CTA's kRecvBytes receive buffer. The root writes p.out;
// part_out / part_ml / counters as the tree kernel's, used only when more than one cluster saw
// rows (ml slots per rank: slot (first split of the node) + rank).
__device__ __forceinline__ void cluster_merge(const MlaAbsorbedParams& p, float* recv,
                                              const float (&o)[kWarpCols / 8][4], const float (&m_run)[2],
                                              const float (&l_run)[2], bool has_rows, int64_t qi, int64_t h0, int hg,
                                              int head_groups, int split, int splits, int used, float* part_out,
                                              float* part_ml, int* counters) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x, lane = tid & 31, wq = tid >> 5, g = lane >> 2, q4 = lane & 3;
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t H = p.num_heads;
  // recv: [8 sources][16 heads][64 columns] of partial outputs, then [8 sources][16 heads][2].
  constexpr int kSlice = 16 * kSliceCols;
  float* recv_ml = recv + kCluster * kSlice;

  // Push: each slice of this CTA's partial goes straight into its owner's receive buffer (remote
  // stores do not wait for a reply; remote loads would, one round trip each: pulling the slices
  // took ~3.8 us on H200). Warp wq's columns belong to ranks 2wq and 2wq + 1. Lanes q4 and q4 ^ 1
  // swap halves so that each stores 4 adjacent columns of one row: the even lane row g, the odd
  // lane row g + 8, columns 8j + 2 (q4 & 2) .. + 3.
  cluster_wait();  // every CTA of the cluster has started
  const bool odd = q4 & 1;
  const int row = g + (odd ? 8 : 0), col = 2 * (q4 & 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int owner = 2 * wq + half;
    float* dst = cluster.map_shared_rank(recv, owner) + rank * kSlice + row * kSliceCols + col;
#pragma unroll
    for (int j = 0; j < 8 && has_rows; ++j) {
      const float* f = o[half * 8 + j];
      const float2 give = odd ? make_float2(f[0], f[1]) : make_float2(f[2], f[3]);
      const float2 got = make_float2(__shfl_xor_sync(0xffffffffu, give.x, 1), __shfl_xor_sync(0xffffffffu, give.y, 1));
      *reinterpret_cast<float4*>(dst + 8 * j) =
          odd ? make_float4(got.x, got.y, f[2], f[3]) : make_float4(f[0], f[1], got.x, got.y);
    }
    if (q4 < 2)  // lanes 0 and 1 of each quad: rows g and g + 8
      *reinterpret_cast<float2*>(cluster.map_shared_rank(recv_ml, owner) + (rank * 16 + row) * 2) =
          make_float2(m_run[q4], l_run[q4]);
  }
  cluster.sync();  // every slice has arrived (release / acquire at cluster scope)
  trace_phase(4);

  // This thread: head hr of the tile, columns c .. c + 3 and c + 32 .. c + 35 of this rank's slice
  // (a quarter-warp reads 128 contiguous bytes), the 8 sources merged in rank order.
  const int hr = tid / 8, cl = tid % 8 * 4, c = rank * kSliceCols + cl;
  float m = -INFINITY, l = 0.0f, v[8] = {};
#pragma unroll
  for (int s = 0; s < kCluster; ++s) {
    const float* src = recv + s * kSlice + hr * kSliceCols + cl;
    const float4 a = *reinterpret_cast<const float4*>(src), b = *reinterpret_cast<const float4*>(src + 32);
    const float2 ml = *reinterpret_cast<const float2*>(recv_ml + (s * 16 + hr) * 2);
    // A CTA without rows sent no partial: its slot holds stale shared memory (NaN or Inf times a
    // weight of 0 would be NaN), so it must be skipped; merging its empty partial would give the
    // same values.
    if (ml.x == -INFINITY) continue;
    const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    const MergeWeights w = merge_weights(m, ml.x);
    l = merge_value(l, ml.y, w);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = merge_value(v[i], x[i], w);
    m = w.m;
  }
  trace_phase(5);

  // More than one cluster saw rows: this rank's slice goes up the tree over clusters, as in the
  // tree kernel (first to finish of two siblings stores and leaves, the second carries the parent).
  const int64_t h = h0 + hr;
  const bool head = h < H;
  const int used_clusters = (used + kCluster - 1) / kCluster;
  const int tw_c = tree_width(splits / kCluster);
  int* my_counters = counters + (qi * head_groups + hg) * tree_width(splits) + rank * tw_c;
  bool root = true;
  int64_t node = split / kCluster;
  for (int level = 0; (used_clusters - 1) >> level; ++level, node >>= 1) {
    const bool left = (node & 1) == 0;
    const int64_t sib = node ^ 1;
    if (left && (sib << level) >= used_clusters) continue;
    __syncthreads();  // this node's (max, sum) slot may still be being read a level down
    const int64_t first = (node << level) * kCluster;  // the node's first split: its slots
    if (head) {
      float* dst = part_out + ((first * p.total_q + qi) * H + h) * kLora + c;
      __stcg(reinterpret_cast<float4*>(dst), make_float4(v[0], v[1], v[2], v[3]));
      __stcg(reinterpret_cast<float4*>(dst + 32), make_float4(v[4], v[5], v[6], v[7]));
      if (tid % 8 == 0)
        __stcg(reinterpret_cast<float2*>(part_ml + (((first + rank) * p.total_q + qi) * H + h) * 2), make_float2(m, l));
    }
    if (!arrived_second(my_counters + (tw_c >> (level + 1)) + (node >> 1))) {
      root = false;
      break;
    }
    if (!head) continue;
    const int64_t sfirst = (sib << level) * kCluster;
    const float* src = part_out + ((sfirst * p.total_q + qi) * H + h) * kLora + c;
    const float4 a = __ldcg(reinterpret_cast<const float4*>(src)),
                 b = __ldcg(reinterpret_cast<const float4*>(src + 32));
    const float2 ml =
        __ldcg(reinterpret_cast<const float2*>(part_ml + (((sfirst + rank) * p.total_q + qi) * H + h) * 2));
    const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    const MergeWeights w = left ? merge_weights(m, ml.x) : merge_weights(ml.x, m);
    l = left ? merge_value(l, ml.y, w) : merge_value(ml.y, l, w);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = left ? merge_value(v[i], x[i], w) : merge_value(x[i], v[i], w);
    m = w.m;
  }
  if (root && head) {  // normalise; l is 0 only for a row with no visible rows
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float* dst = p.out + (qi * H + h) * kLora + c;
    *reinterpret_cast<float4*>(dst) = make_float4(v[0] * inv, v[1] * inv, v[2] * inv, v[3] * inv);
    *reinterpret_cast<float4*>(dst + 32) = make_float4(v[4] * inv, v[5] * inv, v[6] * inv, v[7] * inv);
  }
}

}  // namespace mma_decode
}  // namespace kiln::ops::cuda
