// Routed experts on the GPU, all on the device (no host round trip, graph-capturable; launch
// configs depend only on T, k, E, hidden and inter).
//  - Few tokens (<= 4, decode): one GEMV per (token, chosen expert) slot, warp per output row, bf16
//    weights streamed once per slot, f32 activations exact.
//  - More: slots sorted by expert into M-tile-aligned groups on the device (moe_align.cu), then two
//    grouped tensor-core GEMMs (moe_grouped_gemm.cu): gate/up with SwiGLU fused, then down; each
//    expert's weights are read once per column block, however many tokens chose it.
// Both finish with the same deterministic combine: out[t] = Σ_j w[t,j] · y[row(t,j)], j in order.
// Weights must be bf16 (the CUDA backend's weight dtype); the earlier host-sorted cuBLASLt path
// that also took f32 weights is gone: it synchronised the host every layer and nothing used f32.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/moe/moe_internal.cuh"

namespace kiln::ops::cuda {
namespace {

constexpr int64_t kGemvMaxTokens = 4;
constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 4;  // rows per warp: the block's x staging serves 32 weight rows

// Dot product of a bf16 weight row with an f32 row in shared memory, by one warp. Each lane
// issues four 16-byte weight loads before using any: decode reads experts at HBM speed only with
// that many bytes in flight.
__device__ __forceinline__ float dot_bf16_f32(const __nv_bfloat16* w, const float* x, int64_t n, int lane) {
  float acc = 0.0f;
  auto fma8 = [&](const uint4& v, int64_t i) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __bfloat1622float2(h[k]);
      acc += f.x * x[i * 8 + 2 * k] + f.y * x[i * 8 + 2 * k + 1];
    }
  };
  if (n % 8 == 0 && (reinterpret_cast<uintptr_t>(w) & 15) == 0) {
    const uint4* w4 = reinterpret_cast<const uint4*>(w);
    const int64_t n8 = n / 8;
    int64_t i = lane;
    for (; i + 96 < n8; i += 128) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = __ldcs(w4 + i + 32 * u);
#pragma unroll
      for (int u = 0; u < 4; ++u) fma8(v[u], i + 32 * u);
    }
    for (; i < n8; i += 32) fma8(__ldcs(w4 + i), i);
  } else {
    for (int64_t i = lane; i < n; i += 32) acc += __bfloat162float(w[i]) * x[i];
  }
  return warp_sum(acc);
}

// grid: (slots, ceil(rows / (kWarps * kRowsPerWarp))); y[slot, r] = W[e(slot)][r] · x[token(slot)]
__global__ void slot_gemv_kernel(const float* x, int64_t x_rows_per_slot, const int32_t* topk_ids, int64_t top_k,
                                 const __nv_bfloat16* w, int64_t rows, int64_t cols, float* y) {
  extern __shared__ float xs[];
  const int64_t slot = blockIdx.x;
  const int64_t e = topk_ids[slot];
  const float* xr = x + (x_rows_per_slot ? slot : slot / top_k) * cols;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) xs[i] = xr[i];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.y) * kWarps + warp) * kRowsPerWarp;
  for (int64_t r = r0; r < r0 + kRowsPerWarp && r < rows; ++r) {
    const float v = dot_bf16_f32(w + (e * rows + r) * cols, xs, cols, lane);
    if (lane == 0) y[slot * rows + r] = v;
  }
}

// out[t, h] = Σ_j w[t, j] · y[row_of[t * k + j], h], j in order (row_of null: row = t * k + j;
// row -1: a dropped slot whose expert id was out of range).
__global__ void combine_kernel(const float* y, const int32_t* row_of, const float* w, int64_t top_k, int64_t hidden,
                               float* out) {
  const int64_t t = blockIdx.x;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t row = row_of ? row_of[t * top_k + j] : t * top_k + j;
      if (row >= 0) acc += w[t * top_k + j] * y[row * hidden + h];
    }
    out[t * hidden + h] = acc;
  }
}

void moe_gemv(const MoeParams& p, cudaStream_t s) {
  static GrowOnlyScratch gu_buf, act_buf, y_buf;
  const int64_t slots = p.num_tokens * p.top_k, I = p.inter, H = p.hidden;
  float* gu = gu_buf.get<float>(static_cast<size_t>(slots * 2 * I));
  float* act = act_buf.get<float>(static_cast<size_t>(slots * I));
  float* y = y_buf.get<float>(static_cast<size_t>(slots * H));
  const auto* wgu = static_cast<const __nv_bfloat16*>(p.w_gate_up);
  const auto* wd = static_cast<const __nv_bfloat16*>(p.w_down);
  slot_gemv_kernel<<<dim3(static_cast<unsigned>(slots), blocks_for(2 * I, kWarps * kRowsPerWarp)), kWarps * 32,
                     H * sizeof(float), s>>>(p.x, 0, p.topk_ids, p.top_k, wgu, 2 * I, H, gu);
  swiglu({gu, act, slots, I}, s);
  slot_gemv_kernel<<<dim3(static_cast<unsigned>(slots), blocks_for(H, kWarps * kRowsPerWarp)), kWarps * 32,
                     I * sizeof(float), s>>>(act, 1, p.topk_ids, p.top_k, wd, H, I, y);
  combine_kernel<<<static_cast<unsigned>(p.num_tokens), 256, 0, s>>>(y, nullptr, p.topk_weights, p.top_k, H, p.out);
}

// Split x [T, H] f32 into bf16 parts x ≈ hi + lo: out [2][T][H_pad], pad columns 0. Done once
// per layer so the gate/up GEMM gathers rows of both parts with plain cp.async copies (each token
// is read by k experts and by every column block of the GEMM).
__global__ void split_rows_kernel(const float* x, int64_t rows, int64_t cols, int64_t cols_pad, __nv_bfloat16* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols_pad) return;
  const int64_t r = i / cols_pad, c = i % cols_pad;
  const float v = c < cols ? x[r * cols + c] : 0.0f;
  const __nv_bfloat16 hi = __float2bfloat16(v);
  out[i] = hi;
  out[rows * cols_pad + i] = __float2bfloat16(v - __bfloat162float(hi));
}

// M tile per launch shape: small tiles while the expected rows per expert are few (decode batches:
// the step is bound by reading the chosen experts' weights, padding rows only cost compute), 64 rows
// once experts fill them (prefill: tensor-core bound, larger tiles re-read less of A and W).
int64_t choose_bm(int64_t slots, int64_t experts) {
  const int64_t per_expert = (slots + experts - 1) / experts;
  return per_expert <= 24 ? 16 : per_expert <= 64 ? 32 : 64;
}

void moe_grouped(const MoeParams& p, cudaStream_t s) {
  using namespace moe_detail;
  const int64_t T = p.num_tokens, k = p.top_k, E = p.num_experts, I = p.inter, H = p.hidden, slots = T * k;
  const int64_t bm = choose_bm(slots, E), tiles = max_tiles(slots, E, bm), rows = tiles * bm;
  const int64_t H_pad = round_up(H, 8), I_pad = round_up(I, 8);
  KILN_REQUIRE(rows < (int64_t{1} << 31), "moe: " + std::to_string(slots) + " routed slots overflow the row index");
  static GrowOnlyScratch idx_buf, x_buf, act_buf, y_buf;
  int32_t* idx = idx_buf.get<int32_t>(static_cast<size_t>(rows + slots + tiles));
  const AlignedLayout layout{idx, idx + rows, idx + rows + slots, tiles, bm};
  auto* xs = x_buf.get<__nv_bfloat16>(static_cast<size_t>(2 * T * H_pad));        // [2][T][H_pad]
  auto* act = act_buf.get<__nv_bfloat16>(static_cast<size_t>(2 * rows * I_pad));  // [2][rows][I_pad]
  float* y = y_buf.get<float>(static_cast<size_t>(rows * H));                     // [rows, H]
  const auto* wgu = static_cast<const __nv_bfloat16*>(p.w_gate_up);
  const auto* wd = static_cast<const __nv_bfloat16*>(p.w_down);

  moe_align(p.topk_ids, slots, E, layout, s);
  split_rows_kernel<<<blocks_for(T * H_pad, 256), 256, 0, s>>>(p.x, T, H, H_pad, xs);
  moe_gate_up_swiglu({xs, T, H, H_pad, k, wgu, I, I_pad, act}, layout, s);
  moe_down({act, I, I_pad, wd, H, y}, layout, s);
  combine_kernel<<<static_cast<unsigned>(T), 256, 0, s>>>(y, layout.row_of, p.topk_weights, k, H, p.out);
}

}  // namespace

void moe(const MoeParams& p, Gemm& /*gemm: unused since the grouped path has its own GEMMs*/, cudaStream_t s) {
  if (p.num_tokens == 0) return;
  KILN_REQUIRE(p.top_k > 0 && p.num_experts > 0, "moe: needs top_k >= 1 and at least one expert");
  KILN_REQUIRE(p.w_dtype == DType::BF16,
               std::string("moe on CUDA: expert weights must be bf16, got ") + dtype_name(p.w_dtype));
  if (p.num_tokens <= kGemvMaxTokens)
    moe_gemv(p, s);
  else
    moe_grouped(p, s);
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kiln::ops::cuda
