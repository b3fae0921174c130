#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace kiln {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::F8E4M3: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
    case DType::I4X8: return 4;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F8E4M3: return "F8_E4M3";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::I4X8: return "I4X8";
  }
  return "?";
}

DType dtype_from_safetensors(const std::string& s) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "F8_E4M3") return DType::F8E4M3;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "U8") return DType::U8;
  fail("unsupported dtype \"{}\" (supported: F32, F16, BF16, F8_E4M3, I32, I64, U8)", s);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);  // subnormal (or zero)
  } else if (exp == 31) {
    v = man ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t b = bits_from_f32(f);
  uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;     // rounds to infinity
  if (a < 6.103515625e-05f) {                   // subnormal range: multiples of 2^-24
    float q = std::nearbyint(a * 16777216.0f);  // default rounding mode: nearest even
    return sign | static_cast<uint16_t>(q);
  }
  int e;
  float m = std::frexp(a, &e);                       // a = m * 2^e, m in [0.5, 1)
  float scaled = std::nearbyint(std::ldexp(m, 11));  // 11 significant bits
  if (scaled >= 2048.0f) {
    scaled /= 2.0f;
    ++e;
  }
  uint32_t exp = static_cast<uint32_t>(e - 1 + 15);
  if (exp >= 31) return sign | 0x7c00u;
  return sign | static_cast<uint16_t>((exp << 10) | (static_cast<uint32_t>(scaled) & 0x3ffu));
}

// e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no infinity, S.1111.111 is NaN, max 448.
float fp8e4m3_to_f32(uint8_t v) {
  uint32_t sign = v >> 7, exp = (v >> 3) & 0xfu, man = v & 0x7u;
  float r;
  if (exp == 15 && man == 7) {
    r = NAN;
  } else if (exp == 0) {
    r = std::ldexp(static_cast<float>(man), -9);
  } else {
    r = std::ldexp(static_cast<float>(man | 8u), static_cast<int>(exp) - 10);
  }
  return sign ? -r : r;
}

uint8_t f32_to_fp8e4m3(float f) {
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return sign | 0x7f;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate to max finite
  if (a < 0.015625f) {                  // subnormal: multiples of 2^-9
    float q = std::nearbyint(a * 512.0f);
    return sign | static_cast<uint8_t>(q);  // q == 8 becomes the smallest normal, which is right
  }
  int e;
  float m = std::frexp(a, &e);
  float scaled = std::nearbyint(std::ldexp(m, 4));  // 4 significant bits
  if (scaled >= 16.0f) {
    scaled /= 2.0f;
    ++e;
  }
  int exp = e - 1 + 7;
  if (exp > 15 || (exp == 15 && (static_cast<int>(scaled) & 7) == 7)) return sign | 0x7e;
  return sign | static_cast<uint8_t>((exp << 3) | (static_cast<int>(scaled) & 7));
}

void convert_to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    // Checkpoint data need not be 2-byte aligned (safetensors headers have any length): load
    // through memcpy, which compiles to plain loads where alignment allows.
    case DType::BF16: {
      auto* s = static_cast<const unsigned char*>(src);
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    }
    case DType::F16: {
      auto* s = static_cast<const unsigned char*>(src);
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
      return;
    }
    case DType::F8E4M3: {
      auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = fp8e4m3_to_f32(s[i]);
      return;
    }
    default: fail("cannot convert {} to F32", dtype_name(t));
  }
}

}  // namespace kiln
