// Element types and exact scalar conversions. bf16, f16 and fp8 e4m3 widen to f32 exactly;
// narrowing rounds to nearest even (fp8 saturates to ±448, as the e4m3fn format has no infinity).
// I4X8 is a storage type of its own: one element is a 32-bit word of eight 4-bit weights
// (compressed-tensors pack-quantized; ops/params.h WeightScales says how they decode).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace kiln {

enum class DType : uint8_t { F32, F16, BF16, F8E4M3, I32, I64, U8, I4X8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses safetensors spellings ("F32", "BF16", "F8_E4M3", ...); throws on an unknown one.
DType dtype_from_safetensors(const std::string& s);

inline float f32_from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t bits_from_f32(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

inline float bf16_to_f32(uint16_t h) {
  return f32_from_bits(static_cast<uint32_t>(h) << 16);
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t b = bits_from_f32(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40);  // quiet NaN
  b += 0x7fffu + ((b >> 16) & 1u);                                                      // round to nearest even
  return static_cast<uint16_t>(b >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float fp8e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8e4m3(float f);

// Value j (0..7) of an I4X8 word: bits 4j..4j+3 (the low nibble first), stored unsigned with an
// offset of 8, so the signed value is nibble - 8 in [-8, 7] (compressed-tensors pack_to_int32).
inline int int4_from_word(uint32_t word, int j) {
  return static_cast<int>((word >> (4 * j)) & 0xfu) - 8;
}

// Widens `n` elements of type `t` at `src` into f32.
void convert_to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace kiln
