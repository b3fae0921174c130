// Grouped top-k routing on the GPU: one warp per token runs exactly the reference's steps
// (sigmoid in f32, bias for choice only, groups by their top-2 sum, dropped groups at 0.0,
// lower index first on ties), so CPU and GPU choose the same experts. A warp, not a thread, per
// token: decode steps route one token, and a lone thread walking 64-512 experts out of local
// memory took ~80 us per layer. The gate projection x · Wᵀ rides in the same op: inside the routing
// launch up to 8 tokens, per-expert CTAs up to 256, beyond that the tensor-core GEMM of
// router_gate_gemm.cu.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/moe/router_internal.cuh"
#include "ops/cuda/pdl.cuh"

namespace kiln::ops::cuda {
namespace {

constexpr int kMaxExperts = 512;
constexpr int kMaxGroups = 64;
constexpr int kMaxTopK = 16;
constexpr int kWarps = 4;                // tokens per CTA (routing), warps per expert (gate)
constexpr int kFusedGateTokens = 8;      // up to here the gate projection runs inside the routing launch
constexpr int kChunkedGateTokens = 256;  // up to here per-expert CTAs over 8-token chunks, then a tiled GEMM

// The better of two (value, index) candidates: higher value, lower index on ties.
__device__ __forceinline__ void warp_best(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) v = ov, i = oi;
  }
}

// Routes token t from its logits row (shared or global memory) with one warp; every lane returns
// and lane 0 writes the token's ids and weights. choice [E], gscore [G], ids [top_k] are the
// warp's own shared scratch.
__device__ void route_token(const RouterParams& p, const float* logits, int64_t t, int lane, float* choice,
                            float* gscore, int* ids) {
  const int E = static_cast<int>(p.num_experts), G = static_cast<int>(p.n_group), per = E / G;
  for (int e = lane; e < E; e += 32) choice[e] = 1.0f / (1.0f + expf(-logits[e])) + p.bias[e];
  __syncwarp();
  // With topk_group >= n_group every group is kept (Moonlight: one group): nothing to drop.
  if (p.topk_group < G) {
    for (int g = lane; g < G; g += 32) {  // each group's top-2 sum, in the reference's order
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int e = g * per; e < (g + 1) * per; ++e) {
        const float v = choice[e];
        if (v > b1) {
          b2 = b1;
          b1 = v;
        } else if (v > b2) {
          b2 = v;
        }
      }
      gscore[g] = per >= 2 ? b1 + b2 : b1;
    }
    __syncwarp();
    // Keep the topk_group best groups; experts of the others drop to 0.0, as in the reference.
    uint64_t kept = 0;
    for (int64_t k = 0; k < p.topk_group; ++k) {
      float v = -INFINITY;
      int i = -1;
      for (int g = lane; g < G; g += 32)
        if (!((kept >> g) & 1) && (i < 0 || gscore[g] > v)) v = gscore[g], i = g;
      warp_best(v, i);
      kept |= uint64_t{1} << i;
    }
    for (int e = lane; e < E; e += 32)
      if (!((kept >> (e / per)) & 1)) choice[e] = 0.0f;
    __syncwarp();
  }
  for (int64_t j = 0; j < p.top_k; ++j) {
    float v = -INFINITY;
    int i = -1;
    for (int e = lane; e < E; e += 32)
      if (i < 0 || choice[e] > v) v = choice[e], i = e;
    warp_best(v, i);
    if (lane == 0) {
      ids[j] = i;
      choice[i] = -INFINITY;  // taken
    }
    __syncwarp();
  }
  if (lane != 0) return;
  float denom = 0.0f;  // in the reference's order
  for (int64_t j = 0; j < p.top_k; ++j) denom += 1.0f / (1.0f + expf(-logits[ids[j]]));
  for (int64_t j = 0; j < p.top_k; ++j) {
    float w = 1.0f / (1.0f + expf(-logits[ids[j]]));
    if (p.norm_topk_prob) w /= (denom + 1e-20f);
    p.topk_ids[t * p.top_k + j] = ids[j];
    p.topk_weights[t * p.top_k + j] = w * p.routed_scaling_factor;
  }
}

__global__ void __launch_bounds__(kWarps * 32) router_kernel(RouterParams p) {
  __shared__ float choice_s[kWarps][kMaxExperts];
  __shared__ float gscore_s[kWarps][kMaxGroups];
  __shared__ int ids_s[kWarps][kMaxTopK];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  pdl_wait();
  pdl_trigger();
  if (t >= p.num_tokens) return;
  route_token(p, p.logits + t * p.num_experts, t, lane, choice_s[warp], gscore_s[warp], ids_s[warp]);
}

// router_kernel after a gate GEMM split over H (router_gate_gemm.cu): each token's logits are the
// sum of its splits' partials parts [splits][T][E], always in the order s = 0, 1, ... (the same
// bits on every run); written to gate_logits, then routed from shared memory.
__global__ void __launch_bounds__(kWarps * 32) route_sum_kernel(RouterParams p, const float* parts, int splits) {
  __shared__ float logit_s[kWarps][kMaxExperts];
  __shared__ float choice_s[kWarps][kMaxExperts];
  __shared__ float gscore_s[kWarps][kMaxGroups];
  __shared__ int ids_s[kWarps][kMaxTopK];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp, E = p.num_experts, TE = p.num_tokens * E;
  pdl_wait();
  pdl_trigger();
  if (t >= p.num_tokens) return;
  for (int64_t e = lane; e < E; e += 32) {
    const float* part = parts + t * E + e;
    float v = part[0];
#pragma unroll 8
    for (int s = 1; s < splits; ++s) v += part[s * TE];
    logit_s[warp][e] = v;
    p.gate_logits[t * E + e] = v;
  }
  __syncwarp();
  route_token(p, logit_s[warp], t, lane, choice_s[warp], gscore_s[warp], ids_s[warp]);
}

// Tickets of the fused gate + route kernel: the CTA that draws the last one routes, then puts the
// count back to 0 for the next launch (or graph replay). One per device: the backend issues every
// op on one stream, so two launches never overlap.
__device__ unsigned int g_gate_tickets = 0;

// Gate logits of expert e = blockIdx.x for the T tokens of chunk blockIdx.y (f32 weights and
// activations, lanes over H, then a block sum). kRoute (one chunk: decode): the last CTA to finish
// also routes every token from those logits, so a decode layer routes in one launch; before, a
// cuBLASLt f32 GEMM and the routing kernel took ~19 us. kNorm (with kRoute): the input is
// rms_norm(x + residual) ⊙ norm_weight, so the post-attention norm needs no launch of its own.
// Every CTA sums the squares of the (<= 8) rows of x + residual in the same pass that dots them
// with the gate row times norm_weight, then scales by 1/rms; it writes only its own slice of
// normed_x (x and residual are only read, so the CTAs never race).
template <int T, bool kRoute, bool kNorm = false>
__global__ void __launch_bounds__(kWarps * 32) gate_route_kernel(RouterParams p) {
  static_assert(kRoute || !kNorm, "the chunked gate reads a normalised x");
  __shared__ float part_s[kWarps][T];
  __shared__ float ss_s[kWarps][T];  // kNorm: per-warp sums of squares of x + residual
  __shared__ float inv_s[T];         // kNorm: 1 / rms of each token's x + residual
  __shared__ float logit_s[kWarps][kMaxExperts];
  __shared__ float choice_s[kWarps][kMaxExperts];
  __shared__ float gscore_s[kWarps][kMaxGroups];
  __shared__ int ids_s[kWarps][kMaxTopK];
  __shared__ bool last_s;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t e = blockIdx.x, E = p.num_experts, H = p.hidden;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * T;
  const int tokens = static_cast<int>(min(static_cast<int64_t>(T), p.num_tokens - t0));
  const float* x = p.x + t0 * H;
  const float* w = p.gate_weight + e * H;
  if (threadIdx.x == 0 && H % 4 == 0 && (reinterpret_cast<uintptr_t>(w) & 15) == 0)
    prefetch_l2(w, static_cast<uint32_t>(H * 4));  // the gate row is constant: fetch it early
  // Activations (x, residual) only from here on.
  pdl_wait();
  pdl_trigger();
  const float* res = kNorm && p.norm_residual ? p.norm_residual + t0 * H : nullptr;
  const bool nbf16 = p.norm_weight_dtype == DType::BF16;
  const bool vec = H % 4 == 0 && (reinterpret_cast<uintptr_t>(w) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(x) & 15) == 0 && (reinterpret_cast<uintptr_t>(res) & 15) == 0;
  // x + residual at 4 columns from c (vec) or at column c.
  auto in4 = [&](int t, int64_t c) {
    float4 b = __ldg(reinterpret_cast<const float4*>(x + t * H + c));
    if (kNorm && res) {
      const float4 r = __ldg(reinterpret_cast<const float4*>(res + t * H + c));
      b = make_float4(b.x + r.x, b.y + r.y, b.z + r.z, b.w + r.w);
    }
    return b;
  };
  auto in1 = [&](int t, int64_t c) {
    float b = x[t * H + c];
    if (kNorm && res) b += res[t * H + c];
    return b;
  };
  float acc[T], ss[T];  // ss (kNorm): sums of squares of x + residual, in the same pass
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = ss[t] = 0.0f;
  if (vec) {
    const float4* w4 = reinterpret_cast<const float4*>(w);
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < H / 4; i += kWarps * 32) {
      float4 a = __ldcs(w4 + i);
      if constexpr (kNorm) {  // the norm weight folded into the gate row
        a = make_float4(a.x * load_w(p.norm_weight, 4 * i, nbf16), a.y * load_w(p.norm_weight, 4 * i + 1, nbf16),
                        a.z * load_w(p.norm_weight, 4 * i + 2, nbf16), a.w * load_w(p.norm_weight, 4 * i + 3, nbf16));
      }
#pragma unroll
      for (int t = 0; t < T; ++t) {
        if (t >= tokens) break;
        const float4 b = in4(t, 4 * i);
        acc[t] += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
        if constexpr (kNorm) ss[t] += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < H; i += kWarps * 32) {
      const float wi = kNorm ? w[i] * load_w(p.norm_weight, i, nbf16) : w[i];
#pragma unroll
      for (int t = 0; t < T; ++t)
        if (t < tokens) {
          const float b = in1(t, i);
          acc[t] += wi * b;
          if constexpr (kNorm) ss[t] += b * b;
        }
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0) part_s[warp][t] = v;
    if constexpr (kNorm) {
      const float q = warp_sum(ss[t]);
      if (lane == 0) ss_s[warp][t] = q;
    }
  }
  __syncthreads();
  if (threadIdx.x < tokens) {
    float v = 0.0f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) v += part_s[k][threadIdx.x];
    if constexpr (kNorm) {
      float q = 0.0f;
#pragma unroll
      for (int k = 0; k < kWarps; ++k) q += ss_s[k][threadIdx.x];
      inv_s[threadIdx.x] = rsqrtf(q / static_cast<float>(H) + p.norm_eps);
      v *= inv_s[threadIdx.x];
    }
    p.gate_logits[(t0 + threadIdx.x) * E + e] = v;
  }
  if constexpr (kNorm) {
    __syncthreads();  // inv_s ready
    // This CTA's slice of the experts' input, each column written once across the grid.
    const int64_t slice = (H + gridDim.x - 1) / gridDim.x, c1 = min(H, (e + 1) * slice);
    for (int64_t c = e * slice + threadIdx.x; c < c1; c += kWarps * 32)
      for (int t = 0; t < tokens; ++t)
        p.normed_x[(t0 + t) * H + c] = load_w(p.norm_weight, c, nbf16) * (in1(t, c) * inv_s[t]);
  }
  if (!kRoute) return;
  __threadfence();  // this CTA's logits are visible device-wide before its ticket is
  __syncthreads();
  if (threadIdx.x == 0) last_s = atomicAdd(&g_gate_tickets, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last_s) return;
  if (threadIdx.x == 0) g_gate_tickets = 0;
  __threadfence();
  for (int t = warp; t < tokens; t += kWarps) {
    for (int64_t k = lane; k < E; k += 32) logit_s[warp][k] = __ldcg(p.gate_logits + t * E + k);  // L2: other CTAs
    __syncwarp();
    route_token(p, logit_s[warp], t, lane, choice_s[warp], gscore_s[warp], ids_s[warp]);
    __syncwarp();
  }
}

}  // namespace

void router(const RouterParams& p, cudaStream_t s) {
  KILN_REQUIRE(p.num_experts <= kMaxExperts && p.n_group <= kMaxGroups && p.top_k <= kMaxTopK,
               "router: " + std::to_string(p.num_experts) + " experts / " + std::to_string(p.n_group) +
                   " groups / top-" + std::to_string(p.top_k) + " exceed the kernel limits (512 / 64 / 16)");
  if (p.num_tokens == 0) return;
  KILN_REQUIRE(!p.x || (p.gate_weight && p.gate_logits && p.hidden > 0),
               "router: a fused gate needs its weight, output and width");
  const bool norm = p.x && p.norm_weight;
  KILN_REQUIRE(!norm || (p.normed_x && (p.norm_weight_dtype == DType::F32 || p.norm_weight_dtype == DType::BF16)),
               "router: a fused input norm needs its output and an f32 or bf16 weight");
  if (p.x && p.num_tokens <= kFusedGateTokens) {
    const dim3 grid(static_cast<unsigned>(p.num_experts));
    auto* kernel = norm ? (p.num_tokens == 1   ? gate_route_kernel<1, true, true>
                           : p.num_tokens == 2 ? gate_route_kernel<2, true, true>
                           : p.num_tokens <= 4 ? gate_route_kernel<4, true, true>
                                               : gate_route_kernel<kFusedGateTokens, true, true>)
                        : (p.num_tokens == 1   ? gate_route_kernel<1, true>
                           : p.num_tokens == 2 ? gate_route_kernel<2, true>
                           : p.num_tokens <= 4 ? gate_route_kernel<4, true>
                                               : gate_route_kernel<kFusedGateTokens, true>);
    launch_pdl(kernel, grid, dim3(kWarps * 32), 0, s, p);
  } else {
    RouterParams q = p;
    // More tokens: the rms_norm op writes normed_x, and the gate reads it as x.
    if (norm) {
      const int64_t T = p.num_tokens, H = p.hidden;
      RmsNormParams n{p.x, H, p.norm_weight, p.norm_weight_dtype, p.normed_x, H, T, H, p.norm_eps};
      n.residual = p.norm_residual;
      rms_norm(n, s);
      q.x = p.normed_x;
    }
    const float* parts = nullptr;  // [splits][T][E]: the gate GEMM's partial logits when it splits H
    int splits = 1;
    if (p.x) {
      if (p.num_tokens <= kChunkedGateTokens) {  // decode batches: weight rows from L2, tokens in chunks of 8
        const dim3 grid(static_cast<unsigned>(p.num_experts), blocks_for(p.num_tokens, kFusedGateTokens));
        launch_pdl(gate_route_kernel<kFusedGateTokens, false>, grid, dim3(kWarps * 32), 0, s, q);
      } else {  // prefill-sized: the 3xTF32 tensor-core GEMM (router_gate_gemm.cu)
        const int64_t T = p.num_tokens, E = p.num_experts;
        // The partials' scratch serves every call: on the one stream, a call's routing has read
        // them before the next call's GEMM writes. It grows only for a larger shape.
        static GrowOnlyScratch part_scratch;
        splits = router_detail::gate_gemm_splits(T, E, p.hidden);
        float* out = splits > 1 ? part_scratch.get<float>(static_cast<size_t>(splits * T * E)) : p.gate_logits;
        router_detail::gate_gemm(q.x, p.gate_weight, out, T, E, p.hidden, splits, s);
        if (splits > 1) parts = out;
      }
      q.logits = p.gate_logits;
    }
    const dim3 grid(blocks_for(p.num_tokens, kWarps));
    if (parts)
      launch_pdl(route_sum_kernel, grid, dim3(kWarps * 32), 0, s, q, parts, splits);
    else
      launch_pdl(router_kernel, grid, dim3(kWarps * 32), 0, s, q);
  }
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kiln::ops::cuda
