// Pieces of the router op (router.cu) shared by its files: the decode router on one thread-block
// cluster (router_decode.cu), the prefill-sized gate projection (router_gate_gemm.cu, more than 256
// tokens) and the per-token routing every path ends with.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/params.h"

namespace kiln::ops::cuda::router_detail {

constexpr int kMaxExperts = 512;  // <= 32 x 32: route_token's per-lane taken mask
constexpr int kMaxGroups = 64;
constexpr int kMaxTopK = 16;
// Up to this many experts route_token ranks every expert at once; more take top_k rounds.
constexpr int kRankExperts = 128;

// Up to this many tokens the gate projection, the fused input norm and the routing run in one launch
// (router_decode.cu).
constexpr int kDecodeTokens = 8;
// gate_logits, normed_x (with a norm weight), topk_ids and topk_weights of p.num_tokens <=
// kDecodeTokens tokens from p.x (RouterParams's fused-gate form); no host sync.
void decode_gate_route(const RouterParams& p, cudaStream_t s);

// How many slices of H the gate GEMM of a [T, H] x [E, H]ᵀ product splits into (1: none): enough
// CTAs to fill the device, few enough to keep the partials small. Depends only on the shape and
// the device's SM count, so a shape always sums the same partials in the same order: runs repeat
// bit for bit, but a token's logits may differ in the last bits between batch sizes (the SIMT GEMM
// before this was batch-invariant above 256 tokens); nothing here relies on batch invariance.
int gate_gemm_splits(int64_t T, int64_t E, int64_t H);

// out [splits][T][E] (f32): slice s of the gate logits x [T, H] · w [E, H]ᵀ, i.e. the dot products over
// slice s of H's 32-wide k steps (gate_gemm_splits' count, ceil(H / 32 / splits) steps a slice);
// with splits = 1, out is the logits themselves. Summing the slices in order s = 0, 1, ... gives the
// logits at ~f32 accuracy (3xTF32 tensor-core MMAs). x and w are only read; no host sync.
void gate_gemm(const float* x, const float* w, float* out, int64_t T, int64_t E, int64_t H, int splits, cudaStream_t s);

// The expert score, sigmoid(logit), in one form for every routing path (the same bits).
__device__ __forceinline__ float expert_sigmoid(float logit) {
  return 1.0f / (1.0f + expf(-logit));
}

// The better of two (value, index) candidates: higher value, lower index on ties.
__device__ __forceinline__ void warp_best(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) v = ov, i = oi;
  }
}

// The score each expert is chosen by, with one warp: choice[e] = sigmoid(logits[e]) + bias[e], the
// experts of dropped groups at 0.0 (as the reference). logits and bias (p.bias or a copy of it)
// in shared or global memory; choice [E] and gscore [G] are the warp's own shared scratch.
__device__ inline void route_choice(const RouterParams& p, const float* logits, const float* bias, int lane,
                                    float* choice, float* gscore) {
  const int E = static_cast<int>(p.num_experts), G = static_cast<int>(p.n_group), per = E / G;
  for (int e = lane; e < E; e += 32) {
    const float c = expert_sigmoid(logits[e]) + bias[e];
    choice[e] = c == c ? c : -INFINITY;  // NaN counts as -inf: the choice below stays a total order
  }
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
}

// The weight of a chosen expert from its logit; denom: the sum of the chosen experts' sigmoids in
// choice order (the reference's order).
__device__ __forceinline__ float route_weight(const RouterParams& p, float sig, float denom) {
  return (p.norm_topk_prob ? sig / (denom + 1e-20f) : sig) * p.routed_scaling_factor;
}

// Routes token t from its logits row with one warp (route_choice's arguments); every lane returns
// and lanes below top_k write the token's ids and weights; ids [top_k] is the warp's own scratch.
__device__ inline void route_token(const RouterParams& p, const float* logits, const float* bias, int64_t t, int lane,
                                   float* choice, float* gscore, int* ids) {
  route_choice(p, logits, bias, lane, choice, gscore);
  const int E = static_cast<int>(p.num_experts), k = static_cast<int>(p.top_k);
  if (E <= kRankExperts) {
    // Each expert's rank in the order (choice descending, index ascending on ties): the experts
    // ranked below k are those the k rounds below pick, in the same order, but every lane ranks its
    // experts at once instead of one round at a time (single stream, H200 kernel trace: the routing
    // phase of the decode router went from 5.5 to 4.7 us).
    for (int e = lane; e < E; e += 32) {
      const float v = choice[e];
      int rank = 0;
#pragma unroll 8
      for (int f = 0; f < E; ++f) {
        const float w = choice[f];
        rank += w > v || (w == v && f < e);
      }
      if (rank < k) ids[rank] = e;
    }
  } else {
    // Taken experts are marked in their lane's mask (bit n: expert lane + 32 n), not by a -inf
    // score, which real scores may also hold.
    uint32_t taken = 0;
    for (int j = 0; j < k; ++j) {
      float v = -INFINITY;
      int i = -1;
      for (int e = lane, n = 0; e < E; e += 32, ++n)
        if (!((taken >> n) & 1) && (i < 0 || choice[e] > v)) v = choice[e], i = e;
      warp_best(v, i);
      if (lane == 0) ids[j] = i;
      if (i % 32 == lane) taken |= 1u << (i / 32);
    }
  }
  __syncwarp();
  // Lane j < k takes choice j; the normaliser sums them in choice order, as the reference does.
  const float s = lane < k ? expert_sigmoid(logits[ids[lane]]) : 0.0f;
  float denom = 0.0f;
  for (int j = 0; j < k; ++j) denom += __shfl_sync(0xffffffffu, s, j);
  if (lane < k) {
    p.topk_ids[t * k + lane] = ids[lane];
    p.topk_weights[t * k + lane] = route_weight(p, s, denom);
  }
}

}  // namespace kiln::ops::cuda::router_detail
