// Decode GEMVs over quantized weights (FP8 e4m3 with block scales, INT4 words with group scales;
// bf16 too, through the same loop): y = x · wᵀ (+ add) for up to 8 rows of f32 activations, every
// head of a LinearHeadsParams in one launch. Bound by the weight bytes as gemv.cu's kernels are, and
// shaped like its gemv_kernel: one warp per weight row, 4 16-byte loads in flight per lane (FP8: 16
// columns a load, INT4: 32), the row decoded in registers and each chunk's dot product scaled once.
// More rows than quant_gemv_max_rows(): the weight expanded to bf16 scratch and the bf16 GEMM.
#include <algorithm>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/env.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/quant/quant.cuh"
#include "ops/cuda/quant/quant_ops.h"
#include "ops/quant.h"

namespace kiln::ops::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxRows = 8;  // activation rows a launch

struct GemvArgs {
  quant::QView q;  // matrix h = head h
  const float* x;  // row t of head h at x + t * xs + h * x_head
  int64_t xs, x_head;
  float* y;  // [m, heads, n]: y + t * ys + h * y_head + r
  int64_t ys, y_head;
  const float* add;  // laid out as y (null: none)
  int64_t n;
  int32_t rows;  // <= M
  bool xvec;     // x, xs and x_head allow 16-byte loads
};

template <int M>
__global__ void __launch_bounds__(kWarps * 32) quant_gemv_kernel(GemvArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kWarps, r = r0 + (threadIdx.x >> 5), h = blockIdx.y;
  if (threadIdx.x == 0 && a.q.vec)  // weights are constant: start the CTA's rows towards L2 before the wait
    prefetch_l2(a.q.w + h * a.q.mat_bytes + r0 * a.q.row_bytes,
                static_cast<uint32_t>(min(static_cast<int64_t>(kWarps), a.n - r0) * a.q.row_bytes));
  pdl_wait();  // activations (x, add) only from here on
  pdl_trigger();
  if (r >= a.n) return;
  float acc[1][M] = {};
  const int64_t rr[1] = {r};
  quant::rows_dot<M, 1>(a.q, h, rr, a.x + h * a.x_head, a.xs, a.rows, a.xvec, lane, acc);
#pragma unroll
  for (int t = 0; t < M; ++t) {
    if (t >= a.rows) break;
    const float v = warp_sum(acc[0][t]);
    const int64_t o = t * a.ys + h * a.y_head + r;
    if (lane == 0) a.y[o] = a.add ? v + a.add[o] : v;
  }
}

// m rows of p (strides resolved), 8 at a time.
void launch(const quant::QView& q, const LinearHeadsParams& p, const float* add, cudaStream_t s) {
  using Kernel = void (*)(GemvArgs);
  static const Kernel kernels[] = {quant_gemv_kernel<1>, quant_gemv_kernel<2>, quant_gemv_kernel<3>,
                                   quant_gemv_kernel<4>, quant_gemv_kernel<5>, quant_gemv_kernel<6>,
                                   quant_gemv_kernel<7>, quant_gemv_kernel<8>};
  KILN_REQUIRE(p.heads < 65536, "quantized GEMV: " + std::to_string(p.heads) + " heads exceed the grid");
  const bool xvec = aligned16(p.x) && p.x_stride % 4 == 0 && p.x_head_stride % 4 == 0;
  for (int64_t t0 = 0; t0 < p.m; t0 += kMaxRows) {
    const int64_t rows = std::min<int64_t>(kMaxRows, p.m - t0);
    GemvArgs a{q,
               p.x + t0 * p.x_stride,
               p.x_stride,
               p.x_head_stride,
               p.y + t0 * p.y_stride,
               p.y_stride,
               p.y_head_stride,
               add ? add + t0 * p.y_stride : nullptr,
               p.n,
               static_cast<int32_t>(rows),
               xvec};
    launch_pdl(kernels[rows - 1], dim3(blocks_for(p.n, kWarps), static_cast<unsigned>(p.heads)), dim3(kWarps * 32), 0,
               s, a);
  }
  KILN_CUDA_CHECK(cudaGetLastError());
}

GrowOnlyScratch& weight_scratch() {  // dequantized bf16 weights of the prefill path
  static GrowOnlyScratch b;
  return b;
}

}  // namespace

int64_t quant_gemv_max_rows() {
  // Past this the GEMV reads the weights once per 8 rows; the bf16 expansion reads them once and
  // writes and reads 2 bytes a weight more. Read per call so tests can cover both paths.
  return env_int("KILN_QUANT_GEMV_MAX_ROWS", 32, 0);
}

bool linear_quantized(const LinearParams& p) {
  return quant::is_quantized(p.w_dtype, p.w_scales);
}
bool linear_heads_quantized(const LinearHeadsParams& p) {
  return quant::is_quantized(p.w_dtype, p.w_scales);
}

void quant_linear(const LinearParams& p, Gemm& gemm, cudaStream_t s) {
  if (p.m == 0 || p.n == 0) return;
  KILN_REQUIRE(p.m > 0 && p.n > 0 && p.k > 0, "linear: negative or zero sizes");
  const quant::QView q = quant::make_view("linear", p.w, p.w_dtype, p.w_scales, p.k, 0, 0);
  if (p.m > quant_gemv_max_rows()) {
    auto* wb = weight_scratch().get<__nv_bfloat16>(static_cast<size_t>(p.n * p.k));
    quant::dequantize_bf16(q, 1, p.n, wb, s);
    LinearParams b = p;
    b.w = wb, b.w_dtype = DType::BF16, b.w_scales = {};
    gemm.linear(b, s);
    return;
  }
  const int64_t xs = p.x_stride ? p.x_stride : p.k, ys = p.y_stride ? p.y_stride : p.n;
  LinearHeadsParams h{p.x, xs, 0, p.w, 0, p.w_dtype, p.y, ys, 0, 1, p.m, p.n, p.k};
  if (p.norm_weight) {  // the norm first, into scratch, as Gemm::linear does for its GEMV
    static GrowOnlyScratch nbuf;
    float* xn = nbuf.get<float>(static_cast<size_t>(p.m * p.k));
    RmsNormParams n{p.x, xs, p.norm_weight, p.norm_weight_dtype, xn, p.k, p.m, p.k, p.norm_eps};
    n.residual = p.norm_residual;
    rms_norm(n, s);
    h.x = xn, h.x_stride = p.k;
  }
  launch(q, h, p.add, s);
}

void quant_linear_heads(const LinearHeadsParams& p_in, Gemm& gemm, cudaStream_t s) {
  if (p_in.m == 0 || p_in.n == 0 || p_in.heads == 0) return;
  LinearHeadsParams p = p_in;
  if (!p.x_stride) p.x_stride = p.heads * p.k;
  if (!p.y_stride) p.y_stride = p.heads * p.n;
  const quant::QView q =
      quant::make_view("linear_heads", p.w, p.w_dtype, p.w_scales, p.k, p.w_head_stride, p.w_scale_head_stride);
  if (p.m > quant_gemv_max_rows()) {
    auto* wb = weight_scratch().get<__nv_bfloat16>(static_cast<size_t>(p.heads * p.n * p.k));
    quant::dequantize_bf16(q, p.heads, p.n, wb, s);
    p.w = wb, p.w_dtype = DType::BF16, p.w_head_stride = p.n * p.k, p.w_scales = {}, p.w_scale_head_stride = 0;
    gemm.linear_heads(p, s);
    return;
  }
  launch(q, p, nullptr, s);
}

}  // namespace kiln::ops::cuda
