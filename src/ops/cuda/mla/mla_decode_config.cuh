// Shapes of the tensor-core MLA decode kernel (mla_decode_mma.cuh) and its cluster merge
// (mla_decode_merge.cuh): the DeepSeek-V3 latent row, the KV tile, the warp layout.
#pragma once

#include <cstddef>

namespace kiln::ops::cuda {
namespace mma_decode {

constexpr int kLora = 512, kRope = 64, kRow = kLora + kRope;
constexpr int kTileRows = 32;                               // KV rows per pipeline stage
constexpr int kWarpsPerTile = 4;                            // warps per 16-head tile
constexpr int kRowStride = kRow * 2 + 16;                   // bytes: +16 puts 8 ldmatrix rows on distinct banks
constexpr int kStageBytes = kTileRows * kRowStride;         // 37,376 B
constexpr int kKSteps = kRow / 16 / kWarpsPerTile;          // 9 k-steps of the QK product per warp
constexpr int kWarpCols = kLora / kWarpsPerTile;            // 128 output columns per warp
constexpr int kChunks = kRow * 2 / 16;                      // 72 16-byte chunks per row
constexpr int kSStride = kTileRows + 8;                     // floats per row of the S exchange (no conflicts)
constexpr int kSBytes = kWarpsPerTile * 16 * kSStride * 4;  // one head tile's S exchange
constexpr float kLog2e = 1.4426950408889634f;
// The cluster merge's receive buffer (mla_decode_merge.cuh): from each of the 8 CTAs of a cluster,
// its partial's 64-column slice for this CTA (16 heads) and its (max, sum) per head.
constexpr int kCluster = 8;                   // splits per cluster (the portable cluster size)
constexpr int kSliceCols = kLora / kCluster;  // 64 output columns merged by each rank
constexpr size_t kRecvBytes = kCluster * 16 * (kSliceCols + 2) * sizeof(float);

template <int HT, int STAGES, bool CLUSTER>
constexpr size_t smem_bytes() {
  return static_cast<size_t>(STAGES * kStageBytes + HT * kSBytes) + (CLUSTER ? kRecvBytes : 0);
}
// Counters per (query row, head group) of the merge tree: a heap of the internal nodes over splits
// rounded up to a power of two (index 0 unused).
__host__ __device__ constexpr int tree_width(int splits) {
  int w = 1;
  while (w < splits) w *= 2;
  return w;
}

}  // namespace mma_decode
}  // namespace kiln::ops::cuda
