// Decode-sized GEMVs (gemv.cu): y = x · wᵀ (+ add) for up to kGemvMaxRows rows of f32 activations
// over bf16 weights, every head of a LinearHeadsParams in one launch.
#pragma once

#include <cuda_runtime.h>

#include "ops/params.h"

namespace kiln::ops::cuda {

constexpr int kGemvMaxRows = 8;

// p with its strides resolved (x_stride and y_stride set); add laid out as y (null: none). x is
// never rounded to bf16 alone: f32 on CUDA cores (one row), bf16 hi + lo on tensor cores (2-8 rows,
// ~16 mantissa bits), whatever the backend's activation dtype.
void launch_gemv(const LinearHeadsParams& p, const float* add, cudaStream_t s);

// Backend::heads_then_linear in one launch (heads_linear.cu) when it fits: one row, bf16 weights,
// heads.y the dense input of proj (proj.y must not overlap it), a CTA's rows of both and proj's x
// in 48 KB, the grid resident at once. launch_heads_linear requires heads_linear_fits.
bool heads_linear_fits(const LinearHeadsParams& heads, const LinearParams& proj);
void launch_heads_linear(const LinearHeadsParams& heads, const LinearParams& proj, cudaStream_t s);

}  // namespace kiln::ops::cuda
