// Routed experts on the GPU.
//  - Few tokens (decode): one GEMV per (token, chosen expert) slot, warp per output row, bf16
//    weights streamed once per slot; no host round trip, so the step stays graph-capturable.
//  - Many tokens (prefill, large batches): tokens grouped by expert on the host, one cuBLASLt
//    GEMM pair per expert over its rows, so each expert's weights are read once per layer.
// Both finish with the same deterministic combine: out[t] = Σ_j w[t,j] · y[row(t,j)], j in order.
#include <vector>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace kiln::ops::cuda {
namespace {

constexpr int64_t kGemvMaxTokens = 4;
constexpr int kWarps = 8;

__device__ __forceinline__ float dot_bf16_f32(const __nv_bfloat16* w, const float* x, int64_t n, int lane) {
  float acc = 0.0f;
  if (n % 8 == 0 && (reinterpret_cast<uintptr_t>(w) & 15) == 0) {
    const uint4* w4 = reinterpret_cast<const uint4*>(w);
    for (int64_t i = lane; i < n / 8; i += 32) {
      const uint4 v = w4[i];
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(h[k]);
        acc += f.x * x[i * 8 + 2 * k] + f.y * x[i * 8 + 2 * k + 1];
      }
    }
  } else {
    for (int64_t i = lane; i < n; i += 32) acc += __bfloat162float(w[i]) * x[i];
  }
  return warp_sum(acc);
}

// grid: (slots, ceil(rows / kWarps)); y[slot, r] = W[e(slot)][r] · x[token(slot)]
__global__ void slot_gemv_kernel(const float* x, int64_t x_rows_per_slot, const int32_t* topk_ids, int64_t top_k,
                                 const __nv_bfloat16* w, int64_t rows, int64_t cols, float* y) {
  extern __shared__ float xs[];
  const int64_t slot = blockIdx.x;
  const int64_t e = topk_ids[slot];
  const float* xr = x + (x_rows_per_slot ? slot : slot / top_k) * cols;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) xs[i] = xr[i];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r = static_cast<int64_t>(blockIdx.y) * kWarps + warp;
  if (r >= rows) return;
  const float v = dot_bf16_f32(w + (e * rows + r) * cols, xs, cols, lane);
  if (lane == 0) y[slot * rows + r] = v;
}

__global__ void gather_rows_kernel(const float* x, const int32_t* src_rows, int64_t cols, float* out) {
  const int64_t r = blockIdx.x;
  const float* s = x + static_cast<int64_t>(src_rows[r]) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[r * cols + c] = s[c];
}

// out[t, h] = Σ_j w[t, j] · y[row_of[t * k + j], h]
__global__ void combine_kernel(const float* y, const int32_t* row_of, const float* w, int64_t top_k, int64_t hidden,
                               float* out) {
  const int64_t t = blockIdx.x;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < top_k; ++j)
      acc += w[t * top_k + j] * y[static_cast<int64_t>(row_of ? row_of[t * top_k + j] : t * top_k + j) * hidden + h];
    out[t * hidden + h] = acc;
  }
}

struct Scratch {
  void* ptr = nullptr;
  size_t bytes = 0;
  template <typename T>
  T* get(size_t count) {
    const size_t need = count * sizeof(T);
    if (need > bytes) {
      if (ptr) cudaFree(ptr);
      bytes = std::max(need, bytes * 2);
      KILN_CUDA_CHECK(cudaMalloc(&ptr, bytes));
    }
    return static_cast<T*>(ptr);
  }
};

void moe_gemv(const MoeParams& p, cudaStream_t s) {
  static Scratch gu_buf, act_buf, y_buf;
  const int64_t slots = p.num_tokens * p.top_k, I = p.inter, H = p.hidden;
  float* gu = gu_buf.get<float>(static_cast<size_t>(slots * 2 * I));
  float* act = act_buf.get<float>(static_cast<size_t>(slots * I));
  float* y = y_buf.get<float>(static_cast<size_t>(slots * H));
  const auto* wgu = static_cast<const __nv_bfloat16*>(p.w_gate_up);
  const auto* wd = static_cast<const __nv_bfloat16*>(p.w_down);
  slot_gemv_kernel<<<dim3(static_cast<unsigned>(slots), blocks_for(2 * I, kWarps)), kWarps * 32, H * sizeof(float),
                     s>>>(p.x, 0, p.topk_ids, p.top_k, wgu, 2 * I, H, gu);
  swiglu({gu, act, slots, I}, s);
  slot_gemv_kernel<<<dim3(static_cast<unsigned>(slots), blocks_for(H, kWarps)), kWarps * 32, I * sizeof(float), s>>>(
      act, 1, p.topk_ids, p.top_k, wd, H, I, y);
  combine_kernel<<<static_cast<unsigned>(p.num_tokens), 256, 0, s>>>(y, nullptr, p.topk_weights, p.top_k, H, p.out);
}

void moe_grouped(const MoeParams& p, Gemm& gemm, cudaStream_t s) {
  const int64_t T = p.num_tokens, k = p.top_k, E = p.num_experts, I = p.inter, H = p.hidden;
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  KILN_CUDA_CHECK(cudaMemcpyAsync(ids.data(), p.topk_ids, ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  // Rows grouped by expert: src token of each row, and where each (t, j) landed.
  std::vector<int64_t> count(static_cast<size_t>(E + 1), 0);
  for (int32_t e : ids) {
    KILN_REQUIRE(e >= 0 && e < E, "moe: expert id " + std::to_string(e) + " out of range");
    ++count[static_cast<size_t>(e + 1)];
  }
  for (int64_t e = 0; e < E; ++e) count[static_cast<size_t>(e + 1)] += count[static_cast<size_t>(e)];
  std::vector<int32_t> host(static_cast<size_t>(2 * T * k));  // [src_token | row_of]
  std::vector<int64_t> fill(count.begin(), count.end() - 1);
  for (int64_t i = 0; i < T * k; ++i) {
    const int64_t row = fill[static_cast<size_t>(ids[static_cast<size_t>(i)])]++;
    host[static_cast<size_t>(row)] = static_cast<int32_t>(i / k);
    host[static_cast<size_t>(T * k + i)] = static_cast<int32_t>(row);
  }
  static Scratch idx_buf, xg_buf, gu_buf, act_buf, y_buf;
  int32_t* idx = idx_buf.get<int32_t>(host.size());
  KILN_CUDA_CHECK(cudaMemcpyAsync(idx, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s));
  const int64_t rows = T * k;
  float* xg = xg_buf.get<float>(static_cast<size_t>(rows * H));
  float* gu = gu_buf.get<float>(static_cast<size_t>(rows * 2 * I));
  float* act = act_buf.get<float>(static_cast<size_t>(rows * I));
  float* y = y_buf.get<float>(static_cast<size_t>(rows * H));
  gather_rows_kernel<<<static_cast<unsigned>(rows), 256, 0, s>>>(p.x, idx, H, xg);
  const size_t esz = dtype_size(p.w_dtype);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = count[static_cast<size_t>(e)], n = count[static_cast<size_t>(e + 1)] - r0;
    if (n == 0) continue;
    const char* wgu = static_cast<const char*>(p.w_gate_up) + static_cast<size_t>(e * 2 * I * H) * esz;
    gemm.linear({xg + r0 * H, 0, wgu, p.w_dtype, gu + r0 * 2 * I, 0, n, 2 * I, H}, s);
  }
  swiglu({gu, act, rows, I}, s);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = count[static_cast<size_t>(e)], n = count[static_cast<size_t>(e + 1)] - r0;
    if (n == 0) continue;
    const char* wd = static_cast<const char*>(p.w_down) + static_cast<size_t>(e * H * I) * esz;
    gemm.linear({act + r0 * I, 0, wd, p.w_dtype, y + r0 * H, 0, n, H, I}, s);
  }
  combine_kernel<<<static_cast<unsigned>(T), 256, 0, s>>>(y, idx + T * k, p.topk_weights, k, H, p.out);
}

}  // namespace

void moe(const MoeParams& p, Gemm& gemm, cudaStream_t s) {
  if (p.num_tokens == 0) return;
  if (p.num_tokens <= kGemvMaxTokens && p.w_dtype == DType::BF16)
    moe_gemv(p, s);
  else
    moe_grouped(p, gemm, s);
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kiln::ops::cuda
