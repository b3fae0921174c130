// The quantized-weight reference (ops/quant.h and the CPU backend's linear, linear_heads and moe
// on FP8 block-scaled and INT4 pack-quantized weights): hand-computed decodes of known codes and
// nibbles, then each op against the same op on the f32 weights the quantized ones stand for.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/backend.h"
#include "ops/quant.h"
#include "parity_util.h"
#include "quant_util.h"

namespace kiln::test {
namespace {

using ops::WeightScales;

TEST(QuantCpu, Fp8KnownCodesTimesBlockScales) {
  // 0x38 = 1, 0x40 = 2, 0xC4 = -3, 0x30 = 0.5, 0x7E = 448 (max), 0x01 = 2^-9 (smallest subnormal).
  const std::vector<uint8_t> codes = {0x38, 0x40, 0xC4, 0x30, 0x7E, 0x01};  // [2, 3]
  const std::vector<float> scales = {2.0f, 0.5f, -1.0f, 4.0f};              // [2 rows, 2 column blocks of 2]
  const WeightScales s{scales.data(), DType::F32, 1, 2};
  std::vector<float> out(6);
  ops::dequantize_rows(codes.data(), DType::F8E4M3, s, 2, 3, 0, 2, out.data());
  EXPECT_EQ(out, (std::vector<float>{2.0f, 4.0f, -1.5f, -0.5f, -448.0f, 0.0078125f}));
  // Row 1 alone reads the second scale row.
  ops::dequantize_rows(codes.data(), DType::F8E4M3, s, 2, 3, 1, 1, out.data());
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 3), (std::vector<float>{-0.5f, -448.0f, 0.0078125f}));
}

TEST(QuantCpu, Int4NibblesLowFirstWithOffsetEight) {
  EXPECT_EQ(int4_from_word(0x76543210u, 0), -8);
  EXPECT_EQ(int4_from_word(0x76543210u, 7), -1);
  EXPECT_EQ(int4_from_word(0xFEDCBA98u, 0), 0);
  EXPECT_EQ(int4_from_word(0xFEDCBA98u, 7), 7);
  EXPECT_EQ(int4_from_word(0x000000F0u, 1), 7);
  // One row of k = 12: two words, the second half padding; groups of 4 with bf16 scales 1, 0.5, 2.
  const std::vector<uint32_t> words = {0x76543210u, 0x0000BA98u};
  const std::vector<uint16_t> scales = {f32_to_bf16(1.0f), f32_to_bf16(0.5f), f32_to_bf16(2.0f)};
  std::vector<float> out(12);
  ops::dequantize_rows(words.data(), DType::I4X8, WeightScales{scales.data(), DType::BF16, 1, 4}, 1, 12, 0, 1,
                       out.data());
  EXPECT_EQ(out, (std::vector<float>{-8, -7, -6, -5, -2, -1.5f, -1, -0.5f, 0, 2, 4, 6}));
  EXPECT_EQ(ops::weight_row_elems(DType::I4X8, 12), 2);
  EXPECT_EQ(ops::weight_elems(DType::I4X8, 3, 32), 12);
}

TEST(QuantCpu, DequantizeMatchesTheQuantizersAcrossPartialBlocks) {
  const int64_t n = 130, k = 200;
  const auto w = randn(static_cast<size_t>(n * k), 1, 0.3f);
  const auto f = quantize_fp8(w, n, k, 128, 128);
  std::vector<float> out(static_cast<size_t>(30 * k));
  ops::dequantize_rows(f.fp8.data(), DType::F8E4M3, WeightScales{f.scales.data(), DType::F32, 128, 128}, n, k, 100, 30,
                       out.data());
  EXPECT_EQ(out, std::vector<float>(f.dequant.begin() + 100 * k, f.dequant.end()));
  EXPECT_EQ(ops::scale_elems(WeightScales{f.scales.data(), DType::F32, 128, 128}, n, k), 4);

  const int64_t k4 = 44;  // not a whole number of words or groups
  const auto w4 = randn(static_cast<size_t>(n * k4), 2, 0.3f);
  const auto q = quantize_int4(w4, n, k4, 32);
  std::vector<float> out4(static_cast<size_t>(n * k4));
  ops::dequantize_rows(q.words.data(), DType::I4X8, WeightScales{q.scales_bf16.data(), DType::BF16, 1, 32}, n, k4, 0, n,
                       out4.data());
  EXPECT_EQ(out4, q.dequant);
  // The quantizers are not trivial: codes round (the error is bounded by half a step of each scale).
  double worst = 0;
  for (size_t i = 0; i < w4.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(w4[i]) - q.dequant[i]));
  EXPECT_GT(worst, 0.0);
}

TEST(QuantCpu, RejectsWeightsItCannotDecode) {
  const std::vector<uint32_t> words(8, 0);
  const std::vector<float> scales(8, 1.0f);
  std::vector<float> out(64);
  EXPECT_THROW(ops::dequantize_rows(words.data(), DType::I4X8, WeightScales{}, 1, 64, 0, 1, out.data()), Error);
  EXPECT_THROW(ops::dequantize_rows(words.data(), DType::BF16, WeightScales{scales.data(), DType::F32, 1, 32}, 1, 64, 0,
                                    1, out.data()),
               Error);
  EXPECT_THROW(ops::dequantize_rows(words.data(), DType::I4X8, WeightScales{scales.data(), DType::F32, 1, 0}, 1, 64, 0,
                                    1, out.data()),
               Error);
  EXPECT_THROW(ops::dequantize_rows(words.data(), DType::I4X8, WeightScales{scales.data(), DType::I32, 1, 32}, 1, 64, 0,
                                    1, out.data()),
               Error);
}

// linear on a quantized weight equals linear on its dequantized f32 values (fused norm and add too).
TEST(QuantCpu, LinearOnQuantizedWeightsEqualsDequantizedF32) {
  auto& cpu = *backends().cpu;
  const int64_t m = 5, n = 300, k = 256;
  const auto x = randn(static_cast<size_t>(m * k), 3), add = randn(static_cast<size_t>(m * n), 4);
  const auto nw = randn(static_cast<size_t>(k), 5, 0.5f);
  const auto w = randn(static_cast<size_t>(n * k), 6, 0.2f);
  const auto f = quantize_fp8(w, n, k, 128, 128);
  const auto q = quantize_int4(w, n, k, 32);
  for (int kind = 0; kind < 2; ++kind) {
    const auto& deq = kind == 0 ? f.dequant : q.dequant;
    std::vector<float> want(static_cast<size_t>(m * n)), got(want.size());
    ops::LinearParams p{x.data(), 0, deq.data(), DType::F32, want.data(), 0, m, n, k};
    p.norm_weight = nw.data(), p.norm_eps = 1e-6f, p.add = add.data();
    cpu.linear(p);
    if (kind == 0) {
      p.w = f.fp8.data(), p.w_dtype = DType::F8E4M3, p.w_scales = {f.scales.data(), DType::F32, 128, 128};
    } else {
      p.w = q.words.data(), p.w_dtype = DType::I4X8, p.w_scales = {q.scales_bf16.data(), DType::BF16, 1, 32};
    }
    p.y = got.data();
    cpu.linear(p);
    EXPECT_LE(norm_err(want, got), 1e-6) << (kind == 0 ? "fp8" : "int4");
  }
}

TEST(QuantCpu, LinearHeadsReadsEachHeadsScales) {
  auto& cpu = *backends().cpu;
  const int64_t heads = 3, m = 2, n = 64, k = 96;
  const auto x = randn(static_cast<size_t>(m * heads * k), 7);
  const auto w = randn(static_cast<size_t>(heads * n * k), 8, 0.2f);
  // Each head quantized on its own ([heads, n, k] as heads * n rows of k, groups per row).
  const auto q = quantize_int4(w, heads * n, k, 32);
  std::vector<float> want(static_cast<size_t>(m * heads * n)), got(want.size());
  cpu.linear_heads({x.data(), 0, k, q.dequant.data(), n * k, DType::F32, want.data(), 0, n, heads, m, n, k});
  ops::LinearHeadsParams p{x.data(), 0, k, q.words.data(), n * k / 8, DType::I4X8, got.data(), 0, n, heads, m, n, k};
  p.w_scales = {q.scales_bf16.data(), DType::BF16, 1, 32};
  p.w_scale_head_stride = n * k / 32;
  cpu.linear_heads(p);
  EXPECT_LE(norm_err(want, got), 1e-6);
}

// Routed experts quantized per expert (FP8 blocks, INT4 groups), shared experts bf16 beside INT4.
TEST(QuantCpu, MoeOnQuantizedExpertsEqualsDequantizedF32) {
  auto& cpu = *backends().cpu;
  const int64_t T = 6, H = 256, I = 128, E = 4, K = 2, S = 128;
  const auto x = randn(static_cast<size_t>(T * H), 9);
  const std::vector<int32_t> ids = {0, 1, 2, 3, 1, 2, 0, 3, 3, 2, 1, 0};
  const std::vector<float> tw = {0.5f, 0.25f, 0.7f, 0.1f, 0.3f, 0.3f, 0.9f, 0.05f, 0.4f, 0.6f, 0.2f, 0.8f};
  const auto wgu = randn(static_cast<size_t>(E * 2 * I * H), 10, 0.1f),
             wd = randn(static_cast<size_t>(E * H * I), 11, 0.1f);
  const auto sgu = bf16_round(randn(static_cast<size_t>(2 * S * H), 12, 0.1f));
  const auto sd = bf16_round(randn(static_cast<size_t>(H * S), 13, 0.1f));
  std::vector<uint16_t> sgu_b(sgu.size()), sd_b(sd.size());
  for (size_t i = 0; i < sgu.size(); ++i) sgu_b[i] = f32_to_bf16(sgu[i]);
  for (size_t i = 0; i < sd.size(); ++i) sd_b[i] = f32_to_bf16(sd[i]);
  for (int kind = 0; kind < 2; ++kind) {
    // Per expert: the FP8 blocks never straddle experts (2I and H are multiples of 128), so one
    // quantization of the stacked rows is the per-expert one; INT4 groups are per row anyway.
    const auto gq = kind == 0 ? quantize_fp8(wgu, E * 2 * I, H, 128, 128) : quantize_int4(wgu, E * 2 * I, H, 32);
    const auto dq = kind == 0 ? quantize_fp8(wd, E * H, I, 128, 128) : quantize_int4(wd, E * H, I, 32);
    std::vector<float> want(static_cast<size_t>(T * H)), got(want.size());
    ops::MoeParams p{
        x.data(), ids.data(), tw.data(), gq.dequant.data(), dq.dequant.data(), DType::F32, want.data(), T, H, I, E, K};
    p.w_shared_gate_up = sgu.data(), p.w_shared_down = sd.data(), p.shared_inter = S;
    cpu.moe(p);
    if (kind == 0) {
      p.w_gate_up = gq.fp8.data(), p.w_down = dq.fp8.data(), p.w_dtype = DType::F8E4M3;
      p.w_gate_up_scales = {gq.scales.data(), DType::F32, 128, 128};
      p.w_down_scales = {dq.scales.data(), DType::F32, 128, 128};
    } else {
      p.w_gate_up = gq.words.data(), p.w_down = dq.words.data(), p.w_dtype = DType::I4X8;
      p.w_gate_up_scales = {gq.scales_bf16.data(), DType::BF16, 1, 32};
      p.w_down_scales = {dq.scales_bf16.data(), DType::BF16, 1, 32};
    }
    p.w_shared_dtype = DType::BF16, p.w_shared_gate_up = sgu_b.data(), p.w_shared_down = sd_b.data();
    p.out = got.data();
    cpu.moe(p);
    EXPECT_LE(norm_err(want, got), 1e-6) << (kind == 0 ? "fp8" : "int4");
    // Scales missing on one side is a clear error, not a silent mix.
    p.w_down_scales = {};
    EXPECT_THROW(cpu.moe(p), Error);
  }
}

}  // namespace
}  // namespace kiln::test
