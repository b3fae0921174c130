// The quantized-weight views (quant.cuh) and the dequantizing row pass that the prefill-sized paths
// use: a weight expanded to bf16 in scratch, then the existing bf16 GEMMs. Correct first: each
// scaled value is rounded to bf16 once (relative error <= 2^-9), and the expansion costs a write
// and a read of 2 bytes per weight on top of the GEMM; a block-scaled FP8 wgmma GEMM would not.
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/quant/quant.cuh"
#include "ops/quant.h"

namespace kiln::ops::cuda::quant {
namespace {

// One CTA per (row r = blockIdx.x, matrix = blockIdx.y); threads stride over the row's columns.
template <Fmt F>
__global__ void dequantize_kernel(QView q, int64_t n, __nv_bfloat16* out) {
  const int64_t r = blockIdx.x, mat = blockIdx.y;
  pdl_wait();  // out may still be read by the kernel before (a previous layer's GEMM)
  pdl_trigger();
  const uint8_t* row = q.w + mat * q.mat_bytes + r * q.row_bytes;
  const int64_t srow = q.scale ? r / q.block_n * q.grid_k + mat * q.scale_mat : 0;
  __nv_bfloat16* o = out + (mat * n + r) * q.k;
  for (int64_t c = threadIdx.x; c < q.k; c += blockDim.x)
    o[c] = __float2bfloat16_rn(raw_value<F>(row, c) * scale_at(q, srow, c));
}

}  // namespace

QView make_view(const char* what, const void* w, DType t, const WeightScales& s, int64_t k, int64_t mat_elems,
                int64_t scale_mat_elems) {
  KILN_REQUIRE(w != nullptr, std::string(what) + ": null weight");
  KILN_REQUIRE(t == DType::BF16 || t == DType::F8E4M3 || t == DType::I4X8,
               std::string(what) + ": CUDA takes bf16, F8_E4M3 or I4X8 weights here, got " + dtype_name(t));
  check_weight(what, t, s);
  KILN_REQUIRE(k > 0 && k < (int64_t{1} << 31), std::string(what) + ": k out of range");
  QView q;
  q.w = static_cast<const uint8_t*>(w);
  q.k = k;
  q.fmt = t == DType::BF16 ? Fmt::BF16 : (t == DType::F8E4M3 ? Fmt::FP8 : Fmt::INT4);
  q.row_bytes = weight_row_elems(t, k) * static_cast<int64_t>(dtype_size(t));
  q.mat_bytes = mat_elems * static_cast<int64_t>(dtype_size(t));
  if (s.quantized()) {
    KILN_REQUIRE(s.block_n < (int64_t{1} << 31) && s.block_k < (int64_t{1} << 31),
                 std::string(what) + ": scale blocks out of range");
    q.scale = s.data;
    q.scale_bf16 = s.dtype == DType::BF16;
    q.block_n = static_cast<int32_t>(s.block_n), q.block_k = static_cast<int32_t>(s.block_k);
    q.grid_k = (k + s.block_k - 1) / s.block_k;
    q.scale_mat = scale_mat_elems;
  }
  const int cols = q.fmt == Fmt::BF16 ? 8 : (q.fmt == Fmt::FP8 ? 16 : 32);
  q.vec = k % cols == 0 && (!q.scale || q.block_k % cols == 0) && aligned16(w) && q.row_bytes % 16 == 0 &&
          q.mat_bytes % 16 == 0;
  return q;
}

void dequantize_bf16(const QView& q, int64_t mats, int64_t n, __nv_bfloat16* out, cudaStream_t s) {
  if (mats == 0 || n == 0) return;
  KILN_REQUIRE(n < (int64_t{1} << 31) && mats < 65536,
               "dequantize: " + std::to_string(mats) + " x " + std::to_string(n) + " rows exceed the grid");
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(mats));
  const int threads = row_threads(q.k);
  switch (q.fmt) {
    case Fmt::BF16: launch_pdl(dequantize_kernel<Fmt::BF16>, grid, dim3(threads), 0, s, q, n, out); break;
    case Fmt::FP8: launch_pdl(dequantize_kernel<Fmt::FP8>, grid, dim3(threads), 0, s, q, n, out); break;
    case Fmt::INT4: launch_pdl(dequantize_kernel<Fmt::INT4>, grid, dim3(threads), 0, s, q, n, out); break;
  }
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kiln::ops::cuda::quant
