// The decode router (<= 8 tokens): the gate projection, the post-attention RMSNorm and grouped top-k
// in one launch of one thread-block cluster of 8 CTAs.
//
// Why a cluster: the kernel before this one gave each expert a CTA and let the last CTA to draw a
// ticket route every token: a __threadfence, a global atomic and a reload of all logits from L2
// stood between the dot products and the routing. Nsight Compute on H200 timed that launch at
// 12.4 us at one token (its SMs active ~20% of it) for ~0.5 MB of gate weights. Here CTA r takes
// the experts [r·E/8, (r+1)·E/8), stores their logits straight into rank 0's shared memory
// (distributed shared memory) and one cluster barrier hands them to rank 0, which routes. Whole
// decode steps (Moonlight, H200): batch 8 10.8 -> 10.4 ms, batch 1 unchanged at ~2.57 ms.
//
// CTA: 256 threads; thread i takes the 4-column groups i, i + 256, ... of H for 8 experts at a
// time and every token, so all of a thread's loads are in flight at once; partials are summed over
// the thread's groups, then by warp_sum, then over the warps in warp order (the same bits on every
// run). With an input norm, every CTA sums the squares of x + residual in the same pass and writes
// its eighth of normed_x.
#include <cooperative_groups.h>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/moe/router_internal.cuh"
#include "ops/cuda/pdl.cuh"

namespace kiln::ops::cuda::router_detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kCtas = 8;      // the portable cluster size
constexpr int kWarps = 8;     // per CTA
constexpr int kExpChunk = 8;  // experts whose dot products a thread carries at once

__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

template <int T, bool kNorm>
__global__ void __cluster_dims__(kCtas, 1, 1) __launch_bounds__(kWarps * 32) gate_route_cluster_kernel(RouterParams p) {
  __shared__ float logit_s[T][kMaxExperts];  // rank 0's: every CTA stores its experts' logits here
  __shared__ float part_s[kWarps][kExpChunk][T];
  __shared__ float ss_s[kWarps][T];
  __shared__ float inv_s[T];
  __shared__ float choice_s[T][kMaxExperts];
  __shared__ float gscore_s[T][kMaxGroups];
  __shared__ int ids_s[T][kMaxTopK];
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t E = p.num_experts, H = p.hidden, per_cta = (E + kCtas - 1) / kCtas;
  const int64_t e0 = rank * per_cta, e1 = min(E, e0 + per_cta);
  const int tokens = static_cast<int>(p.num_tokens);
  // The gate rows are constant: start them towards L2 while the kernel before this one finishes.
  for (int64_t e = e0 + threadIdx.x; e < e1; e += kWarps * 32)
    if (H % 4 == 0 && aligned16(p.gate_weight + e * H))
      prefetch_l2(p.gate_weight + e * H, static_cast<uint32_t>(H * 4));
  cluster_arrive_relaxed();  // this CTA has started: the others may store into its shared memory
  pdl_wait();
  pdl_trigger();

  const float* res = kNorm ? p.norm_residual : nullptr;
  const bool nbf16 = p.norm_weight_dtype == DType::BF16;
  const bool vec = H % 4 == 0 && aligned16(p.gate_weight) && aligned16(p.x) && aligned16(res);
  const int64_t units = vec ? H / 4 : H;  // 4-column groups or columns
  // x + residual of token t at unit u.
  auto in4 = [&](int t, int64_t u) {
    float4 b = __ldg(reinterpret_cast<const float4*>(p.x + t * H) + u);
    if (kNorm && res) {
      const float4 r = __ldg(reinterpret_cast<const float4*>(res + t * H) + u);
      b = make_float4(b.x + r.x, b.y + r.y, b.z + r.z, b.w + r.w);
    }
    return b;
  };
  auto in1 = [&](int t, int64_t c) { return kNorm && res ? p.x[t * H + c] + res[t * H + c] : p.x[t * H + c]; };
  auto norm_w = [&](int64_t c) { return kNorm ? load_w(p.norm_weight, c, nbf16) : 1.0f; };

  bool first = true;  // the squares of x + residual ride in the first chunk's pass
  for (int64_t c0 = e0; c0 < e1 || (kNorm && first); c0 += kExpChunk) {
    const int64_t left = e1 - c0;
    const int n = left <= 0 ? 0 : left < kExpChunk ? static_cast<int>(left) : kExpChunk;  // experts this pass
    float acc[kExpChunk][T], ss[T];
#pragma unroll
    for (int t = 0; t < T; ++t) {
      ss[t] = 0.0f;
#pragma unroll
      for (int j = 0; j < kExpChunk; ++j) acc[j][t] = 0.0f;
    }
#pragma unroll 2
    for (int64_t u = threadIdx.x; u < units; u += kWarps * 32) {
      if (vec) {
        float4 b[T];
#pragma unroll
        for (int t = 0; t < T; ++t)
          if (t < tokens) b[t] = in4(t, u);
        const float4 nw = make_float4(norm_w(4 * u), norm_w(4 * u + 1), norm_w(4 * u + 2), norm_w(4 * u + 3));
#pragma unroll
        for (int j = 0; j < kExpChunk; ++j) {
          if (j >= n) break;
          float4 a = __ldcs(reinterpret_cast<const float4*>(p.gate_weight + (c0 + j) * H) + u);
          if constexpr (kNorm) a = make_float4(a.x * nw.x, a.y * nw.y, a.z * nw.z, a.w * nw.w);  // folded
#pragma unroll
          for (int t = 0; t < T; ++t)
            if (t < tokens) acc[j][t] += a.x * b[t].x + a.y * b[t].y + a.z * b[t].z + a.w * b[t].w;
        }
        if (kNorm && first) {
#pragma unroll
          for (int t = 0; t < T; ++t)
            if (t < tokens) ss[t] += b[t].x * b[t].x + b[t].y * b[t].y + b[t].z * b[t].z + b[t].w * b[t].w;
        }
      } else {
        float b[T];
#pragma unroll
        for (int t = 0; t < T; ++t)
          if (t < tokens) b[t] = in1(t, u);
#pragma unroll
        for (int j = 0; j < kExpChunk; ++j) {
          if (j >= n) break;
          const float a = p.gate_weight[(c0 + j) * H + u] * norm_w(u);
#pragma unroll
          for (int t = 0; t < T; ++t)
            if (t < tokens) acc[j][t] += a * b[t];
        }
        if (kNorm && first) {
#pragma unroll
          for (int t = 0; t < T; ++t)
            if (t < tokens) ss[t] += b[t] * b[t];
        }
      }
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
#pragma unroll
      for (int j = 0; j < kExpChunk; ++j) {
        const float v = warp_sum(acc[j][t]);
        if (lane == 0) part_s[warp][j][t] = v;
      }
      if (kNorm && first) {
        const float q = warp_sum(ss[t]);
        if (lane == 0) ss_s[warp][t] = q;
      }
    }
    __syncthreads();
    if (kNorm && first && threadIdx.x < tokens) {
      float q = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) q += ss_s[w][threadIdx.x];
      inv_s[threadIdx.x] = rsqrtf(q / static_cast<float>(H) + p.norm_eps);
    }
    if (first) cluster_wait();  // every CTA of the cluster has started
    first = false;
    __syncthreads();  // inv_s ready
    if (threadIdx.x < n * T) {
      const int j = threadIdx.x / T, t = threadIdx.x % T;
      if (t < tokens) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) v += part_s[w][j][t];
        if constexpr (kNorm) v *= inv_s[t];
        p.gate_logits[t * E + c0 + j] = v;
        cluster.map_shared_rank(&logit_s[0][0], 0)[t * kMaxExperts + c0 + j] = v;
      }
    }
    __syncthreads();  // part_s is free for the next chunk
  }
  if (first) cluster_wait();  // a CTA without experts (E < 8) still pairs its arrive
  if constexpr (kNorm) {
    // This CTA's eighth of the experts' input, each column written once across the cluster.
    const int64_t slice = (H + kCtas - 1) / kCtas, c1 = min(H, (rank + 1) * slice);
    for (int64_t c = rank * slice + threadIdx.x; c < c1; c += kWarps * 32)
      for (int t = 0; t < tokens; ++t) p.normed_x[t * H + c] = norm_w(c) * (in1(t, c) * inv_s[t]);
  }
  cluster.sync();  // every CTA's logits are in rank 0's shared memory
  if (rank != 0) return;
  if (warp < tokens) route_token(p, logit_s[warp], warp, lane, choice_s[warp], gscore_s[warp], ids_s[warp]);
}

template <int T>
void launch(const RouterParams& p, cudaStream_t s) {
  auto* kernel = p.norm_weight ? gate_route_cluster_kernel<T, true> : gate_route_cluster_kernel<T, false>;
  launch_pdl(kernel, dim3(kCtas), dim3(kWarps * 32), 0, s, p);
}

}  // namespace

void decode_gate_route(const RouterParams& p, cudaStream_t s) {
  static_assert(kDecodeTokens == 8 && kWarps >= kDecodeTokens, "one routing warp per token");
  if (p.num_tokens == 1)
    launch<1>(p, s);
  else if (p.num_tokens == 2)
    launch<2>(p, s);
  else if (p.num_tokens <= 4)
    launch<4>(p, s);
  else
    launch<8>(p, s);
}

}  // namespace kiln::ops::cuda::router_detail
