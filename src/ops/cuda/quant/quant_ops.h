// The CUDA backend's ops on quantized weights (params.h WeightScales: FP8 e4m3 block-scaled, INT4
// pack-quantized), each checked against the CPU dequantize-then-compute reference
// (tests/ops/quant_parity_test.cc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/cuda_ops.h"
#include "ops/params.h"

namespace kiln::ops::cuda {

// Whether an op's weights need these paths (anything but plain bf16 / f32 weights).
bool linear_quantized(const LinearParams& p);
bool linear_heads_quantized(const LinearHeadsParams& p);
bool moe_quantized(const MoeParams& p);

// Up to quant_gemv_max_rows() rows: decode GEMVs reading the quantized weights (8 rows a launch;
// an input norm runs first as its own kernel); more: the weight dequantized to bf16 scratch, then
// Gemm's bf16 path (its norm and addend handling included).
void quant_linear(const LinearParams& p, Gemm& gemm, cudaStream_t s);
void quant_linear_heads(const LinearHeadsParams& p, Gemm& gemm, cudaStream_t s);
// Up to quant_moe_gemv_max_tokens() tokens: two decode launches (gate/up + SwiGLU, down + combine)
// reading the quantized experts; more: the experts dequantized to bf16 scratch, then moe().
void quant_moe(const MoeParams& p, Gemm& gemm, cudaStream_t s);
int64_t quant_gemv_max_rows();
int64_t quant_moe_gemv_max_tokens();

}  // namespace kiln::ops::cuda
