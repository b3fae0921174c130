// Grouped top-k routing on the GPU: one warp per token runs exactly the reference's steps
// (sigmoid in f32, bias for choice only, groups by their top-2 sum, dropped groups at 0.0,
// lower index first on ties), so CPU and GPU choose the same experts. A warp, not a thread, per
// token: decode steps route one token, and a lone thread walking 64-512 experts out of local
// memory took ~80 us per layer.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace kiln::ops::cuda {
namespace {

constexpr int kMaxExperts = 512;
constexpr int kMaxGroups = 64;
constexpr int kMaxTopK = 16;
constexpr int kWarps = 4;  // tokens per CTA

// The better of two (value, index) candidates: higher value, lower index on ties.
__device__ __forceinline__ void warp_best(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) v = ov, i = oi;
  }
}

__global__ void __launch_bounds__(kWarps * 32) router_kernel(RouterParams p) {
  __shared__ float choice_s[kWarps][kMaxExperts];
  __shared__ float gscore_s[kWarps][kMaxGroups];
  __shared__ int ids_s[kWarps][kMaxTopK];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (t >= p.num_tokens) return;
  const int E = static_cast<int>(p.num_experts), G = static_cast<int>(p.n_group), per = E / G;
  const float* logits = p.logits + t * E;
  float* choice = choice_s[warp];
  float* gscore = gscore_s[warp];
  for (int e = lane; e < E; e += 32) choice[e] = 1.0f / (1.0f + expf(-logits[e])) + p.bias[e];
  __syncwarp();
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
  // Keep the topk_group best groups; mark kept ones by moving their score to -inf afterwards.
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
  for (int64_t j = 0; j < p.top_k; ++j) {
    float v = -INFINITY;
    int i = -1;
    for (int e = lane; e < E; e += 32)
      if (i < 0 || choice[e] > v) v = choice[e], i = e;
    warp_best(v, i);
    if (lane == 0) {
      ids_s[warp][j] = i;
      choice[i] = -INFINITY;  // taken
    }
    __syncwarp();
  }
  if (lane != 0) return;
  float denom = 0.0f;  // in the reference's order
  for (int64_t j = 0; j < p.top_k; ++j) denom += 1.0f / (1.0f + expf(-logits[ids_s[warp][j]]));
  for (int64_t j = 0; j < p.top_k; ++j) {
    float w = 1.0f / (1.0f + expf(-logits[ids_s[warp][j]]));
    if (p.norm_topk_prob) w /= (denom + 1e-20f);
    p.topk_ids[t * p.top_k + j] = ids_s[warp][j];
    p.topk_weights[t * p.top_k + j] = w * p.routed_scaling_factor;
  }
}

}  // namespace

void router(const RouterParams& p, cudaStream_t s) {
  KILN_REQUIRE(p.num_experts <= kMaxExperts && p.n_group <= kMaxGroups && p.top_k <= kMaxTopK,
               "router: " + std::to_string(p.num_experts) + " experts / " + std::to_string(p.n_group) +
                   " groups / top-" + std::to_string(p.top_k) + " exceed the kernel limits (512 / 64 / 16)");
  if (p.num_tokens) router_kernel<<<blocks_for(p.num_tokens, kWarps), kWarps * 32, 0, s>>>(p);
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kiln::ops::cuda
