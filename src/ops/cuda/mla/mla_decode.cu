// Absorbed MLA over the paged latent cache (decode and speculative verification).
//
// Each latent row (c_kv ‖ k_pe) is shared by every head, so a CTA takes a tile of 16 heads and
// streams rows through shared memory once for all of them; head counts that are not a multiple of
// 16 (1, 5, 12, 24, ...) mask the tail of the last tile. Long contexts split across CTAs
// (split-KV) and the partial softmaxes merge by log-sum-exp. The grid depends only on total_q,
// the head count and the GPU, never on context lengths (CUDA-graph capture).
//
// Two kernels: bf16 pools of the DeepSeek-V3 shape (kv_lora 512, rope 64) run on tensor cores
// (mla_decode_mma.cuh) and merge their splits inside the same kernel; f32 pools and other latent
// shapes (the small test models) run the CUDA-core kernel below and a second, merging kernel.
#include <algorithm>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/env.h"
#include "ops/cuda/mla/mla_decode_mma.cuh"

namespace kiln::ops::cuda {
namespace {

constexpr int kHeads = 16;  // heads per CTA tile
constexpr int kRows = 16;   // latent rows per iteration
constexpr int kThreads = 256;
constexpr int kMaxSplits = 64;
constexpr int kMaxMmaSplits = 128;  // one sequence may spread over ~every SM

struct DecodeShape {
  int64_t row, kv_lora, pad;  // row = kv_lora + rope; pad: shared row stride (row + 1, bank-conflict free)
};

__device__ __forceinline__ float pool_value(const float* pool, int64_t i) {
  return pool[i];
}
__device__ __forceinline__ float pool_value(const __nv_bfloat16* pool, int64_t i) {
  return __bfloat162float(pool[i]);
}

// grid: (splits, total_q, head_tiles). Writes unnormalised partial outputs and (max, sum) per head.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    mla_decode_partial(MlaAbsorbedParams p, DecodeShape sh, int splits, float* part_out, float* part_ml) {
  extern __shared__ float smem[];
  float* q_s = smem;                      // [kHeads][pad]
  float* kv_s = q_s + kHeads * sh.pad;    // [kRows][pad]
  float* p_s = kv_s + kRows * sh.pad;     // [kHeads][kRows]
  float* scale_s = p_s + kHeads * kRows;  // [kHeads]
  float* m_s = scale_s + kHeads;          // [kHeads]
  float* l_s = m_s + kHeads;              // [kHeads]

  const int split = blockIdx.x;
  const int64_t qi = blockIdx.y;
  const int64_t h0 = static_cast<int64_t>(blockIdx.z) * kHeads;
  const int tid = threadIdx.x;
  const int64_t b = seq_of(p.cu_q, p.num_seqs, qi);
  const int64_t q_len = p.cu_q[b + 1] - p.cu_q[b], kv_len = p.kv.kv_lens[b];
  // kv_len 0 is a padding sequence: no rows, zero output, its block table never read.
  const int64_t visible = kv_len > 0 ? max(int64_t{0}, kv_len - q_len + (qi - p.cu_q[b]) + 1) : 0;
  const T* pool = static_cast<const T*>(p.kv.pool);
  const int64_t chunk = ((visible + splits - 1) / splits + kRows - 1) / kRows * kRows;
  const int64_t j0 = split * chunk, j1 = min(visible, j0 + chunk);

  for (int64_t i = tid; i < kHeads * sh.row; i += kThreads) {
    const int64_t h = i / sh.row, d = i % sh.row;
    q_s[h * sh.pad + d] = h0 + h < p.num_heads ? p.q[(qi * p.num_heads + h0 + h) * sh.row + d] : 0.0f;
  }
  if (tid < kHeads) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  // Each thread owns columns c0 and c0 + 1 of the latent output, for all heads of the tile.
  const int64_t c0 = 2 * tid;
  const bool owns = c0 < sh.kv_lora;
  float acc[kHeads][2];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) acc[h][0] = acc[h][1] = 0.0f;
  __syncthreads();

  for (int64_t jb = j0; jb < j1; jb += kRows) {
    const int64_t n = min(static_cast<int64_t>(kRows), j1 - jb);
    for (int64_t i = tid; i < n * sh.row; i += kThreads) {
      const int64_t r = i / sh.row, d = i % sh.row, j = jb + r;
      const int64_t blk = p.kv.block_table[b * p.kv.max_blocks + j / p.kv.block_size];
      kv_s[r * sh.pad + d] = pool_value(pool, (blk * p.kv.block_size + j % p.kv.block_size) * sh.row + d);
    }
    __syncthreads();
    {  // scores: thread -> (head, row)
      const int h = tid / kRows, r = tid % kRows;
      float dot = -INFINITY;
      if (r < n) {
        dot = 0.0f;
        const float* qh = q_s + h * sh.pad;
        const float* kr = kv_s + r * sh.pad;
        for (int64_t d = 0; d < sh.row; ++d) dot += qh[d] * kr[d];
        dot *= p.scale;
      }
      p_s[h * kRows + r] = dot;
    }
    __syncthreads();
    if (tid < kHeads) {  // online softmax per head
      scale_s[tid] = online_softmax_step(p_s + tid * kRows, kRows, m_s[tid], l_s[tid]);
    }
    __syncthreads();
    if (owns) {
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        acc[h][0] *= scale_s[h];
        acc[h][1] *= scale_s[h];
      }
      for (int64_t r = 0; r < n; ++r) {
        const float v0 = kv_s[r * sh.pad + c0], v1 = kv_s[r * sh.pad + c0 + 1];
#pragma unroll
        for (int h = 0; h < kHeads; ++h) {
          const float w = p_s[h * kRows + r];
          acc[h][0] += w * v0;
          acc[h][1] += w * v1;
        }
      }
    }
    __syncthreads();
  }

  const int64_t slot = static_cast<int64_t>(split) * gridDim.y + qi;  // [splits, total_q]
  if (owns) {
    // Fully unrolled with a guard (not a break) so acc stays in registers.
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      if (h0 + h < p.num_heads) {
        float* o = part_out + (slot * p.num_heads + h0 + h) * sh.kv_lora + c0;
        const float inv = splits == 1 ? (l_s[h] > 0 ? 1.0f / l_s[h] : 0.0f) : 1.0f;  // one split: normalise here
        o[0] = acc[h][0] * inv;
        o[1] = acc[h][1] * inv;
      }
    }
  }
  if (tid < kHeads && h0 + tid < p.num_heads) {
    part_ml[(slot * p.num_heads + h0 + tid) * 2] = m_s[tid];
    part_ml[(slot * p.num_heads + h0 + tid) * 2 + 1] = l_s[tid];
  }
}

constexpr int kMaxCombineSplits = kMaxSplits;

// grid: (total_q, num_heads); merges the splits by log-sum-exp. Each split's weight exp(m - max)
// is computed once, in parallel, into shared memory, and splits that saw no rows are skipped
// without touching memory: the old per-split chain of dependent L2 loads cost ~30 us at 128.
__global__ void mla_decode_combine(const float* part_out, const float* part_ml, int splits, int64_t total_q,
                                   int64_t num_heads, int64_t kv_lora, float* out) {
  __shared__ float w_s[kMaxCombineSplits], red[32];
  const int64_t qi = blockIdx.x, h = blockIdx.y;
  const int64_t stride = total_q * num_heads;  // between splits, in (q, head) slots
  const int64_t slot = qi * num_heads + h;
  float mx = -INFINITY;
  for (int sp = threadIdx.x; sp < splits; sp += blockDim.x) mx = fmaxf(mx, part_ml[(sp * stride + slot) * 2]);
  mx = block_max(mx, red);
  float denom = 0.0f;
  for (int sp = threadIdx.x; sp < splits; sp += blockDim.x) {
    const float m = part_ml[(sp * stride + slot) * 2];
    const float e = m == -INFINITY ? 0.0f : __expf(m - mx);
    w_s[sp] = e;
    denom += e * part_ml[(sp * stride + slot) * 2 + 1];
  }
  denom = block_sum(denom, red);                         // its barriers also publish w_s
  const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;  // 0: no visible rows, the output is 0
  for (int64_t c = threadIdx.x; c < kv_lora; c += blockDim.x) {
    float v = 0.0f;
    for (int sp = 0; sp < splits; ++sp)
      if (w_s[sp] != 0.0f) v += part_out[(sp * stride + slot) * kv_lora + c] * w_s[sp];
    out[slot * kv_lora + c] = v * inv;
  }
}

// Partial outputs of the splits; shared by both paths (one stream, grow-only for graph capture).
GrowOnlyScratch& part_out_scratch() {
  static GrowOnlyScratch s;
  return s;
}
GrowOnlyScratch& part_ml_scratch() {
  static GrowOnlyScratch s;
  return s;
}

void combine(const MlaAbsorbedParams& p, const float* po, const float* pm, int splits, cudaStream_t s) {
  mla_decode_combine<<<dim3(static_cast<unsigned>(p.total_q), static_cast<unsigned>(p.num_heads)), 128, 0, s>>>(
      po, pm, splits, p.total_q, p.num_heads, p.kv_lora, p.out);
  KILN_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_cuda_cores(const MlaAbsorbedParams& p, cudaStream_t s) {
  const int64_t total_q = p.total_q;
  KILN_REQUIRE(p.kv_lora % 2 == 0 && p.kv_lora <= 2 * kThreads,
               "mla_absorbed: kv_lora " + std::to_string(p.kv_lora) + " must be even and <= 512");
  const DecodeShape sh{p.kv_lora + p.rope_dim, p.kv_lora, p.kv_lora + p.rope_dim + 1};
  const int64_t head_tiles = (p.num_heads + kHeads - 1) / kHeads;
  // Enough CTAs to fill the GPU twice over; splits that land past a row's context exit at once.
  const int64_t ctas = total_q * head_tiles;
  const int splits = static_cast<int>(std::clamp<int64_t>((2 * sm_count() + ctas - 1) / ctas, 1, kMaxSplits));
  const size_t smem = sizeof(float) * static_cast<size_t>((kHeads + kRows) * sh.pad + kHeads * kRows + 3 * kHeads);
  // Past 48 KB the kernel must opt in, on this device, to at least this call's size (it depends on
  // the latent width; a fixed larger request would fail on GPUs with less shared memory).
  static SmemGrants grants;
  allow_smem(mla_decode_partial<T>, static_cast<int>(smem), grants);
  float* po = splits == 1
                  ? p.out
                  : part_out_scratch().get<float>(static_cast<size_t>(splits * total_q * p.num_heads * p.kv_lora));
  float* pm = part_ml_scratch().get<float>(static_cast<size_t>(splits * total_q * p.num_heads * 2));
  dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(total_q), static_cast<unsigned>(head_tiles));
  mla_decode_partial<T><<<grid, kThreads, smem, s>>>(p, sh, splits, po, pm);
  KILN_CUDA_CHECK(cudaGetLastError());
  if (splits > 1) combine(p, po, pm, splits, s);
}

// The tensor-core kernel's merge-tree counters (left zero by every launch).
int* merge_counters(size_t count) {
  static ZeroedScratch counters;
  // ctas * tree_width(splits) < 2 * (CTAs in one wave): 4096 covers any current GPU in one go.
  return counters.get<int>(std::max(count, size_t{4096}));
}

// Query rows up to which 16-head decode takes the 4-stage kernel (KILN_MLA_SMALL_Q overrides it,
// 0: never, for the A/B).
int64_t mla_small_q() {
  static const int64_t v = env_int("KILN_MLA_SMALL_Q", 8, 0);
  return v;
}

// Query rows up to which 16-head decode splits in clusters of 8 CTAs that merge through
// distributed shared memory (mla_decode_merge.cuh; KILN_MLA_CLUSTER_Q overrides it, 0: never).
// Measured on H200 (session 14, kiln-gpu-bench's kernel lines and whole steps). One row (run 4):
// the kernel alone 15.0 -> 9.2 / 24.1 -> 15.1 / 38.2 -> 27.4 us at 1k / 8k / 32k context (6.8 both
// at 128), steps 2.38-2.42 -> 2.30-2.31 ms. Two rows (run 10): 14.9 -> 10.2 / 27.8 -> 18.8 / 49.2
// -> 43.3 us (6.3 -> 6.6 at 128); steps at 8k context 3.95-4.05 -> 3.67-3.74 ms (run 9). Past that
// the clusters cost parallelism at long contexts: a row's splits come in eights and an H200 holds
// 15 clusters, so 4 rows get 96 CTAs where the tree kernel runs 132 (the kernel 32.0 -> 27.7 us at
// 8k but 73.6 -> 79.6 at 32k, run 10) and 8 rows 64 against 128 (43.4 -> 61.5 at 8k, 123.4 ->
// 230.6 at 32k, run 4), though steps at context 128 gained 0.5-5% at 2-8 rows. Moonlight stops at
// 8k positions, where 4 rows still won; the default keeps 3+ rows on the tree kernel for the
// family's 128k contexts (DeepSeek-V3 / Kimi at TP8: 16 heads a GPU).
int64_t mla_cluster_q() {
  static const int64_t v = env_int("KILN_MLA_CLUSTER_Q", 2, 0);
  return v;
}

cudaLaunchAttribute cluster_attribute() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = mma_decode::kCluster;
  a.val.clusterDim.y = 1;
  a.val.clusterDim.z = 1;
  return a;
}

// How many CTAs of one tensor-core instantiation fit on the GPU at once (occupancy x SMs, or with
// CLUSTER whole clusters x 8: a cluster needs 8 SMs of one GPC), after opting the kernel into its
// shared memory on the current device (the attribute is per device).
template <int HT, int STAGES, bool CLUSTER>
int64_t mma_slots() {
  constexpr size_t smem = mma_decode::smem_bytes<HT, STAGES, CLUSTER>();
  constexpr int threads = HT * mma_decode::kWarpsPerTile * 32;
  auto* kernel = mma_decode::mla_decode_mma_kernel<HT, STAGES, CLUSTER>;
  static SmemGrants smem_devices;
  allow_smem(kernel, static_cast<int>(smem), smem_devices);
  static const int64_t n = [kernel] {
    if constexpr (CLUSTER) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(mma_decode::kCluster * sm_count());
      cfg.blockDim = dim3(threads);
      cfg.dynamicSmemBytes = smem;
      cudaLaunchAttribute attr = cluster_attribute();
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      int clusters = 0;
      KILN_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
      return static_cast<int64_t>(std::max(clusters, 1)) * mma_decode::kCluster;
    } else {
      int per_sm = 0;
      KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
      return static_cast<int64_t>(std::max(per_sm, 1)) * sm_count();
    }
  }();
  return n;
}

// A 16-head split covers at least STAGES tiles, all requested at once (mla_decode_mma.cuh); the
// two-tile-group kernel (more heads) keeps the 64 rows it was measured with. Each halving of the
// split count saves one level of the merge tree (a 32-64 KB partial stored, fenced, counted, read
// back: ~1-1.5 us), and tiles in flight together cost one latency; contexts longer than
// min_split_rows * splits keep their chunk, visible / splits. (The cluster form spreads contexts
// up to 8 x min_split_rows over its 8 splits in 32-row tiles: its merge is cheap.)
template <int HT, int STAGES, bool CLUSTER = false>
void launch_mma(const MlaAbsorbedParams& p, cudaStream_t s) {
  // Measured at short contexts (session 10, single-stream steps at context 128-192, Moonlight on
  // H200): 32 or 64 rows a split at least, 2.94 / 2.88 ms against 2.80-2.88 with 128 (a binary
  // whose base was slower for another change); one split up to 256 rows (no merge), 2.61 / 2.58
  // against 2.64 / 2.59: no gain either way. Nor did the idle splits prefetching the o_proj weights
  // into L2 (2.59 / 2.61 vs 2.60 / 2.59).
  constexpr int kMinSplitRows = (HT == 1 ? STAGES : 2) * mma_decode::kTileRows;
  const int64_t total_q = p.total_q, head_tiles = (p.num_heads + kHeads - 1) / kHeads;
  const int64_t head_groups = (head_tiles + HT - 1) / HT, ctas = total_q * head_groups;
  // Splits fill at most one wave: a second, partial wave would cost as much as a full one. With
  // CLUSTER, whole clusters of 8, at least one a query row (past 15 rows, when
  // KILN_MLA_CLUSTER_Q allows that, more than one wave).
  const int64_t fit = mma_slots<HT, STAGES, CLUSTER>() / ctas;
  const int splits = CLUSTER ? static_cast<int>(std::clamp<int64_t>(fit / mma_decode::kCluster * mma_decode::kCluster,
                                                                    mma_decode::kCluster, kMaxMmaSplits))
                             : static_cast<int>(std::clamp<int64_t>(fit, 1, kMaxMmaSplits));
  float *po = nullptr, *pm = nullptr;
  int* counters = nullptr;
  if (splits > 1) {  // one split writes p.out directly
    const auto slots = static_cast<size_t>(splits * total_q * p.num_heads);
    po = part_out_scratch().get<float>(slots * static_cast<size_t>(p.kv_lora));
    pm = part_ml_scratch().get<float>(slots * 2);
    counters = merge_counters(static_cast<size_t>(ctas * mma_decode::tree_width(splits)));
  }
  const int64_t blocks = ctas * splits;
  KILN_REQUIRE(blocks < (int64_t{1} << 31), "mla_absorbed: too many query rows for one launch");
  const cudaLaunchAttribute cluster = cluster_attribute();
  launch_pdl_with(CLUSTER ? &cluster : nullptr, mma_decode::mla_decode_mma_kernel<HT, STAGES, CLUSTER>,
                  dim3(static_cast<unsigned>(blocks)), dim3(HT * mma_decode::kWarpsPerTile * 32),
                  mma_decode::smem_bytes<HT, STAGES, CLUSTER>(), s, p, splits, static_cast<int>(head_groups),
                  kMinSplitRows, po, pm, counters);
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void mla_absorbed(const MlaAbsorbedParams& p, cudaStream_t s) {
  if (p.total_q == 0) return;
  KILN_REQUIRE(p.kv.pool_dtype == DType::F32 || p.kv.pool_dtype == DType::BF16,
               std::string("mla_absorbed: unsupported KV pool dtype ") + dtype_name(p.kv.pool_dtype));
  if (p.kv.pool_dtype == DType::F32) return launch_cuda_cores<float>(p, s);
  if (p.kv_lora != mma_decode::kLora || p.rope_dim != mma_decode::kRope) return launch_cuda_cores<__nv_bfloat16>(p, s);
  // One 16-head tile: 4 warps. Up to mla_cluster_q() query rows (default 2): clusters of 8 CTAs,
  // 32-row tiles spread over them up to 8 x 128 rows, merged through distributed shared memory (its
  // 16-byte output stores need an aligned out). Up to 8 rows (latency-bound: a few CTAs per query)
  // each CTA takes 4 tiles at once and splits start at 128 rows (one SM each, fewer merge levels);
  // more rows, two CTAs per SM with 2 tiles in flight. More heads: two tiles share each KV tile.
  if (p.num_heads <= kHeads && p.total_q <= mla_cluster_q() && aligned16(p.out)) return launch_mma<1, 4, true>(p, s);
  if (p.num_heads <= kHeads && p.total_q <= mla_small_q()) return launch_mma<1, 4>(p, s);
  if (p.num_heads <= kHeads) return launch_mma<1, 2>(p, s);
  launch_mma<2, 3>(p, s);
}

}  // namespace kiln::ops::cuda
