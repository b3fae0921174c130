// Grouped top-k routing on the GPU: one thread per token runs exactly the reference's steps
// (sigmoid in f32, bias for choice only, groups by their top-2 sum, dropped groups at 0.0,
// lower index first on ties), so CPU and GPU choose the same experts.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace kiln::ops::cuda {
namespace {

constexpr int kMaxExperts = 512;
constexpr int kMaxGroups = 64;
constexpr int kMaxTopK = 16;

__global__ void router_kernel(RouterParams p) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= p.num_tokens) return;
  const int64_t E = p.num_experts, G = p.n_group, per = E / G;
  float choice[kMaxExperts];
  for (int64_t e = 0; e < E; ++e) choice[e] = 1.0f / (1.0f + expf(-p.logits[t * E + e])) + p.bias[e];
  float gscore[kMaxGroups];
  for (int64_t g = 0; g < G; ++g) {
    float b1 = -INFINITY, b2 = -INFINITY;
    for (int64_t e = g * per; e < (g + 1) * per; ++e) {
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
  bool keep[kMaxGroups];
  for (int64_t g = 0; g < G; ++g) keep[g] = false;
  for (int64_t i = 0; i < p.topk_group; ++i) {
    int64_t best = -1;
    for (int64_t g = 0; g < G; ++g)
      if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
    keep[best] = true;
  }
  for (int64_t e = 0; e < E; ++e)
    if (!keep[e / per]) choice[e] = 0.0f;
  int32_t ids[kMaxTopK];
  float denom = 0.0f;
  for (int64_t j = 0; j < p.top_k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken |= ids[i] == e;
      if (!taken && (best < 0 || choice[e] > choice[best])) best = e;
    }
    ids[j] = static_cast<int32_t>(best);
    denom += 1.0f / (1.0f + expf(-p.logits[t * E + best]));
  }
  for (int64_t j = 0; j < p.top_k; ++j) {
    float w = 1.0f / (1.0f + expf(-p.logits[t * E + ids[j]]));
    if (p.norm_topk_prob) w /= (denom + 1e-20f);
    p.topk_ids[t * p.top_k + j] = ids[j];
    p.topk_weights[t * p.top_k + j] = w * p.routed_scaling_factor;
  }
}

}  // namespace

void router(const RouterParams& p, cudaStream_t s) {
  KILN_REQUIRE(p.num_experts <= kMaxExperts && p.n_group <= kMaxGroups && p.top_k <= kMaxTopK,
               "router: " + std::to_string(p.num_experts) + " experts / " + std::to_string(p.n_group) +
                   " groups / top-" + std::to_string(p.top_k) + " exceed the kernel limits (512 / 64 / 16)");
  if (p.num_tokens) router_kernel<<<blocks_for(p.num_tokens, 64), 64, 0, s>>>(p);
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kiln::ops::cuda
