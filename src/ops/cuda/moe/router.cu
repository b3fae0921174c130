// Grouped top-k routing on the GPU: one warp per token runs exactly the reference's steps
// (sigmoid in f32, bias for choice only, groups by their top-2 sum, dropped groups at 0.0,
// lower index first on ties), so CPU and GPU choose the same experts. A warp, not a thread, per
// token: decode steps route one token, and a lone thread walking 64-512 experts out of local
// memory took ~80 us per layer. The gate projection x · Wᵀ rides in the same op: up to 8 tokens in
// the routing launch itself (one thread-block cluster, router_decode.cu), per-expert CTAs up to
// 256, beyond that the tensor-core GEMM of router_gate_gemm.cu.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/moe/router_internal.cuh"
#include "ops/cuda/pdl.cuh"

namespace kiln::ops::cuda {
namespace {

using router_detail::kMaxExperts;
using router_detail::kMaxGroups;
using router_detail::kMaxTopK;
using router_detail::route_token;
constexpr int kWarps = 4;                // tokens per CTA (routing), warps per expert (gate)
constexpr int kGateChunk = 8;            // tokens per CTA of the decode-batch gate
constexpr int kChunkedGateTokens = 256;  // up to here per-expert CTAs over 8-token chunks, then a tiled GEMM

__global__ void __launch_bounds__(kWarps * 32) router_kernel(RouterParams p) {
  __shared__ float choice_s[kWarps][kMaxExperts];
  __shared__ float gscore_s[kWarps][kMaxGroups];
  __shared__ int ids_s[kWarps][kMaxTopK];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  pdl_wait();
  pdl_trigger();
  if (t >= p.num_tokens) return;
  route_token(p, p.logits + t * p.num_experts, p.bias, t, lane, choice_s[warp], gscore_s[warp], ids_s[warp]);
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
  route_token(p, logit_s[warp], p.bias, t, lane, choice_s[warp], gscore_s[warp], ids_s[warp]);
}

// Gate logits of expert e = blockIdx.x for the T tokens of chunk blockIdx.y (decode batches of 9 to
// 256 tokens; f32 weights and activations, lanes over H, then a block sum). The weight row comes
// from L2 for every chunk after the first.
template <int T>
__global__ void __launch_bounds__(kWarps * 32) gate_kernel(RouterParams p) {
  __shared__ float part_s[kWarps][T];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t e = blockIdx.x, E = p.num_experts, H = p.hidden;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * T;
  const int tokens = static_cast<int>(min(static_cast<int64_t>(T), p.num_tokens - t0));
  const float* x = p.x + t0 * H;
  const float* w = p.gate_weight + e * H;
  if (threadIdx.x == 0 && H % 4 == 0 && aligned16(w))
    prefetch_l2(w, static_cast<uint32_t>(H * 4));  // the gate row is constant: fetch it early
  // Activations only from here on.
  pdl_wait();
  pdl_trigger();
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  if (H % 4 == 0 && aligned16(w) && aligned16(x)) {
    const float4* w4 = reinterpret_cast<const float4*>(w);
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < H / 4; i += kWarps * 32) {
      const float4 a = __ldcs(w4 + i);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        if (t >= tokens) break;
        const float4 b = __ldg(reinterpret_cast<const float4*>(x + t * H) + i);
        acc[t] += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < H; i += kWarps * 32) {
#pragma unroll
      for (int t = 0; t < T; ++t)
        if (t < tokens) acc[t] += w[i] * x[t * H + i];
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0) part_s[warp][t] = v;
  }
  __syncthreads();
  if (threadIdx.x < tokens) {
    float v = 0.0f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) v += part_s[k][threadIdx.x];
    p.gate_logits[(t0 + threadIdx.x) * E + e] = v;
  }
}

__global__ void stand_in_kernel(RouterParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t slots = p.num_tokens * p.top_k;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < slots;
       i += gridDim.x * static_cast<int64_t>(blockDim.x)) {
    p.topk_ids[i] = static_cast<int32_t>(i % p.num_experts);
    p.topk_weights[i] = 1.0f / static_cast<float>(p.top_k);
  }
}

}  // namespace

void router_stand_in(const RouterParams& p, cudaStream_t s) {
  const int64_t slots = p.num_tokens * p.top_k;
  if (slots > 0) launch_pdl(stand_in_kernel, dim3(blocks_for(slots, 256)), dim3(256), 0, s, p);
}

void router(const RouterParams& p, cudaStream_t s) {
  KILN_REQUIRE(p.num_experts <= kMaxExperts && p.n_group <= kMaxGroups && p.top_k <= kMaxTopK,
               "router: " + std::to_string(p.num_experts) + " experts / " + std::to_string(p.n_group) +
                   " groups / top-" + std::to_string(p.top_k) + " exceed the kernel limits (512 / 64 / 16)");
  KILN_REQUIRE(p.n_group > 0 && p.num_experts % p.n_group == 0 && p.topk_group <= p.n_group &&
                   p.top_k <= p.topk_group * (p.num_experts / p.n_group),
               "router: " + std::to_string(p.num_experts) + " experts cannot be split into " +
                   std::to_string(p.n_group) + " groups keeping " + std::to_string(p.topk_group) + " for top-" +
                   std::to_string(p.top_k));
  if (p.num_tokens == 0) return;
  KILN_REQUIRE(!p.x || (p.gate_weight && p.gate_logits && p.hidden > 0),
               "router: a fused gate needs its weight, output and width");
  const bool norm = p.x && p.norm_weight;
  KILN_REQUIRE(!norm || (p.normed_x && (p.norm_weight_dtype == DType::F32 || p.norm_weight_dtype == DType::BF16)),
               "router: a fused input norm needs its output and an f32 or bf16 weight");
  if (p.x && p.num_tokens <= router_detail::kDecodeTokens) {
    router_detail::decode_gate_route(p, s);
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
        const dim3 grid(static_cast<unsigned>(p.num_experts), blocks_for(p.num_tokens, kGateChunk));
        launch_pdl(gate_kernel<kGateChunk>, grid, dim3(kWarps * 32), 0, s, q);
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
