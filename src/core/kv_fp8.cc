#include "core/kv_fp8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace kiln {
namespace {

// Every e4m3 byte widened once: reads widen whole contexts per step on the CPU reference.
const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int i = 0; i < 256; ++i) a[static_cast<size_t>(i)] = fp8e4m3_to_f32(static_cast<uint8_t>(i));
    return a;
  }();
  return t;
}

}  // namespace

void kv_fp8_quantize_row(const KvFp8Layout& l, const float* src, uint8_t* dst) {
  std::memset(dst, 0, static_cast<size_t>(l.row_bytes));  // padding stays zero: rows compare bytewise
  for (int64_t t = 0; t < l.tiles; ++t) {
    const int64_t d0 = t * kKvFp8Tile, d1 = std::min(l.kv_lora, d0 + kKvFp8Tile);
    float amax = 0;
    for (int64_t d = d0; d < d1; ++d) amax = std::max(amax, std::fabs(src[d]));
    // absmax / 448 maps the tile's largest value onto e4m3's largest; a zero tile keeps scale 0
    // (0 / 0 would be NaN). x / scale may round a hair past 448: f32_to_fp8e4m3 saturates.
    const float scale = amax / kFp8E4M3Max;
    for (int64_t d = d0; d < d1; ++d) dst[d] = scale > 0 ? f32_to_fp8e4m3(src[d] / scale) : 0;
    std::memcpy(dst + l.scale_off + 4 * t, &scale, 4);
  }
  for (int64_t d = 0; d < l.rope; ++d) {
    const uint16_t h = f32_to_bf16(src[l.kv_lora + d]);
    std::memcpy(dst + l.rope_off + 2 * d, &h, 2);
  }
}

void kv_fp8_dequantize_row(const KvFp8Layout& l, const uint8_t* src, float* dst) {
  const std::array<float, 256>& fp8 = fp8_table();
  for (int64_t t = 0; t < l.tiles; ++t) {
    float scale;
    std::memcpy(&scale, src + l.scale_off + 4 * t, 4);
    const int64_t d0 = t * kKvFp8Tile, d1 = std::min(l.kv_lora, d0 + kKvFp8Tile);
    for (int64_t d = d0; d < d1; ++d) dst[d] = fp8[src[d]] * scale;
  }
  for (int64_t d = 0; d < l.rope; ++d) {
    uint16_t h;
    std::memcpy(&h, src + l.rope_off + 2 * d, 2);
    dst[l.kv_lora + d] = bf16_to_f32(h);
  }
}

}  // namespace kiln
