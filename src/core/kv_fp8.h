// The FP8 latent KV row (`--kv-cache-dtype fp8_e4m3`): FlashMLA's per-token layout for
// DeepSeek-V3.2, so a CUDA kernel can later read the same bytes FlashMLA reads. Per token per layer:
//   [0, kv_lora)                       c_kv as fp8 e4m3 (OCP e4m3fn), one byte a value
//   [scale_off, scale_off + 4 * tiles) one f32 scale per tile of 128 c_kv values (the last tile
//                                      may be shorter when kv_lora is not a multiple of 128)
//   [rope_off, rope_off + 2 * rope)    k_pe in bf16, not quantized: it is small (64 of 576
//                                      values) and carries the position, which rounding would blur
// padded to a multiple of 16 bytes (vector loads). kv_lora 512, rope 64: 512 + 16 + 128 = 656
// bytes, no padding, against 1,152 in bf16 (0.57x).
// Quantizing a tile: scale = absmax / 448 (f32), q = e4m3(x / scale), rounding to nearest even
// and saturating at ±448; a tile of zeros stores scale 0 and zeros. Reading: q * scale in f32,
// the same product on every read path, so the prefill and decode forms see identical values.
#pragma once

#include <cstdint>

namespace kiln {

constexpr int64_t kKvFp8Tile = 128;  // c_kv values per scale (FlashMLA's tile)
constexpr float kFp8E4M3Max = 448.0f;

struct KvFp8Layout {
  int64_t kv_lora = 0, rope = 0;
  int64_t tiles = 0;      // ceil(kv_lora / 128) scales
  int64_t scale_off = 0;  // byte offset of the f32 scales (4-aligned)
  int64_t rope_off = 0;   // byte offset of the bf16 k_pe
  int64_t row_bytes = 0;  // the whole row, padding included: what one token of one layer costs
};

constexpr KvFp8Layout kv_fp8_layout(int64_t kv_lora, int64_t rope) {
  KvFp8Layout l;
  l.kv_lora = kv_lora;
  l.rope = rope;
  l.tiles = (kv_lora + kKvFp8Tile - 1) / kKvFp8Tile;
  l.scale_off = (kv_lora + 3) / 4 * 4;
  l.rope_off = l.scale_off + 4 * l.tiles;
  l.row_bytes = (l.rope_off + 2 * rope + 15) / 16 * 16;
  return l;
}

// One latent row: src [kv_lora + rope] f32 (c_kv ‖ k_pe) into dst [row_bytes].
void kv_fp8_quantize_row(const KvFp8Layout& l, const float* src, uint8_t* dst);
// The stored row back to f32: dst [kv_lora + rope] (c_kv ‖ k_pe), exactly what every read sees.
void kv_fp8_dequantize_row(const KvFp8Layout& l, const uint8_t* src, float* dst);

}  // namespace kiln
