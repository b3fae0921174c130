// The router's prefill-sized gate projection (router_gate_gemm.cu), called by router.cu for more than
// 256 tokens.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::ops::cuda::router_detail {

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

}  // namespace kiln::ops::cuda::router_detail
