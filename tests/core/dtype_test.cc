#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kiln {

TEST(DType, Bf16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_bf16(f), h) << h;
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), f32_to_bf16(1.0f));               // tie -> even (down)
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);  // tie -> even (up)
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256 + 1e-6f)), 1.0f + 2.0f / 256);
}

TEST(DType, F16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), h) << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
}

TEST(DType, Fp8E4m3RoundTripsEveryValue) {
  for (uint32_t v = 0; v < 256; ++v) {
    float f = fp8e4m3_to_f32(static_cast<uint8_t>(v));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_fp8e4m3(f), v) << v;
  }
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8e4m3_to_f32(0x38), 1.0f);
  EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0x7f)));
  EXPECT_EQ(f32_to_fp8e4m3(1000.0f), 0x7e);  // saturates: e4m3fn has no infinity
  EXPECT_EQ(f32_to_fp8e4m3(-1000.0f), 0xfe);
}

TEST(DType, Fp8RoundsToNearest) {
  // Between 1.0 (0x38) and 1.125 (0x39): 1.06 goes down, 1.07 goes up, the tie 1.0625 to even.
  EXPECT_EQ(f32_to_fp8e4m3(1.06f), 0x38);
  EXPECT_EQ(f32_to_fp8e4m3(1.07f), 0x39);
  EXPECT_EQ(f32_to_fp8e4m3(1.0625f), 0x38);
}

TEST(DType, SafetensorsNames) {
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3"), DType::F8E4M3);
  EXPECT_EQ(dtype_from_safetensors("BF16"), DType::BF16);
  EXPECT_THROW(dtype_from_safetensors("F4"), std::exception);
}

}  // namespace kiln
