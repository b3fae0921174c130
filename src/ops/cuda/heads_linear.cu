// A single stream's attention output in one launch: W_uv per head, then o_proj (y = linear(
// linear_heads(x))), joined by a grid-wide barrier instead of a kernel boundary.
//
// Why: as two staged GEMVs (gemv.cu) the pair held a single-stream layer's critical path for
// ~9 us (H200 kernel trace, session 13: W_uv 1.6-1.7 us, o_proj 7.3-8.0) for ~10 MB of weights
// (~2.4 us at the copy rate). o_proj could launch only once W_uv had started, so its CTAs became
// resident, and began copying their 32 KB of weight rows, at about its release; and the boundary
// between them cost a grid drain and a launch. Here every CTA copies both its W_uv rows and its
// o_proj rows into shared memory before the wait (the kernel launches while MLA decode runs),
// computes its W_uv rows, meets the others at the barrier, then computes its o_proj rows.
//
// The barrier needs the whole grid resident at once. The kernel is launched cooperatively (the
// driver places every CTA or fails the launch; it never leaves some waiting for others that cannot
// start, whatever else shares the GPU or however the SMs' shared-memory splits stand), beside
// programmatic dependent launch; heads_linear_fits keeps the grid within the occupancy of an idle
// GPU. The barrier is cooperative_groups' grid sync, whose state the driver keeps per launch; it
// replaced a hand-written one (per-stream counters, an arrival count and a generation spun on with
// __nanosleep). Not A/B'd in one run: W_uv stored -> barrier passed took 2.18-2.32 us (H200 kernel
// trace medians, session 14's runs 1 and 3-5) before, 1.76-1.82 after (runs 6-7).
// Numerics: each output is one warp's dot8 chain and warp_sum, as gemv_staged_kernel's single-row
// path (the default for one row; KILN_GEMV_MMA_MIN_ROWS=1 would move the two ops to tensor cores
// and other bits).
#include <cooperative_groups.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/env.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/pdl.cuh"

namespace kiln::ops::cuda {
namespace {

constexpr int kWarps = 8;  // rows of each GEMV a CTA takes: one warp a row
// A CTA's rows of both GEMVs and o_proj's x; past 48 KB a launch needs an attribute.
constexpr int kMaxStagedBytes = 48 * 1024;

// One row of m = 1: this lane's part of dot(w row in shared memory, x), summed over the warp; x
// in global memory (read-only for the kernel) or, with kSmemX, in shared memory.
template <bool kSmemX>
__device__ __forceinline__ float row_dot(const uint4* row, const float* x, int n8, int lane) {
  float acc[1] = {0.0f};
  for (int i = lane; i < n8; i += 32) {
    if constexpr (kSmemX) {
      float wf[8];
      bf16x8_to_f32(row[i], wf);
      acc[0] += dot8(wf, reinterpret_cast<const float4*>(x)[2 * i], reinterpret_cast<const float4*>(x)[2 * i + 1]);
    } else {
      dot8_accumulate<1>(row[i], x, 0, i * 8, 1, acc);
    }
  }
  return warp_sum(acc[0]);
}

// grid: max(ceil(heads · a.n / 8), ceil(b.n / 8)) CTAs of 8 warps. CTA c takes rows 8c + warp of
// both: W_uv row r = (head r / a.n, row r % a.n), o_proj row r. Dynamic shared memory: 8 rows of
// a.k then 8 rows of b.k bf16, then o_proj's x (b.k f32), which the CTAs wrote in this launch:
// the CTA copies it from L2 once, every thread's loads at once (each warp reading it through L2
// itself, k / 256 round trips one after another, took ~9.7 us after the barrier: H200, run 10).
__global__ void __launch_bounds__(kWarps * 32) heads_linear_kernel(LinearHeadsParams a, LinearParams b) {
  extern __shared__ uint4 rows_s[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n8a = static_cast<int>(a.k / 8), n8b = static_cast<int>(b.k / 8);
  const int64_t rows_a = a.heads * a.n, r = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  // Rows past the end copy the last row and write nothing.
  const int64_t ra = min(r, rows_a - 1), rb = min(r, b.n - 1), h = ra / a.n, j = ra % a.n;
  const auto* wa =
      reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.w) + h * a.w_head_stride + j * a.k);
  const auto* wb = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(b.w) + rb * b.k);
  uint4* row_a = rows_s + warp * n8a;
  uint4* row_b = rows_s + kWarps * n8a + warp * n8b;
  for (int i = lane; i < n8a; i += 32) cp_async16(row_a + i, wa + i, true);
  cp_async_commit();
  for (int i = lane; i < n8b; i += 32) cp_async16(row_b + i, wb + i, true);
  cp_async_commit();
  pdl_wait();  // activations (a.x, b.add) only from here on
  pdl_trigger();
  cp_async_wait<1>();  // this lane's chunks of its W_uv row
  const float va = row_dot<false>(row_a, a.x + h * a.x_head_stride, n8a, lane);
  if (r < rows_a && lane == 0) a.y[h * a.y_head_stride + j] = va;
  trace_phase(0);                          // kernel trace: W_uv rows stored, barrier passed
  cooperative_groups::this_grid().sync();  // W_uv's outputs are visible to every CTA
  trace_phase(1);
  float4* x_s = reinterpret_cast<float4*>(rows_s + kWarps * (n8a + n8b));
  for (int i = threadIdx.x; i < 2 * n8b; i += kWarps * 32) x_s[i] = __ldcg(reinterpret_cast<const float4*>(b.x) + i);
  cp_async_wait<0>();
  __syncthreads();
  const float vb = row_dot<true>(row_b, reinterpret_cast<const float*>(x_s), n8b, lane);
  if (r < b.n && lane == 0) b.y[r] = b.add ? vb + b.add[r] : vb;
}

size_t staged_bytes(const LinearHeadsParams& a, const LinearParams& b) {
  return static_cast<size_t>(kWarps * (a.k + b.k) * 2 + b.k * 4);
}

unsigned grid_size(const LinearHeadsParams& a, const LinearParams& b) {
  return std::max(blocks_for(a.heads * a.n, kWarps), blocks_for(b.n, kWarps));
}

// CTAs of this kernel one SM holds at once with `smem` bytes of dynamic shared memory (per device).
int resident_per_sm(size_t smem) {
  static std::mutex mu;
  static std::map<std::pair<int, size_t>, int> cache;
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = cache.try_emplace({dev, smem}, 0);
  if (fresh)
    KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&it->second, heads_linear_kernel, kWarps * 32,
                                                                  static_cast<size_t>(smem)));
  return it->second;
}

}  // namespace

bool heads_linear_fits(const LinearHeadsParams& a, const LinearParams& b) {
  static const bool on = env_int("KILN_HEADS_LINEAR", 1, 0, 1) != 0;  // 0: the two ops, for the A/B
  const bool shapes = a.m == 1 && b.m == 1 && a.heads > 0 && a.n > 0 && b.n > 0 && a.k > 0 && a.k % 8 == 0 &&
                      b.k % 8 == 0 && b.k == a.heads * a.n && b.x == a.y && a.y_head_stride == a.n && !b.norm_weight;
  const bool layout = a.w_dtype == DType::BF16 && b.w_dtype == DType::BF16 && aligned16(a.w) && aligned16(b.w) &&
                      aligned16(a.x) && aligned16(b.x) && a.w_head_stride % 8 == 0 && a.x_head_stride % 4 == 0;
  if (!on || !shapes || !layout || staged_bytes(a, b) > kMaxStagedBytes) return false;
  return static_cast<int64_t>(grid_size(a, b)) <=
         static_cast<int64_t>(resident_per_sm(staged_bytes(a, b))) * sm_count();
}

void launch_heads_linear(const LinearHeadsParams& a, const LinearParams& b, cudaStream_t s) {
  cudaLaunchAttribute cooperative{};
  cooperative.id = cudaLaunchAttributeCooperative;  // every CTA resident at once, or an error
  cooperative.val.cooperative = 1;
  launch_pdl_with(&cooperative, heads_linear_kernel, dim3(grid_size(a, b)), dim3(kWarps * 32), staged_bytes(a, b), s, a,
                  b);
}

}  // namespace kiln::ops::cuda
