// A projection weight on the host while it is loaded: dense f32, or quantized codes with their
// scale grid exactly as the ops take them (ops/params.h WeightScales), so stacking (q_a over
// kv_a, gate over up, experts) and online FP8 quantization happen before anything is uploaded.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "model/weights.h"
#include "ops/params.h"

namespace kiln {

struct HostWeight {
  int64_t n = 0, k = 0;        // the weight's logical shape [n, k]
  DType dtype = DType::F32;    // F32 (dense), F8E4M3 or I4X8
  std::vector<float> dense;    // [n, k] when dense
  std::vector<uint8_t> codes;  // [n, ops::weight_row_elems(dtype, k)] elements of dtype, as bytes
  std::vector<float> scale;    // [ceil(n / block_n), ceil(k / block_k)] multipliers
  int64_t block_n = 0, block_k = 0;
  DType scale_dtype = DType::F32;  // how the backend keeps the scales: F32, or BF16 when they shipped as bf16

  bool quantized() const { return dtype != DType::F32; }
  int64_t grid_n() const;
  int64_t grid_k() const;
  // The host scales (always f32 here), for dequantization on the host.
  ops::WeightScales host_scales() const { return {scale.data(), DType::F32, block_n, block_k}; }
};

// The weight's exact f32 values [n, k].
std::vector<float> dequantize(const HostWeight& w);
// The same weight with one scale row per weight row (block_n 1): a view or a stacked part may then
// start on any row. Dense weights are returned as they are.
HostWeight with_unit_block_rows(HostWeight w);
// Parts stacked row-wise into one [sum n, k] weight. Quantized parts of one kind keep their codes
// (scale grids stacked; block_n 1 when a part other than the last ends inside a block); parts of
// mixed kinds are dequantized and stacked dense.
HostWeight concat_rows(std::vector<HostWeight> parts);
// The weights of `count` experts of one shape, one after another ([E, n, k] codes and
// [E, grid_n, grid_k] scales, as MoeParams takes them). Mixed kinds or blocks are made uniform first.
HostWeight stack_experts(std::vector<HostWeight> experts);
// Block-quantizes a dense weight to e4m3 with one f32 scale per block_n x block_k block: scale =
// amax / 448 (1 for an all-zero block), codes round to nearest even (DeepSeek-V3's layout; vLLM's
// online FP8 with blocks).
HostWeight quantize_fp8(const HostWeight& dense, int64_t block_n = 128, int64_t block_k = 128);

// Plain values onto the backend as `dtype` (F32 or BF16, rounded to nearest even).
OwnedTensor upload_plain(ops::Backend& be, const std::string& what, const std::vector<float>& v, Shape shape,
                         DType dtype);
// A projection onto the backend: plain ones in the backend's weight dtype, quantized ones as codes +
// scales. `experts` > 0: h holds that many experts of h.n rows one after another ([E, n, k]).
Weight upload_weight(ops::Backend& be, const std::string& what, const HostWeight& h, int64_t experts = 0);

}  // namespace kiln
