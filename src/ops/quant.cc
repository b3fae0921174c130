#include "ops/quant.h"

#include <cstring>
#include <vector>

#include "core/error.h"

namespace kiln::ops {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return a == 0 ? 0 : (a - 1) / b + 1;
}

float scale_at(const WeightScales& s, int64_t i) {
  if (s.dtype == DType::F32) {
    float v;
    std::memcpy(&v, static_cast<const char*>(s.data) + i * 4, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, static_cast<const char*>(s.data) + i * 2, 2);
  return bf16_to_f32(h);
}

}  // namespace

int64_t weight_row_elems(DType t, int64_t k) {
  return t == DType::I4X8 ? ceil_div(k, 8) : k;
}

int64_t weight_elems(DType t, int64_t n, int64_t k) {
  return n * weight_row_elems(t, k);
}

int64_t scale_elems(const WeightScales& s, int64_t n, int64_t k) {
  return s.quantized() ? ceil_div(n, s.block_n) * ceil_div(k, s.block_k) : 0;
}

void check_weight(const char* what, DType t, const WeightScales& s) {
  if (!s.quantized()) {
    KILN_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F8E4M3,
               "{}: weights of dtype {} need scales (plain weights are F32, BF16, F16 or F8_E4M3)", what,
               dtype_name(t));
    return;
  }
  KILN_CHECK(t == DType::F8E4M3 || t == DType::I4X8, "{}: scaled weights are F8_E4M3 or I4X8, got {}", what,
             dtype_name(t));
  KILN_CHECK(s.dtype == DType::F32 || s.dtype == DType::BF16, "{}: weight scales are F32 or BF16, got {}", what,
             dtype_name(s.dtype));
  KILN_CHECK(s.block_n > 0 && s.block_k > 0, "{}: scale blocks must be positive, got {} x {}", what, s.block_n,
             s.block_k);
}

void dequantize_rows(const void* w, DType t, const WeightScales& s, int64_t n, int64_t k, int64_t r0, int64_t rows,
                     float* out) {
  check_weight("dequantize", t, s);
  KILN_CHECK(r0 >= 0 && rows >= 0 && r0 + rows <= n, "dequantize: rows [{}, {}) outside a weight of {} rows", r0,
             r0 + rows, n);
  const int64_t row_elems = weight_row_elems(t, k);
  const char* base = static_cast<const char*>(w) + static_cast<size_t>(r0 * row_elems) * dtype_size(t);
  if (t == DType::I4X8) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < k; ++c) {
        uint32_t word;
        std::memcpy(&word, base + static_cast<size_t>(r * row_elems + c / 8) * 4, 4);
        out[r * k + c] = static_cast<float>(int4_from_word(word, static_cast<int>(c % 8)));
      }
  } else {
    convert_to_f32(t, base, out, static_cast<size_t>(rows * k));
  }
  if (!s.quantized()) return;
  const int64_t grid_k = ceil_div(k, s.block_k);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t srow = (r0 + r) / s.block_n * grid_k;
    for (int64_t c = 0; c < k; ++c) out[r * k + c] *= scale_at(s, srow + c / s.block_k);
  }
}

}  // namespace kiln::ops
