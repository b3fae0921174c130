// y = x · wᵀ through OpenBLAS; non-f32 weights (quantized ones included: ops/quant.h) are
// widened to exact f32 in row panels first. A fused input norm and addend are composed from
// rms_norm, the GEMM and an add: the reference semantics.
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/quant.h"

namespace kiln::ops::cpu {
namespace {

void gemm(const LinearParams& p) {
  const int64_t xs = p.x_stride ? p.x_stride : p.k, ys = p.y_stride ? p.y_stride : p.n;
  if (p.w_dtype == DType::F32 && !p.w_scales.quantized()) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(p.m), static_cast<int>(p.n),
                static_cast<int>(p.k), 1.0f, p.x, static_cast<int>(xs), static_cast<const float*>(p.w),
                static_cast<int>(p.k), 0.0f, p.y, static_cast<int>(ys));
    return;
  }
  // Widen 256 weight rows at a time: bounded scratch, still GEMM-shaped.
  const int64_t panel = 256;
  std::vector<float> wf(static_cast<size_t>(std::min(panel, p.n) * p.k));
  for (int64_t n0 = 0; n0 < p.n; n0 += panel) {
    const int64_t nn = std::min(panel, p.n - n0);
    dequantize_rows(p.w, p.w_dtype, p.w_scales, p.n, p.k, n0, nn, wf.data());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(p.m), static_cast<int>(nn),
                static_cast<int>(p.k), 1.0f, p.x, static_cast<int>(xs), wf.data(), static_cast<int>(p.k), 0.0f,
                p.y + n0, static_cast<int>(ys));
  }
}

}  // namespace

void linear(const LinearParams& p) {
  check_weight("linear", p.w_dtype, p.w_scales);
  if (p.m == 0 || p.n == 0) return;
  const int64_t xs = p.x_stride ? p.x_stride : p.k, ys = p.y_stride ? p.y_stride : p.n;
  if (p.norm_weight) {  // normalise into a contiguous temporary, then the plain GEMM
    std::vector<float> xn(static_cast<size_t>(p.m * p.k));
    RmsNormParams n{p.x, xs, p.norm_weight, p.norm_weight_dtype, xn.data(), p.k, p.m, p.k, p.norm_eps};
    n.residual = p.norm_residual;
    rms_norm(n);
    LinearParams q = p;
    q.x = xn.data(), q.x_stride = p.k;
    gemm(q);
  } else {
    gemm(p);
  }
  if (p.add)
    for (int64_t r = 0; r < p.m; ++r)
      for (int64_t c = 0; c < p.n; ++c) p.y[r * ys + c] += p.add[r * ys + c];
}

void linear_heads(const LinearHeadsParams& p) {
  const size_t esz = dtype_size(p.w_dtype), ssz = dtype_size(p.w_scales.dtype);
  const int64_t xs = p.x_stride ? p.x_stride : p.heads * p.k, ys = p.y_stride ? p.y_stride : p.heads * p.n;
  for (int64_t h = 0; h < p.heads; ++h) {
    LinearParams l{p.x + h * p.x_head_stride,
                   xs,
                   static_cast<const char*>(p.w) + static_cast<size_t>(h * p.w_head_stride) * esz,
                   p.w_dtype,
                   p.y + h * p.y_head_stride,
                   ys,
                   p.m,
                   p.n,
                   p.k};
    l.w_scales = p.w_scales;
    if (p.w_scales.quantized())
      l.w_scales.data =
          static_cast<const char*>(p.w_scales.data) + static_cast<size_t>(h * p.w_scale_head_stride) * ssz;
    linear(l);
  }
}

}  // namespace kiln::ops::cpu
