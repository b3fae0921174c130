#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "gpu_ceilings.h"

namespace kiln::bench {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t e, const char* what) {
  if (e != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": cuBLASLt status " + std::to_string(e));
}

template <typename F>
float time_ms(F&& f, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  f();  // warm-up
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(b);
  check(cudaEventSynchronize(b), "timing");
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / static_cast<float>(reps);
}

}  // namespace

double measure_copy_gbps(double gib) {
  const size_t bytes = static_cast<size_t>(gib * (1ull << 30));
  void *src = nullptr, *dst = nullptr;
  check(cudaMalloc(&src, bytes), "cudaMalloc");
  check(cudaMalloc(&dst, bytes), "cudaMalloc");
  cudaMemset(src, 1, bytes);
  const float ms = time_ms([&] { cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice); }, 10);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

double measure_bf16_gemm_tflops(int m, int n, int k) {
  void *a = nullptr, *b = nullptr, *c = nullptr, *ws = nullptr;
  const size_t ws_size = 64u << 20;
  check(cudaMalloc(&a, static_cast<size_t>(m) * k * 2), "cudaMalloc");
  check(cudaMalloc(&b, static_cast<size_t>(k) * n * 2), "cudaMalloc");
  check(cudaMalloc(&c, static_cast<size_t>(m) * n * 2), "cudaMalloc");
  check(cudaMalloc(&ws, ws_size), "cudaMalloc");
  cudaMemset(a, 0x3c, static_cast<size_t>(m) * k * 2);  // small finite bf16 values
  cudaMemset(b, 0x3c, static_cast<size_t>(k) * n * 2);
  cublasLtHandle_t h;
  check(cublasLtCreate(&h), "cublasLtCreate");
  cublasLtMatmulDesc_t op;
  check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t));
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn));
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, m, k);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k);
  cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, m, n, m);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_size, sizeof(ws_size));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  check(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &res, &found), "heuristic");
  const float alpha = 1, beta = 0;
  const float ms = time_ms(
      [&] { cublasLtMatmul(h, op, &alpha, a, la, b, lb, &beta, c, lc, c, lc, &res.algo, ws, ws_size, nullptr); }, 20);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cudaFree(ws);
  return 2.0 * m * n * static_cast<double>(k) / (ms * 1e-3) / 1e12;
}

}  // namespace kiln::bench
