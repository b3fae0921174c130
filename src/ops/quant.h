// Host dequantization of the quantized weights params.h's WeightScales describes: the exact f32
// values every backend's quantized path is checked against (the CPU reference computes on them).
#pragma once

#include <cstdint>

#include "ops/params.h"

namespace kiln::ops {

// Row stride of an [n, k] weight of dtype t in elements of t (I4X8: ceil(k / 8) words).
int64_t weight_row_elems(DType t, int64_t k);
// Elements of t an [n, k] weight holds (n rows of weight_row_elems).
int64_t weight_elems(DType t, int64_t n, int64_t k);
// Elements of s.dtype in the scale grid of an [n, k] weight: ceil(n / block_n) * ceil(k / block_k).
int64_t scale_elems(const WeightScales& s, int64_t n, int64_t k);

// Checks that (t, s) is a weight the ops take (plain F32/BF16/F16/F8E4M3, F8E4M3 + scales, I4X8 +
// scales; scales F32 or BF16 with positive blocks); throws naming `what` otherwise.
void check_weight(const char* what, DType t, const WeightScales& s);

// Rows [r0, r0 + rows) of the [n, k] weight w (dtype t, scales s: none for plain weights) as f32,
// exactly: out [rows, k] row-major.
void dequantize_rows(const void* w, DType t, const WeightScales& s, int64_t n, int64_t k, int64_t r0, int64_t rows,
                     float* out);

}  // namespace kiln::ops
