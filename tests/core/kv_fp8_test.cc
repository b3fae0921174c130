// The FP8 latent KV row (core/kv_fp8.h): its layout's byte offsets and the quantize / dequantize
// round trip on values whose stored form is known exactly.
#include "core/kv_fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace kiln {
namespace {

float scale_of(const KvFp8Layout& l, const std::vector<uint8_t>& row, int64_t tile) {
  float s;
  std::memcpy(&s, row.data() + l.scale_off + 4 * tile, 4);
  return s;
}

// Quantizes `src` and returns the stored row; `back` gets what every read sees.
std::vector<uint8_t> round_trip(const KvFp8Layout& l, const std::vector<float>& src, std::vector<float>& back) {
  std::vector<uint8_t> row(static_cast<size_t>(l.row_bytes), 0xAB);
  kv_fp8_quantize_row(l, src.data(), row.data());
  back.assign(static_cast<size_t>(l.kv_lora + l.rope), NAN);
  kv_fp8_dequantize_row(l, row.data(), back.data());
  return row;
}

TEST(KvFp8, LayoutMatchesFlashMla) {
  // DeepSeek-V3 widths: FlashMLA's 656-byte token (512 e4m3 + 4 f32 scales + 64 bf16), no padding.
  constexpr KvFp8Layout v3 = kv_fp8_layout(512, 64);
  static_assert(v3.tiles == 4 && v3.scale_off == 512 && v3.rope_off == 528 && v3.row_bytes == 656);
  // Other widths: a short last tile, scales 4-aligned, rows padded to 16 bytes (counted).
  const KvFp8Layout a = kv_fp8_layout(128, 16);  // kiln-tiny
  EXPECT_EQ(a.tiles, 1);
  EXPECT_EQ(a.rope_off, 132);
  EXPECT_EQ(a.row_bytes, 176);  // 164 rounded up
  const KvFp8Layout b = kv_fp8_layout(200, 8);
  EXPECT_EQ(b.tiles, 2);
  EXPECT_EQ(b.scale_off, 200);
  EXPECT_EQ(b.rope_off, 208);
  EXPECT_EQ(b.row_bytes, 224);
  const KvFp8Layout c = kv_fp8_layout(30, 6);
  EXPECT_EQ(c.scale_off, 32);
  EXPECT_EQ(c.row_bytes, 48);  // 36 + 12 = 48
}

TEST(KvFp8, ExactValuesAndSubnormalsRoundTrip) {
  const KvFp8Layout l = kv_fp8_layout(128, 4);
  // absmax 448 gives scale 1, so the stored bytes are e4m3 of the values themselves.
  std::vector<float> src(132, 0.0f);
  src[0] = 448.0f;
  src[1] = -448.0f;
  src[2] = 1.0f;
  src[3] = -0.5f;
  src[4] = 240.0f;
  src[5] = std::ldexp(1.0f, -9);      // the smallest subnormal: byte 0x01
  src[6] = std::ldexp(7.0f, -9);      // the largest subnormal: byte 0x07
  src[7] = std::ldexp(1.0f, -10);     // half the smallest: ties to even, 0
  src[8] = std::ldexp(3.0f, -10);     // 1.5 subnormal steps: ties to even, 2 steps
  src[9] = std::ldexp(1.0f, -6);      // the smallest normal: byte 0x08
  src[10] = 1.0625f;                  // halfway between 1 and 1.125: ties to even, 1
  src[11] = 1.1875f;                  // halfway between 1.125 and 1.25: ties to even, 1.25
  src[128] = 0.1f, src[129] = -3.0f;  // k_pe: bf16, rounded to nearest even
  src[130] = 1e-20f, src[131] = 65504.0f;
  std::vector<float> back;
  const std::vector<uint8_t> row = round_trip(l, src, back);
  EXPECT_EQ(scale_of(l, row, 0), 1.0f);
  EXPECT_EQ(row[0], 0x7e);
  EXPECT_EQ(row[1], 0xfe);
  EXPECT_EQ(row[5], 0x01);
  EXPECT_EQ(row[6], 0x07);
  EXPECT_EQ(row[7], 0x00);
  EXPECT_EQ(row[9], 0x08);
  const float want[] = {448,
                        -448,
                        1,
                        -0.5f,
                        240,
                        std::ldexp(1.0f, -9),
                        std::ldexp(7.0f, -9),
                        0,
                        std::ldexp(1.0f, -8),
                        std::ldexp(1.0f, -6),
                        1.0f,
                        1.25f};
  for (int i = 0; i < 12; ++i) EXPECT_EQ(back[static_cast<size_t>(i)], want[i]) << "value " << i;
  for (int i = 12; i < 128; ++i) EXPECT_EQ(back[static_cast<size_t>(i)], 0.0f);
  for (int i = 128; i < 132; ++i)
    EXPECT_EQ(back[static_cast<size_t>(i)], bf16_to_f32(f32_to_bf16(src[static_cast<size_t>(i)]))) << i;
}

TEST(KvFp8, ZeroTileKeepsScaleZeroAndReadsZeros) {
  const KvFp8Layout l = kv_fp8_layout(256, 2);
  std::vector<float> src(258, 0.0f);
  src[200] = -2.5f;  // the second tile is not zero; the first stays 0 / 0-free
  std::vector<float> back;
  const std::vector<uint8_t> row = round_trip(l, src, back);
  EXPECT_EQ(scale_of(l, row, 0), 0.0f);
  for (int i = 0; i < 128; ++i) {
    EXPECT_EQ(row[static_cast<size_t>(i)], 0);
    EXPECT_EQ(back[static_cast<size_t>(i)], 0.0f);
  }
  EXPECT_FLOAT_EQ(back[200], -2.5f);  // the tile's absmax comes back to within the scale's rounding
  EXPECT_EQ(row[200], 0xfe);
  for (int64_t i = l.rope_off + 2 * l.rope; i < l.row_bytes; ++i) EXPECT_EQ(row[static_cast<size_t>(i)], 0) << i;
}

TEST(KvFp8, AllEqualTileSaturatesToTheMaxCode) {
  // Every value is the tile's absmax: all store ±448 and read back as 448 * (v / 448), within an
  // ulp or two of v (the scale is a rounded f32), for magnitudes from tiny to huge.
  const KvFp8Layout l = kv_fp8_layout(128, 0);
  for (float v : {1.0f, 3.14159f, -0.0123f, 7e-3f, 1e6f, -2.5e30f, 1e-30f}) {
    std::vector<float> src(128, v), back;
    const std::vector<uint8_t> row = round_trip(l, src, back);
    for (int i = 0; i < 128; ++i) {
      ASSERT_EQ(row[static_cast<size_t>(i)], v > 0 ? 0x7e : 0xfe) << v;
      ASSERT_NEAR(back[static_cast<size_t>(i)], v, std::fabs(v) * 3e-7) << v;
    }
  }
}

TEST(KvFp8, SubnormalF32TileKeepsItsMagnitude) {
  // A tile of f32 subnormals: its scale (absmax / 448) is a subnormal with few significant bits, so
  // the values come back within its precision (~0.5% here), never as zeros, NaNs or infinities.
  const KvFp8Layout l = kv_fp8_layout(128, 0);
  std::vector<float> src(128), back;
  for (int i = 0; i < 128; ++i) src[static_cast<size_t>(i)] = (i % 2 ? -1e-40f : 1e-40f) * (1.0f + i / 256.0f);
  ASSERT_EQ(std::fpclassify(src[0]), FP_SUBNORMAL);
  const std::vector<uint8_t> row = round_trip(l, src, back);
  EXPECT_GT(scale_of(l, row, 0), 0.0f);
  for (int i = 0; i < 128; ++i) {
    const float x = src[static_cast<size_t>(i)];
    EXPECT_NE(row[static_cast<size_t>(i)] & 0x7f, 0x7f);
    EXPECT_NEAR(back[static_cast<size_t>(i)], x, std::fabs(x) * (0x1p-4f + 0.01f)) << i;
  }
}

TEST(KvFp8, RandomTilesStayWithinE4m3Rounding) {
  // Relative error of a normal e4m3 value is at most 2^-4 (3 mantissa bits, round to nearest);
  // below the normal range the step is scale * 2^-9, so the error is at most half that. Never a
  // NaN byte (0x7f / 0xff), even where x / scale rounds a hair past 448.
  const KvFp8Layout l = kv_fp8_layout(512, 64);
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(-20.0f, 20.0f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> src(576), back;
    const float m = std::exp2(mag(rng));
    for (auto& x : src) x = n(rng) * m;
    const std::vector<uint8_t> row = round_trip(l, src, back);
    for (int64_t t = 0; t < l.tiles; ++t) {
      const float s = scale_of(l, row, t);
      for (int64_t d = t * 128; d < (t + 1) * 128; ++d) {
        const uint8_t q = row[static_cast<size_t>(d)];
        ASSERT_NE(q & 0x7f, 0x7f);
        const float x = src[static_cast<size_t>(d)];
        ASSERT_LE(std::fabs(back[static_cast<size_t>(d)] - x), std::max(std::fabs(x) * 0x1p-4f, s * 0x1p-10f) * 1.0001f)
            << "trial " << trial << " value " << d;
      }
    }
  }
}

}  // namespace
}  // namespace kiln
