// Quantized weights for the tests: host quantizers producing the formats params.h's WeightScales
// describes (FP8 e4m3 in blocks with f32 scales as DeepSeek-V3 ships them; INT4 pack-quantized
// words with bf16 group scales as compressed-tensors writes them), and an independent decoder
// written from the format descriptions (not from ops/quant.cc) to check the reference against.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace kiln::test {

inline int64_t cdiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

struct QuantWeight {
  std::vector<uint8_t> fp8;           // F8E4M3: [n, k] codes
  std::vector<uint32_t> words;        // I4X8: [n, ceil(k / 8)] words
  std::vector<float> scales;          // [ceil(n / bn), ceil(k / bk)] (f32 copies of what is stored)
  std::vector<uint16_t> scales_bf16;  // the same, as bf16 bits (INT4 stores these)
  std::vector<float> dequant;         // [n, k]: the exact values the quantized weight stands for
};

// DeepSeek-V3 style: scale = amax / 448 per block, codes = e4m3(w / scale).
inline QuantWeight quantize_fp8(const std::vector<float>& w, int64_t n, int64_t k, int64_t bn, int64_t bk) {
  QuantWeight q;
  const int64_t gn = cdiv(n, bn), gk = cdiv(k, bk);
  q.scales.assign(static_cast<size_t>(gn * gk), 1.0f);
  for (int64_t bi = 0; bi < gn; ++bi)
    for (int64_t bj = 0; bj < gk; ++bj) {
      float amax = 0;
      for (int64_t r = bi * bn; r < std::min(n, (bi + 1) * bn); ++r)
        for (int64_t c = bj * bk; c < std::min(k, (bj + 1) * bk); ++c)
          amax = std::max(amax, std::fabs(w[static_cast<size_t>(r * k + c)]));
      q.scales[static_cast<size_t>(bi * gk + bj)] = amax > 0 ? amax / 448.0f : 1.0f;
    }
  q.fp8.resize(static_cast<size_t>(n * k));
  q.dequant.resize(q.fp8.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const float s = q.scales[static_cast<size_t>(r / bn * gk + c / bk)];
      const uint8_t code = f32_to_fp8e4m3(w[static_cast<size_t>(r * k + c)] / s);
      q.fp8[static_cast<size_t>(r * k + c)] = code;
      q.dequant[static_cast<size_t>(r * k + c)] = fp8e4m3_to_f32(code) * s;
    }
  return q;
}

// compressed-tensors pack-quantized, symmetric: per row and group of g along k a bf16 scale
// amax / 7, q = clamp(round(w / scale), -8, 7), stored as q + 8 in nibble c % 8 (bits 4j up) of
// word c / 8; a row's last word is padded with zero nibbles.
inline QuantWeight quantize_int4(const std::vector<float>& w, int64_t n, int64_t k, int64_t g) {
  QuantWeight q;
  const int64_t gk = cdiv(k, g), wk = cdiv(k, 8);
  q.scales.resize(static_cast<size_t>(n * gk));
  q.scales_bf16.resize(q.scales.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < gk; ++j) {
      float amax = 0;
      for (int64_t c = j * g; c < std::min(k, (j + 1) * g); ++c)
        amax = std::max(amax, std::fabs(w[static_cast<size_t>(r * k + c)]));
      const uint16_t h = f32_to_bf16(amax > 0 ? amax / 7.0f : 1.0f);
      q.scales_bf16[static_cast<size_t>(r * gk + j)] = h;
      q.scales[static_cast<size_t>(r * gk + j)] = bf16_to_f32(h);
    }
  q.words.assign(static_cast<size_t>(n * wk), 0u);
  q.dequant.resize(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const float s = q.scales[static_cast<size_t>(r * gk + c / g)];
      const int v = static_cast<int>(std::clamp(std::nearbyint(w[static_cast<size_t>(r * k + c)] / s), -8.0f, 7.0f));
      q.words[static_cast<size_t>(r * wk + c / 8)] |= static_cast<uint32_t>(v + 8) << (4 * (c % 8));
      q.dequant[static_cast<size_t>(r * k + c)] = static_cast<float>(v) * s;
    }
  return q;
}

}  // namespace kiln::test
