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
//
// Constants before the wait (session 12): a CTA copies its experts' gate rows, the bias and the
// norm weight into shared memory with cp.async before its wait (when they fit: Moonlight's 64 x
// 2048 take 68 KB a CTA; DeepSeek-V3's 256 x 7168 do not and are prefetched into L2 as before).
// Single-stream steps on H200, KILN_ROUTER_STAGE=0 for the A/B: 2.64-2.67 -> 2.51-2.53 ms (with
// route_token's ranking in both arms; before the ranking, 2.66-2.67 -> 2.59-2.60 in another run).
#include <cooperative_groups.h>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/env.h"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/moe/router_internal.cuh"
#include "ops/cuda/pdl.cuh"

namespace kiln::ops::cuda::router_detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kCtas = 8;      // the portable cluster size
constexpr int kWarps = 8;     // per CTA
constexpr int kExpChunk = 8;  // experts whose dot products a thread carries at once
// Most dynamic shared memory the staged form takes (with the T = 8 kernel's ~37 KB of static).
constexpr size_t kMaxStagedBytes = 160 * 1024;

// Shared memory for the constants a CTA copies before the wait (staged form): its experts' gate
// rows, the bias, the norm weight (its own dtype); 0 when they do not fit or are misaligned.
size_t staged_bytes(const RouterParams& p) {
  const int64_t H = p.hidden, E = p.num_experts, per_cta = (E + kCtas - 1) / kCtas;
  const size_t esz = p.norm_weight_dtype == DType::BF16 ? 2 : 4;
  const size_t bytes = static_cast<size_t>(per_cta * H + E) * 4 + (p.norm_weight ? H * esz : 0);
  const bool ok = H % 4 == 0 && E % 4 == 0 && aligned16(p.gate_weight) && aligned16(p.bias) &&
                  (!p.norm_weight || (aligned16(p.norm_weight) && H * esz % 16 == 0)) && bytes <= kMaxStagedBytes;
  return ok ? bytes : 0;
}

// Copies [src, src + bytes) to shared dst with every thread of the CTA (16-byte chunks).
__device__ __forceinline__ void copy_async(void* dst, const void* src, int64_t bytes) {
  for (int64_t i = threadIdx.x; i < bytes / 16; i += kWarps * 32)
    cp_async16(static_cast<uint4*>(dst) + i, static_cast<const uint4*>(src) + i, true);
}

// The routing of every token by all of rank 0's warps, not one warp a token: each token gets
// 256 / T' threads (T' = tokens rounded up to a power of two), and each expert Q of them (Q <= 32:
// 4 at one token and 64 experts). A thread counts the experts of its slice (every Q-th) that rank
// above its expert in the order (choice descending, index ascending on ties), shuffles add the Q
// counts up, and a chosen expert's thread stores its id and sigmoid at its rank; threads j < top_k
// of a token write its weights, the normaliser summed in choice order as the reference does.
// H200, Moonlight (session 13, KILN_ROUTER_CTA_RANK=0 runs route_token, one warp a token, for the
// A/B): one warp ranking 64 experts took 3.1 us, its lanes' 128 compares one after another (a
// thread here makes 16); the routing after the cluster barrier 3.6 -> 2.2 us (run 5),
// single-stream steps 2.49-2.54 -> 2.42-2.46 ms, batch 2 3.41-3.43 -> 3.36-3.40, batch 4 within
// spread (run 7). Tried and slower: one warp with 4 scores to a 16-byte load (6.8 us to rank: why
// is not measured). Tried, no change: rank 0 routing garbage before the wait to fetch the code.
// Up to 4 tokens (64 threads or more a token) and kRankExperts experts: past them a thread's
// compares are as many as route_token's lanes make (5-8 tokens: 32 threads a token; batch 8's
// router took 19.8 against 19.0 us this way, H200 run 7), or its ranking of E² pairs outgrows the
// warp's top_k rounds of argmax (more than 128 experts).
constexpr int kCtaRankTokens = 4;

template <int T>
__device__ void route_tokens(const RouterParams& p, int tokens, const float (&logits)[T][kMaxExperts],
                             const float* bias, float (&choice)[T][kMaxExperts], float (&gscore)[T][kMaxGroups],
                             int (&ids)[T][kMaxTopK], float (&sig)[T][kMaxTopK]) {
  const int E = static_cast<int>(p.num_experts), k = static_cast<int>(p.top_k);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (warp < tokens) route_choice(p, logits[warp], bias, lane, choice[warp], gscore[warp]);
  __syncthreads();
  trace_phase(5);
  int groups = 1;  // threads of a token: a power of two, at least a warp
  while (groups < tokens) groups *= 2;
  const int per_token = kWarps * 32 / groups, t = threadIdx.x / per_token, r = threadIdx.x % per_token;
  int q_lanes = 1;  // lanes of an expert: a power of two, aligned in their warp
  while (q_lanes < 32 && q_lanes * 2 * E <= per_token) q_lanes *= 2;
  const int q = r % q_lanes, stride = per_token / q_lanes;
  // The same trip count in every thread: the shuffles below need their whole warp.
  for (int base = 0; base < E; base += stride) {
    const int e = base + r / q_lanes;
    const bool mine = t < tokens && e < E;
    int rank = 0;
    if (mine) {
      const float v = choice[t][e];
      for (int f = q; f < E; f += q_lanes) {
        const float w = choice[t][f];
        rank += w > v || (w == v && f < e);
      }
    }
    for (int o = q_lanes / 2; o > 0; o >>= 1) rank += __shfl_xor_sync(0xffffffffu, rank, o);
    if (mine && q == 0 && rank < k) {
      ids[t][rank] = e;
      sig[t][rank] = expert_sigmoid(logits[t][e]);
    }
  }
  __syncthreads();
  trace_phase(6);
  if (t < tokens && r < k) {
    float denom = 0.0f;
    for (int j = 0; j < k; ++j) denom += sig[t][j];
    p.topk_ids[t * k + r] = ids[t][r];
    p.topk_weights[t * k + r] = route_weight(p, sig[t][r], denom);
  }
  trace_phase(7);
}

// Kernel-trace stamps (trace_phase, kernel_trace.h): 0 constants landed, 4 dot products done, 1 logits
// stored, 2 cluster synchronised, 3 routed (route_tokens' 5, 6 and 7 in between). H200, Moonlight,
// one token (session 12): 0.3, 3.5, 4.3, 5.4 and 10.1 us after the release (10.2 us on the step's critical path; 14
// before the constants were staged and the top-k ranked at once).
template <int T, bool kNorm>
__global__ void __cluster_dims__(kCtas, 1, 1) __launch_bounds__(kWarps * 32)
    gate_route_cluster_kernel(RouterParams p, bool staged, bool cta_rank) {
  extern __shared__ __align__(16) float const_s[];  // staged: gate rows [per_cta][H], bias [E], norm weight [H]
  __shared__ float logit_s[T][kMaxExperts];         // rank 0's: every CTA stores its experts' logits here
  __shared__ float part_s[kWarps][kExpChunk][T];
  __shared__ float ss_s[kWarps][T];
  __shared__ float inv_s[T];
  __shared__ __align__(16) float choice_s[T][kMaxExperts];
  __shared__ float gscore_s[T][kMaxGroups];
  __shared__ int ids_s[T][kMaxTopK];
  __shared__ float sig_s[T][kMaxTopK];  // the chosen experts' sigmoids in choice order
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t E = p.num_experts, H = p.hidden, per_cta = (E + kCtas - 1) / kCtas;
  const int64_t e0 = rank * per_cta, e1 = min(E, e0 + per_cta);
  const int tokens = static_cast<int>(p.num_tokens);
  // The gate rows, bias and norm weight are constant: copy them into shared memory (staged) or
  // start them towards L2 while the kernel before this one finishes.
  float* bias_s = const_s + per_cta * H;
  void* nw_s = bias_s + E;
  if (staged) {
    copy_async(const_s, p.gate_weight + e0 * H, (e1 - e0) * H * 4);
    copy_async(bias_s, p.bias, E * 4);
    if (kNorm) copy_async(nw_s, p.norm_weight, H * (p.norm_weight_dtype == DType::BF16 ? 2 : 4));
    cp_async_commit();
  } else {
    for (int64_t e = e0 + threadIdx.x; e < e1; e += kWarps * 32)
      if (H % 4 == 0 && aligned16(p.gate_weight + e * H))
        prefetch_l2(p.gate_weight + e * H, static_cast<uint32_t>(H * 4));
  }
  cluster_arrive_relaxed();  // this CTA has started: the others may store into its shared memory
  pdl_wait();
  pdl_trigger();
  if (staged) {
    cp_async_wait<0>();
    __syncthreads();
  }
  trace_phase(0);
  const float* bias = staged ? bias_s : p.bias;
  const void* nw_base = staged ? nw_s : p.norm_weight;
  auto gate_row = [&](int64_t e) { return staged ? const_s + (e - e0) * H : p.gate_weight + e * H; };

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
  auto norm_w = [&](int64_t c) { return kNorm ? load_w(nw_base, c, nbf16) : 1.0f; };

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
          float4 a = staged ? reinterpret_cast<const float4*>(gate_row(c0 + j))[u]
                            : __ldcs(reinterpret_cast<const float4*>(gate_row(c0 + j)) + u);
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
          const float a = gate_row(c0 + j)[u] * norm_w(u);
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
    if (first) trace_phase(4);
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
  trace_phase(1);
  if constexpr (kNorm) {
    // This CTA's eighth of the experts' input, each column written once across the cluster.
    const int64_t slice = (H + kCtas - 1) / kCtas, c1 = min(H, (rank + 1) * slice);
    for (int64_t c = rank * slice + threadIdx.x; c < c1; c += kWarps * 32)
      for (int t = 0; t < tokens; ++t) p.normed_x[t * H + c] = norm_w(c) * (in1(t, c) * inv_s[t]);
  }
  cluster.sync();  // every CTA's logits are in rank 0's shared memory
  trace_phase(2);
  if (rank != 0) return;
  if (cta_rank && tokens <= kCtaRankTokens && E <= kRankExperts)
    route_tokens<T>(p, tokens, logit_s, bias, choice_s, gscore_s, ids_s, sig_s);
  else if (warp < tokens)
    route_token(p, logit_s[warp], bias, warp, lane, choice_s[warp], gscore_s[warp], ids_s[warp]);
  trace_phase(3);
}

// KILN_ROUTER_STAGE=0: the constants go to L2 only (prefetch), for the A/B.
bool router_stage() {
  static const bool v = env_int("KILN_ROUTER_STAGE", 1, 0, 1) != 0;
  return v;
}

template <int T>
void launch(const RouterParams& p, cudaStream_t s) {
  auto* kernel = p.norm_weight ? gate_route_cluster_kernel<T, true> : gate_route_cluster_kernel<T, false>;
  const size_t smem = router_stage() ? staged_bytes(p) : 0;
  static SmemGrants grants[2];  // one per kernel
  if (smem) allow_smem(kernel, static_cast<int>(smem), grants[p.norm_weight ? 1 : 0]);
  static const bool cta_rank = env_int("KILN_ROUTER_CTA_RANK", 1, 0, 1) != 0;  // 0: route_token, for the A/B
  launch_pdl(kernel, dim3(kCtas), dim3(kWarps * 32), smem, s, p, smem > 0, cta_rank);
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
