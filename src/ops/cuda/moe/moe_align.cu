// Token permutation for the grouped expert GEMMs, entirely on the device (see moe_internal.cuh).
//
// One CTA of 1024 threads: count slots per expert, scan the per-expert tile counts, write the tile
// table and the padding rows, then scatter each slot to its expert's next free row. Even 8k tokens
// x k = 8 (65,536 slots) is 64 coalesced passes per thread, a few microseconds: cheaper than the
// second launch and global atomics a multi-CTA version would need.
//
// Counting and scattering use warp-aggregated shared atomics (__match_any_sync groups the lanes
// that chose the same expert; one atomic per group), so an expert chosen by every token costs one
// atomic per warp, not 32. Rows of one expert land in warp-arrival order, which is not
// deterministic, but it need not be: every GEMM output row depends only on its own input row, and
// the combine reads rows through row_of in (token, j) order, so the result is bitwise the same.
#include <cub/block/block_scan.cuh>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/moe/moe_internal.cuh"

namespace kiln::ops::cuda::moe_detail {
namespace {

constexpr int kAlignThreads = 1024;

// Expert of slot i, or -1 for slots past the end and ids out of range (those are dropped: the
// combine skips them; the router never produces them, and a device kernel cannot throw).
__device__ __forceinline__ int expert_of(const int32_t* ids, int64_t i, int64_t slots, int experts) {
  if (i >= slots) return -1;
  const int e = ids[i];
  return e >= 0 && e < experts ? e : -1;
}

// dynamic smem: [experts] counts (reused as cursors), [experts] first tile of each expert
__global__ void __launch_bounds__(kAlignThreads)
    moe_align_kernel(const int32_t* ids, int64_t slots, int experts, int bm, int64_t max_tiles, int32_t* sorted_slot,
                     int32_t* row_of, int32_t* tile_expert) {
  using Scan = cub::BlockScan<int, kAlignThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  extern __shared__ int32_t sh[];
  int32_t* cnt = sh;              // [experts]
  int32_t* tile0 = sh + experts;  // [experts]
  const int tid = threadIdx.x, lane = tid & 31;
  const unsigned lanes_below = (1u << lane) - 1u;

  for (int e = tid; e < experts; e += kAlignThreads) cnt[e] = 0;
  __syncthreads();
  // Trip count is uniform across the block, so every lane of a warp reaches __match_any_sync.
  for (int64_t base = 0; base < slots; base += kAlignThreads) {
    const int e = expert_of(ids, base + tid, slots, experts);
    const unsigned group = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && (group & lanes_below) == 0) atomicAdd(&cnt[e], __popc(group));
  }
  __syncthreads();

  // Exclusive scan of tiles per expert, 1024 experts per round.
  int carry = 0;
  for (int e0 = 0; e0 < experts; e0 += kAlignThreads) {
    const int e = e0 + tid;
    const int tiles = e < experts ? (cnt[e] + bm - 1) / bm : 0;
    int first = 0, round_total = 0;
    Scan(scan_tmp).ExclusiveSum(tiles, first, round_total);
    if (e < experts) tile0[e] = carry + first;
    carry += round_total;
    __syncthreads();  // scan_tmp is reused next round
  }
  const int total_tiles = carry;

  // Tile table and padding rows; each expert's thread then owns its cursor.
  for (int e = tid; e < experts; e += kAlignThreads) {
    const int n = cnt[e], t0 = tile0[e], tiles = (n + bm - 1) / bm;
    for (int t = 0; t < tiles; ++t) tile_expert[t0 + t] = e;
    for (int64_t r = static_cast<int64_t>(t0) * bm + n; r < static_cast<int64_t>(t0 + tiles) * bm; ++r)
      sorted_slot[r] = -1;
    cnt[e] = t0 * bm;
  }
  for (int64_t t = total_tiles + tid; t < max_tiles; t += kAlignThreads) tile_expert[t] = -1;
  __syncthreads();

  for (int64_t base = 0; base < slots; base += kAlignThreads) {
    const int64_t i = base + tid;
    const int e = expert_of(ids, i, slots, experts);
    const unsigned group = __match_any_sync(0xffffffffu, e);
    if (e >= 0) {
      const int leader = __ffs(group) - 1;
      int first = 0;
      if (lane == leader) first = atomicAdd(&cnt[e], __popc(group));
      first = __shfl_sync(group, first, leader);
      const int r = first + __popc(group & lanes_below);
      sorted_slot[r] = static_cast<int32_t>(i);
      row_of[i] = r;
    } else if (i < slots) {
      row_of[i] = -1;
    }
  }
}

}  // namespace

void moe_align(const int32_t* topk_ids, int64_t slots, int64_t experts, const AlignedLayout& l, cudaStream_t s) {
  const size_t smem = 2 * static_cast<size_t>(experts) * sizeof(int32_t);
  moe_align_kernel<<<1, kAlignThreads, smem, s>>>(topk_ids, slots, static_cast<int>(experts), static_cast<int>(l.bm),
                                                  l.max_tiles, l.sorted_slot, l.row_of, l.tile_expert);
}

}  // namespace kiln::ops::cuda::moe_detail
