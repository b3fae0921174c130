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
#include "ops/cuda/env.h"
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

// Head h = blockIdx.y: y[i, h, j] = t[h][i, j] + t[h][m + i, j] (halves; else t[h][i, j] alone),
// plus add[i, h, j] (laid out as y) when given: a fused addend costs no pass of its own.
__global__ void sum_halves_kernel(const float* t, int64_t m, int64_t n, bool halves, float* y, int64_t y_stride,
                                  int64_t y_head_stride, const float* add) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= m * n) return;
  const int64_t r = i / n, c = i % n, o = blockIdx.y * y_head_stride + r * y_stride + c;
  const float* th = t + blockIdx.y * (halves ? 2 : 1) * m * n;
  const float v = halves ? th[i] + th[m * n + i] : th[i];
  y[o] = add ? v + add[o] : v;
}

// Small-m GEMV over bf16 weights with f32 activations: one warp per output row reads the weight
// row once for all m <= kGemvMaxRows activation rows; blockIdx.y picks the head. Decode is this
// kernel reading weights, so it must keep enough bytes in flight to saturate HBM: every lane
// issues kUnroll 16-byte weight loads before it uses any of them.
constexpr int kGemvMaxRows = 8;
constexpr int kGemvWarps = 8;
constexpr int kUnroll = 4;

// What Gemm::linear fuses into the GEMV (heads == 1). A decode sub-layer's RMSNorm runs inside its
// first projection: every warp sums the squares of the rows of x + residual it reads anyway (at
// most 8 rows, from L2), folds norm_weight into the weights it streams, and scales each dot product
// by 1/rms, so no normalised copy of x is ever written: one launch fewer per sub-layer at up to
// gemv_norm_max_rows() rows. (A CTA-wide
// 1/rms pass before the dot products, measured first, put a serial L2 read in front of every
// weight load: the decode step got 2% slower instead of faster.)
struct GemvFusion {
  const void* norm_weight = nullptr;  // [k] f32 or bf16; null: no norm (the plain GEMV)
  bool norm_bf16 = false;
  float eps = 0.0f;
  const float* residual = nullptr;  // [m, k], rows x_stride apart (null: none)
  const float* add = nullptr;       // [m, n], laid out as y (null: none)
};

// 8 norm weights from column col (16-byte aligned).
__device__ __forceinline__ void load_norm8(const GemvFusion& f, int64_t col, float (&o)[8]) {
  if (f.norm_bf16) {
    bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(f.norm_weight) + col)), o);
  } else {
    const float4* w4 = reinterpret_cast<const float4*>(static_cast<const float*>(f.norm_weight) + col);
    const float4 a = __ldg(w4), b = __ldg(w4 + 1);
    o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
  }
}

// kNorm: the weights times norm_weight, dotted with x + res (res may be null).
// kNorm also sums the squares of x + res into ss: each warp reads whole rows of x, so it finds the
// rows' 1/rms in the same pass, with no CTA-wide reduction before the weights can be used.
template <int M, bool kNorm>
__device__ __forceinline__ void gemv_accumulate(const uint4& v, const float* x, const float* res, int64_t x_stride,
                                                int64_t col, int rows, const GemvFusion& f, float (&acc)[kGemvMaxRows],
                                                float (&ss)[kGemvMaxRows]) {
  float wf[8];
  bf16x8_to_f32(v, wf);
  if constexpr (kNorm) {
    float nw[8];
    load_norm8(f, col, nw);
#pragma unroll
    for (int j = 0; j < 8; ++j) wf[j] *= nw[j];
  }
#pragma unroll
  for (int t = 0; t < M; ++t) {
    if (t >= rows) break;
    float4 a = __ldg(reinterpret_cast<const float4*>(x + t * x_stride + col));
    float4 b = __ldg(reinterpret_cast<const float4*>(x + t * x_stride + col + 4));
    if constexpr (kNorm) {
      if (res) {
        const float4 ra = __ldg(reinterpret_cast<const float4*>(res + t * x_stride + col));
        const float4 rb = __ldg(reinterpret_cast<const float4*>(res + t * x_stride + col + 4));
        a = make_float4(a.x + ra.x, a.y + ra.y, a.z + ra.z, a.w + ra.w);
        b = make_float4(b.x + rb.x, b.y + rb.y, b.z + rb.z, b.w + rb.w);
      }
      ss[t] += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
    }
    acc[t] +=
        wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
  }
}

template <int M, bool kNorm>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(LinearHeadsParams p, GemvFusion f) {
  const int lane = threadIdx.x & 31;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kGemvWarps, h = blockIdx.y;
  if (threadIdx.x == 0 && blockIdx.z == 0 && p.k % 8 == 0) {  // weights are constant: fetch them early
    const auto* rows = static_cast<const __nv_bfloat16*>(p.w) + h * p.w_head_stride + r0 * p.k;
    if ((reinterpret_cast<uintptr_t>(rows) & 15) == 0)
      prefetch_l2(rows, static_cast<uint32_t>(min(static_cast<int64_t>(kGemvWarps), p.n - r0) * p.k * 2));
  }
  pdl_wait();  // activations (x, residual, add) only from here on
  pdl_trigger();
  // blockIdx.z: which M activation rows (more than M rows run as several chunks of one launch).
  const int64_t t0 = static_cast<int64_t>(blockIdx.z) * M;
  const int rows = static_cast<int>(min(static_cast<int64_t>(M), p.m - t0));
  const float* x = p.x + h * p.x_head_stride + t0 * p.x_stride;
  const float* res = kNorm && f.residual ? f.residual + t0 * p.x_stride : nullptr;  // heads == 1 with a norm
  const int64_t r = r0 + (threadIdx.x >> 5);
  if (r >= p.n) return;
  const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(p.w) + h * p.w_head_stride + r * p.k;
  float acc[kGemvMaxRows], ss[kGemvMaxRows];
#pragma unroll
  for (int t = 0; t < kGemvMaxRows; ++t) acc[t] = ss[t] = 0.0f;
  const bool vec = p.k % 8 == 0 && (reinterpret_cast<uintptr_t>(w) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(x) & 15) == 0 && p.x_stride % 4 == 0 && p.x_head_stride % 4 == 0 &&
                   (!kNorm || ((reinterpret_cast<uintptr_t>(res) & 15) == 0 &&
                               (reinterpret_cast<uintptr_t>(f.norm_weight) & 15) == 0));
  if (vec) {
    const uint4* w4 = reinterpret_cast<const uint4*>(w);
    const int64_t n8 = p.k / 8;
    int64_t i = lane;
    for (; i + (kUnroll - 1) * 32 < n8; i += kUnroll * 32) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(w4 + i + u * 32);  // streamed once: keep L2 for x
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        gemv_accumulate<M, kNorm>(v[u], x, res, p.x_stride, (i + u * 32) * 8, rows, f, acc, ss);
    }
    for (; i < n8; i += 32) gemv_accumulate<M, kNorm>(__ldcs(w4 + i), x, res, p.x_stride, i * 8, rows, f, acc, ss);
  } else {
    for (int64_t i = lane; i < p.k; i += 32) {
      float wv = __bfloat162float(w[i]);
      if constexpr (kNorm) wv *= load_w(f.norm_weight, i, f.norm_bf16);
#pragma unroll
      for (int t = 0; t < M; ++t) {
        if (t >= rows) break;
        float xv = x[t * p.x_stride + i];
        if constexpr (kNorm) {
          xv += res ? res[t * p.x_stride + i] : 0.0f;
          ss[t] += xv * xv;
        }
        acc[t] += wv * xv;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < M; ++t) {
    if (t >= rows) break;
    float v = warp_sum(acc[t]);
    if constexpr (kNorm) v *= rsqrtf(warp_sum(ss[t]) / static_cast<float>(p.k) + f.eps);
    const int64_t o = (t0 + t) * p.y_stride + h * p.y_head_stride + r;
    if (lane == 0) p.y[o] = f.add ? v + f.add[o] : v;
  }
}

}  // namespace

// Most rows whose RMSNorm runs inside the GEMV. Every row adds x, residual and norm-weight loads per
// weight chunk, so past one row the fused GEMV costs more than the separate rms_norm launch it
// saves (H200, whole steps, fused vs separate: 1 row 2.81 vs 2.85 ms, 2 rows 4.13 vs 3.99, 8 rows
// 11.90 vs 10.82; docs/results.md).
// KILN_GEMV_NORM_MAX_ROWS overrides it (0..8) for the A/B.
int64_t gemv_norm_max_rows() {
  static const int64_t v = env_int("KILN_GEMV_NORM_MAX_ROWS", 1, 0, kGemvMaxRows);
  return v;
}

namespace {

void launch_gemv(const LinearHeadsParams& p, const GemvFusion& f, cudaStream_t s) {
  dim3 grid(blocks_for(p.n, kGemvWarps), static_cast<unsigned>(p.heads), blocks_for(p.m, kGemvMaxRows));
  using Kernel = void (*)(LinearHeadsParams, GemvFusion);
  // rows as a template parameter: no dead accumulators, fully unrolled x loads; without a norm the
  // kernel is the plain GEMV (an addend costs one test in the epilogue)
  static const Kernel plain[] = {gemv_kernel<1, false>, gemv_kernel<2, false>, gemv_kernel<3, false>,
                                 gemv_kernel<4, false>, gemv_kernel<5, false>, gemv_kernel<6, false>,
                                 gemv_kernel<7, false>, gemv_kernel<8, false>};
  static const Kernel normed[] = {gemv_kernel<1, true>, gemv_kernel<2, true>, gemv_kernel<3, true>,
                                  gemv_kernel<4, true>, gemv_kernel<5, true>, gemv_kernel<6, true>,
                                  gemv_kernel<7, true>, gemv_kernel<8, true>};
  const int64_t i = std::min<int64_t>(p.m, kGemvMaxRows) - 1;
  launch_pdl(f.norm_weight ? normed[i] : plain[i], grid, dim3(kGemvWarps * 32), 0, s, p, f);
}

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_size = 64u << 20;
  GrowOnlyScratch xbuf;  // [heads][2m][k] bf16 hi/lo parts of x
  GrowOnlyScratch tbuf;  // [heads][2m][n] f32 products of the two parts
  GrowOnlyScratch nbuf;  // [m][k] normalised x (then [m][x_stride] sums) of a fused norm beyond the GEMV

  // linear_heads, plus add (laid out as y) when given: Gemm::linear's addend.
  void heads(const LinearHeadsParams& p, const float* add, cudaStream_t s);
  // (rows, n, k, ldb, ldc, heads, batch strides) -> chosen algorithm (ldb < 0: f32 operands)
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>,
           cublasLtMatmulAlgo_t>
      algos;

  // c[h] = b[h] · a[h]ᵀ for h < heads: a [n, k] (row-major, heads a_stride elements apart), b [rows, k]
  // rows ldb apart, c [rows, n] f32 rows ldc apart; type: bf16 or f32 operands.
  void matmul(cudaDataType_t type, const void* a, int64_t a_stride, const void* b, int64_t ldb, int64_t b_stride,
              float* c, int64_t ldc, int64_t c_stride, int64_t rows, int64_t n, int64_t k, int64_t heads,
              cudaStream_t s, void* ws = nullptr, int64_t algo_rows = 0);

  // Side streams for Gemm::grouped, each with its own workspace (cuBLASLt workspaces must not be
  // shared by GEMMs that may run at once); made on first use, on the device current then.
  static constexpr int kSideStreams = 4;
  cudaStream_t side[kSideStreams] = {};
  void* side_ws[kSideStreams] = {};
  cudaEvent_t fork = nullptr, join[kSideStreams] = {};
};

void Gemm::Impl::matmul(cudaDataType_t type, const void* a, int64_t a_stride, const void* b, int64_t ldb,
                        int64_t b_stride, float* c, int64_t ldc, int64_t c_stride, int64_t rows, int64_t n, int64_t k,
                        int64_t heads, cudaStream_t s, void* ws, int64_t algo_rows) {
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
  // algo_rows (when set and not `rows`): the algorithm is looked up and cached for that many rows
  // instead (Gemm::grouped buckets expert sizes so that a new routing does not mean a new search).
  if (algo_rows <= 0) algo_rows = rows;
  // Null when a bucket size (r != rows) has no algorithm: the caller then searches the exact size.
  auto algo_for = [&](int64_t r) -> const cublasLtMatmulAlgo_t* {
    const auto key =
        std::make_tuple(r, n, k, ldb * (type == CUDA_R_32F ? -1 : 1), ldc, heads, a_stride, b_stride, c_stride);
    auto it = algos.find(key);
    if (it != algos.end()) return &it->second;
    cublasLtMatrixLayout_t qb = lb, qc = lc;  // layouts of r rows for the query
    if (r != rows) {
      KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&qb, type, static_cast<uint64_t>(k), static_cast<uint64_t>(r), ldb));
      KILN_CUBLAS_CHECK(
          cublasLtMatrixLayoutCreate(&qc, CUDA_R_32F, static_cast<uint64_t>(n), static_cast<uint64_t>(r), ldc));
    }
    cublasLtMatmulPreference_t pref;
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &workspace_size, sizeof(workspace_size)));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, op, la, qb, qc, qc, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (r != rows) {
      cublasLtMatrixLayoutDestroy(qb);
      cublasLtMatrixLayoutDestroy(qc);
    }
    if (r != rows && (st != CUBLAS_STATUS_SUCCESS || found == 0)) return nullptr;
    KILN_CUBLAS_CHECK(st);
    KILN_REQUIRE(found > 0, "cuBLASLt has no algorithm for a " + std::to_string(r) + "x" + std::to_string(n) + "x" +
                                std::to_string(k) + " GEMM (" + std::to_string(heads) + " heads)");
    return &algos.emplace(key, res.algo).first->second;
  };
  const float alpha = 1.0f, beta = 0.0f;
  void* w = ws ? ws : workspace;
  const cublasLtMatmulAlgo_t* algo = algo_for(algo_rows);
  cublasStatus_t st =
      algo ? cublasLtMatmul(handle, op, &alpha, a, la, b, lb, &beta, c, lc, c, lc, algo, w, workspace_size, s)
           : CUBLAS_STATUS_NOT_SUPPORTED;
  if (st != CUBLAS_STATUS_SUCCESS && algo_rows != rows)  // the bucket's algorithm does not fit: search this size
    st = cublasLtMatmul(handle, op, &alpha, a, la, b, lb, &beta, c, lc, c, lc, algo_for(rows), w, workspace_size, s);
  KILN_CUBLAS_CHECK(st);
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
  for (int i = 0; i < Impl::kSideStreams; ++i) {
    if (!impl_->side[i]) continue;
    cudaStreamDestroy(impl_->side[i]);
    cudaEventDestroy(impl_->join[i]);
    cudaFree(impl_->side_ws[i]);
  }
  if (impl_->fork) cudaEventDestroy(impl_->fork);
  cudaFree(impl_->workspace);
  cublasLtDestroy(impl_->handle);
  delete impl_;
}

void Gemm::linear_heads(const LinearHeadsParams& p, cudaStream_t s) {
  impl_->heads(p, nullptr, s);
}

void Gemm::Impl::heads(const LinearHeadsParams& p_in, const float* add, cudaStream_t s) {
  if (p_in.m == 0 || p_in.n == 0 || p_in.heads == 0 || p_in.k == 0) return;
  LinearHeadsParams p = p_in;  // stride 0: the dense [m, heads, k] / [m, heads, n] layout
  if (!p.x_stride) p.x_stride = p.heads * p.k;
  if (!p.y_stride) p.y_stride = p.heads * p.n;
  if (p.w_dtype == DType::BF16 && p.m <= kGemvMaxRows) {  // decode-sized: memory-bound GEMV, exact f32 x
    GemvFusion f;
    f.add = add;
    launch_gemv(p, f, s);
    return;
  }
  const int64_t ys = p.y_stride, xs = p.x_stride;
  if (p.w_dtype == DType::F32) {  // f32 weights (tests, the router gate): one plain f32 GEMM per head
    if (!add) {
      matmul(CUDA_R_32F, p.w, p.w_head_stride, p.x, xs, p.x_head_stride, p.y, ys, p.y_head_stride, p.m, p.n, p.k,
             p.heads, s);
      return;
    }
    float* t = tbuf.get<float>(static_cast<size_t>(p.heads * p.m * p.n));  // products, then + add into y
    matmul(CUDA_R_32F, p.w, p.w_head_stride, p.x, xs, p.x_head_stride, t, p.n, p.m * p.n, p.m, p.n, p.k, p.heads, s);
    const dim3 grid(blocks_for(p.m * p.n, 256), static_cast<unsigned>(p.heads));
    sum_halves_kernel<<<grid, 256, 0, s>>>(t, p.m, p.n, false, p.y, ys, p.y_head_stride, add);
    return;
  }
  KILN_REQUIRE(p.w_dtype == DType::BF16, std::string("linear: unsupported weight dtype ") + dtype_name(p.w_dtype));
  // bf16 weights: every head's x split into hi and lo rows, one batched GEMM, the halves summed.
  auto* xb = xbuf.get<__nv_bfloat16>(static_cast<size_t>(p.heads * 2 * p.m * p.k));
  float* t = tbuf.get<float>(static_cast<size_t>(p.heads * 2 * p.m * p.n));
  const dim3 split_grid(blocks_for(p.m * p.k, 256), static_cast<unsigned>(p.heads));
  split_bf16_kernel<<<split_grid, 256, 0, s>>>(p.x, xs, p.x_head_stride, xb, p.m, p.k);
  matmul(CUDA_R_16BF, p.w, p.w_head_stride, xb, p.k, 2 * p.m * p.k, t, p.n, 2 * p.m * p.n, 2 * p.m, p.n, p.k, p.heads,
         s);
  const dim3 sum_grid(blocks_for(p.m * p.n, 256), static_cast<unsigned>(p.heads));
  sum_halves_kernel<<<sum_grid, 256, 0, s>>>(t, p.m, p.n, true, p.y, ys, p.y_head_stride, add);
}

void Gemm::linear(const LinearParams& p, cudaStream_t s) {
  const int64_t xs = p.x_stride ? p.x_stride : p.k, ys = p.y_stride ? p.y_stride : p.n;
  LinearHeadsParams h{p.x, xs, 0, p.w, 0, p.w_dtype, p.y, ys, 0, 1, p.m, p.n, p.k};
  if (!p.norm_weight || p.m == 0 || p.n == 0 || p.k == 0) {
    impl_->heads(h, p.add, s);
    return;
  }
  KILN_REQUIRE(p.norm_weight_dtype == DType::F32 || p.norm_weight_dtype == DType::BF16,
               std::string("linear: unsupported norm weight dtype ") + dtype_name(p.norm_weight_dtype));
  if (p.w_dtype == DType::BF16 && p.m <= gemv_norm_max_rows()) {  // decode: the norm inside the GEMV
    GemvFusion f;
    f.norm_weight = p.norm_weight, f.norm_bf16 = p.norm_weight_dtype == DType::BF16, f.eps = p.norm_eps;
    f.residual = p.norm_residual, f.add = p.add;
    launch_gemv(h, f, s);
    return;
  }
  // More rows (the GEMV past gemv_norm_max_rows(), or a GEMM): the rms_norm op writes the
  // normalised rows (and the sums it requires) to scratch first.
  const int64_t sum_at = (p.m * p.k + 3) / 4 * 4;  // 16-byte aligned: rms_norm's float4 path
  float* xn = impl_->nbuf.get<float>(static_cast<size_t>(sum_at + (p.norm_residual ? p.m * xs : 0)));
  RmsNormParams n{p.x, xs, p.norm_weight, p.norm_weight_dtype, xn, p.k, p.m, p.k, p.norm_eps};
  if (p.norm_residual) n.residual = p.norm_residual, n.sum = xn + sum_at;
  rms_norm(n, s);
  h.x = xn, h.x_stride = p.k;
  impl_->heads(h, p.add, s);
}

void Gemm::grouped(const Group* groups, int64_t count, int64_t n, int64_t k, int64_t ldx, int64_t ldy, cudaStream_t s) {
  Impl& m = *impl_;
  if (!m.fork) {  // `fork` is set last: a failure part-way leaves the set-up to be retried
    for (int i = 0; i < Impl::kSideStreams; ++i) {
      if (!m.side[i]) KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&m.side[i], cudaStreamNonBlocking));
      if (!m.join[i]) KILN_CUDA_CHECK(cudaEventCreateWithFlags(&m.join[i], cudaEventDisableTiming));
      if (!m.side_ws[i]) KILN_CUDA_CHECK(cudaMalloc(&m.side_ws[i], m.workspace_size));
    }
    cudaEvent_t fork = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    m.fork = fork;
  }
  // One expert's GEMM fills only part of the GPU (1,536 doubled rows x 2816 at an 8k prefill are
  // ~130 tiles, some experts far fewer), so
  // consecutive groups go round-robin to side streams that run side by side, forked from and
  // joined back into `s` (the caller sees one ordered op).
  const int used = static_cast<int>(std::min<int64_t>(count, Impl::kSideStreams));
  KILN_CUDA_CHECK(cudaEventRecord(m.fork, s));
  for (int i = 0; i < used; ++i) KILN_CUDA_CHECK(cudaStreamWaitEvent(m.side[i], m.fork, 0));
  for (int64_t g = 0; g < count; ++g) {
    const Group& gr = groups[g];
    const int i = static_cast<int>(g % Impl::kSideStreams);
    int64_t bucket = 128;  // the algorithm of the next power of two: a handful of searches per shape
    while (bucket < gr.rows) bucket *= 2;
    m.matmul(CUDA_R_16BF, gr.w, 0, gr.x, ldx, 0, gr.y, ldy, 0, gr.rows, n, k, 1, m.side[i], m.side_ws[i], bucket);
  }
  for (int i = 0; i < used; ++i) {
    KILN_CUDA_CHECK(cudaEventRecord(m.join[i], m.side[i]));
    KILN_CUDA_CHECK(cudaStreamWaitEvent(s, m.join[i], 0));
  }
}

}  // namespace kiln::ops::cuda
