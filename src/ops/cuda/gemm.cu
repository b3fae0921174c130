// y = x · wᵀ through cuBLASLt: bf16 operands, f32 accumulation and output. Activations are f32
// in the model; rounding them to bf16 alone costs ~0.05 mean |Δ logprob| on the parity fixtures,
// so x is split into two bf16 parts, x ≈ hi + lo (about 16 bits of mantissa), stacked as 2m rows
// of ONE GEMM (the weights are still read once, which is what decode pays for) and summed.
// Algorithm choices are cached per shape.
#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/pdl.cuh"

#define KILN_CUBLAS_CHECK(expr)                                                                                        \
  do {                                                                                                                 \
    cublasStatus_t st_ = (expr);                                                                                       \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                                  \
      ::kiln::ops::cuda::throw_error("cuBLASLt error " + std::to_string(static_cast<int>(st_)) + " at " __FILE__ ":" + \
                                     std::to_string(__LINE__));                                                        \
  } while (0)

namespace kiln::ops::cuda {
namespace {

// Head h = blockIdx.y of x [m, heads, k] -> out[h] = hi [m, k] then lo [m, k], bf16, x ≈ hi + lo.
__global__ void split_bf16_kernel(const float* x, int64_t stride, int64_t head_stride, __nv_bfloat16* out, int64_t m,
                                  int64_t k) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= m * k) return;
  const float v = x[blockIdx.y * head_stride + (i / k) * stride + i % k];
  const __nv_bfloat16 hi = __float2bfloat16(v);
  __nv_bfloat16* o = out + blockIdx.y * 2 * m * k;
  o[i] = hi;
  o[m * k + i] = __float2bfloat16(v - __bfloat162float(hi));
}

// Head h = blockIdx.y: y[i, h, j] = t[h][i, j] + t[h][m + i, j]
__global__ void sum_halves_kernel(const float* t, int64_t m, int64_t n, float* y, int64_t y_stride,
                                  int64_t y_head_stride) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= m * n) return;
  const int64_t r = i / n, c = i % n;
  const float* th = t + blockIdx.y * 2 * m * n;
  y[blockIdx.y * y_head_stride + r * y_stride + c] = th[i] + th[m * n + i];
}

// Small-m GEMV over bf16 weights with f32 activations: one warp per output row reads the weight
// row once for all m <= kGemvMaxRows activation rows; blockIdx.y picks the head. Decode is this
// kernel reading weights, so it must keep enough bytes in flight to saturate HBM: every lane
// issues kUnroll 16-byte weight loads before it uses any of them.
constexpr int kGemvMaxRows = 8;
constexpr int kGemvWarps = 8;
constexpr int kUnroll = 4;

template <int M>
__device__ __forceinline__ void gemv_accumulate(const uint4& v, const float* x, int64_t x_stride, int64_t col, int rows,
                                                float (&acc)[kGemvMaxRows]) {
  const __nv_bfloat162* hv = reinterpret_cast<const __nv_bfloat162*>(&v);
  float wf[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(hv[j]);
    wf[2 * j] = f.x;
    wf[2 * j + 1] = f.y;
  }
#pragma unroll
  for (int t = 0; t < M; ++t) {
    if (t >= rows) break;
    const float4 a = __ldg(reinterpret_cast<const float4*>(x + t * x_stride + col));
    const float4 b = __ldg(reinterpret_cast<const float4*>(x + t * x_stride + col + 4));
    acc[t] +=
        wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
  }
}

template <int M>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(LinearHeadsParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kGemvWarps, h = blockIdx.y;
  if (threadIdx.x == 0 && blockIdx.z == 0 && p.k % 8 == 0) {  // weights are constant: fetch them early
    const auto* rows = static_cast<const __nv_bfloat16*>(p.w) + h * p.w_head_stride + r0 * p.k;
    if ((reinterpret_cast<uintptr_t>(rows) & 15) == 0)
      prefetch_l2(rows, static_cast<uint32_t>(min(static_cast<int64_t>(kGemvWarps), p.n - r0) * p.k * 2));
  }
  pdl_wait();
  pdl_trigger();
  const int64_t r = r0 + (threadIdx.x >> 5);
  if (r >= p.n) return;
  const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(p.w) + h * p.w_head_stride + r * p.k;
  // blockIdx.z: which M activation rows (more than M rows run as several chunks of one launch).
  const int64_t t0 = static_cast<int64_t>(blockIdx.z) * M;
  const int rows = static_cast<int>(min(static_cast<int64_t>(M), p.m - t0));
  const float* x = p.x + h * p.x_head_stride + t0 * p.x_stride;
  float acc[kGemvMaxRows];
#pragma unroll
  for (int t = 0; t < kGemvMaxRows; ++t) acc[t] = 0.0f;
  const bool vec = p.k % 8 == 0 && (reinterpret_cast<uintptr_t>(w) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(x) & 15) == 0 && p.x_stride % 4 == 0 && p.x_head_stride % 4 == 0;
  if (vec) {
    const uint4* w4 = reinterpret_cast<const uint4*>(w);
    const int64_t n8 = p.k / 8;
    int64_t i = lane;
    for (; i + (kUnroll - 1) * 32 < n8; i += kUnroll * 32) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(w4 + i + u * 32);  // streamed once: keep L2 for x
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) gemv_accumulate<M>(v[u], x, p.x_stride, (i + u * 32) * 8, rows, acc);
    }
    for (; i < n8; i += 32) gemv_accumulate<M>(__ldcs(w4 + i), x, p.x_stride, i * 8, rows, acc);
  } else {
    for (int64_t i = lane; i < p.k; i += 32) {
      const float wv = __bfloat162float(w[i]);
#pragma unroll
      for (int t = 0; t < M; ++t)
        if (t < rows) acc[t] += wv * x[t * p.x_stride + i];
    }
  }
#pragma unroll
  for (int t = 0; t < M; ++t) {
    if (t >= rows) break;
    const float v = warp_sum(acc[t]);
    if (lane == 0) p.y[(t0 + t) * p.y_stride + h * p.y_head_stride + r] = v;
  }
}

void launch_gemv(const LinearHeadsParams& p, cudaStream_t s) {
  dim3 grid(blocks_for(p.n, kGemvWarps), static_cast<unsigned>(p.heads), blocks_for(p.m, kGemvMaxRows));
  static void (*const kernels[])(LinearHeadsParams) = {gemv_kernel<1>, gemv_kernel<2>, gemv_kernel<3>, gemv_kernel<4>,
                                                       gemv_kernel<5>, gemv_kernel<6>, gemv_kernel<7>, gemv_kernel<8>};
  // rows as a template parameter: no dead accumulators, fully unrolled x loads
  launch_pdl(kernels[std::min<int64_t>(p.m, kGemvMaxRows) - 1], grid, dim3(kGemvWarps * 32), 0, s, p);
}

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_size = 64u << 20;
  GrowOnlyScratch xbuf;  // [heads][2m][k] bf16 hi/lo parts of x
  GrowOnlyScratch tbuf;  // [heads][2m][n] f32 products of the two parts
  // (rows, n, k, ldb, ldc, heads, batch strides) -> chosen algorithm (ldb < 0: f32 operands)
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>,
           cublasLtMatmulAlgo_t>
      algos;

  // c[h] = b[h] · a[h]ᵀ for h < heads: a [n, k] (row-major, heads a_stride elements apart), b [rows, k]
  // rows ldb apart, c [rows, n] f32 rows ldc apart; type: bf16 or f32 operands.
  void matmul(cudaDataType_t type, const void* a, int64_t a_stride, const void* b, int64_t ldb, int64_t b_stride,
              float* c, int64_t ldc, int64_t c_stride, int64_t rows, int64_t n, int64_t k, int64_t heads,
              cudaStream_t s);
};

void Gemm::Impl::matmul(cudaDataType_t type, const void* a, int64_t a_stride, const void* b, int64_t ldb,
                        int64_t b_stride, float* c, int64_t ldc, int64_t c_stride, int64_t rows, int64_t n, int64_t k,
                        int64_t heads, cudaStream_t s) {
  cublasLtMatmulDesc_t op;
  // Plain CUBLAS_COMPUTE_32F keeps f32 x f32 in full f32 (TF32 needs _FAST_TF32); the PEDANTIC
  // variant picked a ~100x slower kernel (the router gate at 8k tokens took 3.6 ms).
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  // Weights [n, k] row-major = column-major [k, n]: op(A) = Aᵀ gives [n, k]; x and y likewise.
  cublasLtMatrixLayout_t la, lb, lc;
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, type, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, type, static_cast<uint64_t>(k), static_cast<uint64_t>(rows), ldb));
  KILN_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, static_cast<uint64_t>(n), static_cast<uint64_t>(rows), ldc));
  if (heads > 1) {
    const int32_t count = static_cast<int32_t>(heads);
    for (auto [l, stride] : {std::pair{la, a_stride}, std::pair{lb, b_stride}, std::pair{lc, c_stride}}) {
      KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      KILN_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
  }
  const auto key =
      std::make_tuple(rows, n, k, ldb * (type == CUDA_R_32F ? -1 : 1), ldc, heads, a_stride, b_stride, c_stride);
  auto it = algos.find(key);
  if (it == algos.end()) {
    cublasLtMatmulPreference_t pref;
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &workspace_size, sizeof(workspace_size)));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    KILN_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, op, la, lb, lc, lc, pref, 1, &res, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    KILN_REQUIRE(found > 0, "cuBLASLt has no algorithm for a " + std::to_string(rows) + "x" + std::to_string(n) + "x" +
                                std::to_string(k) + " GEMM (" + std::to_string(heads) + " heads)");
    it = algos.emplace(key, res.algo).first;
  }
  const float alpha = 1.0f, beta = 0.0f;
  KILN_CUBLAS_CHECK(
      cublasLtMatmul(handle, op, &alpha, a, la, b, lb, &beta, c, lc, c, lc, &it->second, workspace, workspace_size, s));
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
}

Gemm::Gemm() : impl_(new Impl) {
  KILN_CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
  KILN_CUDA_CHECK(cudaMalloc(&impl_->workspace, impl_->workspace_size));
}

Gemm::~Gemm() {
  cudaFree(impl_->workspace);
  cublasLtDestroy(impl_->handle);
  delete impl_;
}

void Gemm::linear_heads(const LinearHeadsParams& p_in, cudaStream_t s) {
  if (p_in.m == 0 || p_in.n == 0 || p_in.heads == 0 || p_in.k == 0) return;
  LinearHeadsParams p = p_in;  // stride 0: the dense [m, heads, k] / [m, heads, n] layout
  if (!p.x_stride) p.x_stride = p.heads * p.k;
  if (!p.y_stride) p.y_stride = p.heads * p.n;
  if (p.w_dtype == DType::BF16 && p.m <= kGemvMaxRows) {  // decode-sized: memory-bound GEMV, exact f32 x
    launch_gemv(p, s);
    return;
  }
  const int64_t ys = p.y_stride, xs = p.x_stride;
  if (p.w_dtype == DType::F32) {  // f32 weights (tests, the router gate): one plain f32 GEMM per head
    impl_->matmul(CUDA_R_32F, p.w, p.w_head_stride, p.x, xs, p.x_head_stride, p.y, ys, p.y_head_stride, p.m, p.n, p.k,
                  p.heads, s);
    return;
  }
  KILN_REQUIRE(p.w_dtype == DType::BF16, std::string("linear: unsupported weight dtype ") + dtype_name(p.w_dtype));
  // bf16 weights: every head's x split into hi and lo rows, one batched GEMM, the halves summed.
  auto* xb = impl_->xbuf.get<__nv_bfloat16>(static_cast<size_t>(p.heads * 2 * p.m * p.k));
  float* t = impl_->tbuf.get<float>(static_cast<size_t>(p.heads * 2 * p.m * p.n));
  const dim3 split_grid(blocks_for(p.m * p.k, 256), static_cast<unsigned>(p.heads));
  split_bf16_kernel<<<split_grid, 256, 0, s>>>(p.x, xs, p.x_head_stride, xb, p.m, p.k);
  impl_->matmul(CUDA_R_16BF, p.w, p.w_head_stride, xb, p.k, 2 * p.m * p.k, t, p.n, 2 * p.m * p.n, 2 * p.m, p.n, p.k,
                p.heads, s);
  const dim3 sum_grid(blocks_for(p.m * p.n, 256), static_cast<unsigned>(p.heads));
  sum_halves_kernel<<<sum_grid, 256, 0, s>>>(t, p.m, p.n, p.y, ys, p.y_head_stride);
}

void Gemm::linear(const LinearParams& p, cudaStream_t s) {
  linear_heads({p.x, p.x_stride ? p.x_stride : p.k, 0, p.w, 0, p.w_dtype, p.y, p.y_stride ? p.y_stride : p.n, 0, 1, p.m,
                p.n, p.k},
               s);
}

}  // namespace kiln::ops::cuda
