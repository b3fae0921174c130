// Token permutation for the grouped expert GEMMs, entirely on the device (see moe_internal.cuh).
//
// Two kernels over the same G CTAs, each CTA owning the 1024-slot chunks c ≡ blockIdx.x (mod G):
//  1. count: each CTA histograms its chunks in shared memory and stores counts[cta][expert].
//  2. scatter: every CTA reads all G x E counts, so each knows the per-expert totals (an exclusive
//     scan of their tile counts gives each expert's first tile) and how many slots of each expert
//     the CTAs before it hold (where its own slots of that expert start). It then scatters its
//     slots, and all CTAs together write the tile table and the padding rows.
// Why not one CTA (the previous version, measured 172 us at 48,000 slots on an H200): its ~94
// passes each waited on a dependent load of ids, and one SM's L1 takes scattered 4-byte stores at
// roughly one per cycle. Here G = min(chunks, SMs, 16k / E) CTAs each do one round of loads (up
// to 4 chunks in flight per thread) and ~1k scattered stores at 48,000 slots, all in parallel; G
// is bounded because every scatter CTA reads all G x E counts from L2. The second launch is the
// price of the grid-wide barrier between counting and scattering; with programmatic dependent
// launch (pdl.cuh) it starts while the first runs and loads its ids before it waits.
// Measured on an H200 (Nsight Compute, caches flushed, 64 experts): count 5 us + scatter 12 us at
// 48,000 slots, 5 + 10 us at 6,000 (the estimate was ~4 us in all: an L2 round trip for ids or
// counts, a few block barriers and ~1k stores per CTA per kernel).
//
// Counting and scattering use warp-aggregated shared atomics (__match_any_sync groups the lanes
// that chose the same expert; one atomic per group), so an expert chosen by every slot costs one
// atomic per warp, not 32. Rows of one expert land in warp-arrival order within a CTA, which is
// not deterministic, but it need not be: every GEMM output row depends only on its own input row,
// and the combine reads rows through row_of in (token, j) order, so the result is bitwise the same.
#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/moe/moe_internal.cuh"
#include "ops/cuda/pdl.cuh"

namespace kiln::ops::cuda::moe_detail {
namespace {

constexpr int kThreads = 1024;     // slots per chunk: one per thread
constexpr int kUnroll = 4;         // chunks a CTA loads at once (independent loads in flight)
constexpr int kMaxCounts = 16384;  // G x E bound: what each scatter CTA reads

// Expert of slot i, or -1 for slots past the end and ids out of range (those are dropped: the
// combine skips them; the router never produces them, and a device kernel cannot throw). L2 loads:
// the scatter kernel reads ids before its PDL wait.
__device__ __forceinline__ int expert_of(const int32_t* ids, int64_t i, int64_t slots, int experts) {
  if (i >= slots) return -1;
  const int e = __ldcg(ids + i);
  return e >= 0 && e < experts ? e : -1;
}

// Slot of this thread in the u-th chunk of the round starting at chunk c0.
__device__ __forceinline__ int64_t slot_of(int64_t c0, int u) {
  return (c0 + static_cast<int64_t>(u) * gridDim.x) * kThreads + threadIdx.x;
}

__device__ __forceinline__ void load_round(const int32_t* ids, int64_t slots, int experts, int64_t c0,
                                           int (&ex)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) ex[u] = expert_of(ids, slot_of(c0, u), slots, experts);
}

// dynamic smem: [experts] counts. Writes counts[blockIdx.x][experts].
__global__ void __launch_bounds__(kThreads, 2)
    count_kernel(const int32_t* ids, int64_t slots, int experts, int32_t* counts) {
  extern __shared__ int32_t cnt[];
  const int tid = threadIdx.x;
  const unsigned lanes_below = (1u << (tid & 31)) - 1u;
  for (int e = tid; e < experts; e += kThreads) cnt[e] = 0;
  __syncthreads();
  pdl_wait();
  pdl_trigger();
  // Trip counts are uniform across the block, so every lane of a warp reaches __match_any_sync.
  for (int64_t c0 = blockIdx.x; c0 * kThreads < slots; c0 += kUnroll * gridDim.x) {
    int ex[kUnroll];
    load_round(ids, slots, experts, c0, ex);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const unsigned group = __match_any_sync(0xffffffffu, ex[u]);
      if (ex[u] >= 0 && (group & lanes_below) == 0) atomicAdd(&cnt[ex[u]], __popc(group));
    }
  }
  __syncthreads();
  for (int e = tid; e < experts; e += kThreads) counts[static_cast<int64_t>(blockIdx.x) * experts + e] = cnt[e];
}

// dynamic smem: [experts] slots per expert, [experts] first tile, [experts] this CTA's next row.
__global__ void __launch_bounds__(kThreads)
    scatter_kernel(const int32_t* ids, int64_t slots, int experts, int bm, int64_t max_tiles, const int32_t* counts,
                   int32_t* sorted_slot, int32_t* row_of, int32_t* tile_expert) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  extern __shared__ int32_t sh[];
  int32_t* total = sh;                 // [experts]
  int32_t* tile0 = sh + experts;       // [experts]
  int32_t* cursor = sh + 2 * experts;  // [experts]
  const int tid = threadIdx.x, lane = tid & 31, ctas = gridDim.x;
  const unsigned lanes_below = (1u << lane) - 1u;

  // ids were written before count_kernel, our immediate predecessor, so they may be read before
  // the wait (pdl.cuh's invariant): the first round's loads overlap count_kernel.
  int ex[kUnroll];
  load_round(ids, slots, experts, blockIdx.x, ex);
  pdl_wait();
  pdl_trigger();

  // Totals and this CTA's offset per expert: `split` consecutive lanes share an expert's G counts.
  int split = 32;
  while (split > 1 && split * experts > kThreads) split >>= 1;
  for (int e0 = 0; e0 < experts; e0 += kThreads / split) {
    const int e = e0 + tid / split;
    int tot = 0, before = 0;
    if (e < experts) {
#pragma unroll 4
      for (int c = tid % split; c < ctas; c += split) {
        const int n = __ldcg(counts + static_cast<int64_t>(c) * experts + e);
        tot += n;
        before += c < static_cast<int>(blockIdx.x) ? n : 0;
      }
    }
    for (int o = split / 2; o > 0; o >>= 1) {
      tot += __shfl_xor_sync(0xffffffffu, tot, o);
      before += __shfl_xor_sync(0xffffffffu, before, o);
    }
    if (e < experts && tid % split == 0) {
      total[e] = tot;
      cursor[e] = before;
    }
  }
  __syncthreads();

  // Exclusive scan of tiles per expert, 1024 experts per round.
  int carry = 0;
  for (int e0 = 0; e0 < experts; e0 += kThreads) {
    const int e = e0 + tid;
    const int tiles = e < experts ? (total[e] + bm - 1) / bm : 0;
    int first = 0, round_total = 0;
    Scan(scan_tmp).ExclusiveSum(tiles, first, round_total);
    if (e < experts) {
      tile0[e] = carry + first;
      cursor[e] += (carry + first) * bm;
    }
    carry += round_total;
    __syncthreads();  // scan_tmp is reused next round; tile0 and cursor are read below
  }
  const int total_tiles = carry;

  for (int64_t c0 = blockIdx.x; c0 * kThreads < slots; c0 += kUnroll * ctas) {
    if (c0 != blockIdx.x) load_round(ids, slots, experts, c0, ex);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = slot_of(c0, u);
      const int e = ex[u];
      const unsigned group = __match_any_sync(0xffffffffu, e);
      if (e >= 0) {
        const int leader = __ffs(group) - 1;
        int first = 0;
        if (lane == leader) first = atomicAdd(&cursor[e], __popc(group));
        first = __shfl_sync(group, first, leader);
        const int r = first + __popc(group & lanes_below);
        sorted_slot[r] = static_cast<int32_t>(i);
        row_of[i] = r;
      } else if (i < slots) {
        row_of[i] = -1;
      }
    }
  }

  // Padding rows (fewer than bm per expert): one warp per expert across the grid.
  const int warps = kThreads / 32;
  for (int e = blockIdx.x * warps + tid / 32; e < experts; e += ctas * warps) {
    const int n = total[e], end = (tile0[e] + (n + bm - 1) / bm) * bm;
    for (int r = tile0[e] * bm + n + lane; r < end; r += 32) sorted_slot[r] = -1;
  }
  // Tile table: tile t belongs to the last expert whose first tile is <= t (experts without
  // tiles share their first tile with the next expert, so they are never the last): the same
  // search as a row's sequence in cumulative offsets (seq_of).
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + tid; t < max_tiles; t += ctas * kThreads) {
    tile_expert[t] = t < total_tiles ? static_cast<int32_t>(seq_of(tile0, experts, t)) : -1;
  }
}

}  // namespace

void moe_align(const int32_t* topk_ids, int64_t slots, int64_t experts, const AlignedLayout& l, cudaStream_t s) {
  KILN_REQUIRE(experts >= 1 && experts <= 3072,
               "moe_align: 1..3072 experts (shared memory), got " + std::to_string(experts));
  const int E = static_cast<int>(experts);
  const int64_t chunks = (slots + kThreads - 1) / kThreads;
  const int ctas = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({chunks, sm_count(), kMaxCounts / E})));
  // Fixed size (G x E <= kMaxCounts), so it is allocated at the first call and never grows.
  static GrowOnlyScratch counts_buf;
  int32_t* counts = counts_buf.get<int32_t>(kMaxCounts);
  const size_t smem = static_cast<size_t>(E) * sizeof(int32_t);
  launch_pdl(count_kernel, dim3(ctas), dim3(kThreads), smem, s, topk_ids, slots, E, counts);
  launch_pdl(scatter_kernel, dim3(ctas), dim3(kThreads), 3 * smem, s, topk_ids, slots, E, static_cast<int>(l.bm),
             l.max_tiles, static_cast<const int32_t*>(counts), l.sorted_slot, l.row_of, l.tile_expert);
}

}  // namespace kiln::ops::cuda::moe_detail
