// Expanded MLA (prefill form): flash-attention over per-head k = (k_nope ‖ k_pe) and v, causal,
// variable-length sequences whose earlier context came from the paged cache (gathered).
//
// A CTA takes 16 query rows of one head and streams 32-key tiles through shared memory with an
// online softmax. Rows of a tile may belong to different sequences (at sequence boundaries); each
// row masks keys outside its own causal range. Any head count works: heads are a grid dimension.
#include <algorithm>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace kiln::ops::cuda {
namespace {

constexpr int kQ = 16;  // query rows per CTA
constexpr int kK = 32;  // keys per tile
constexpr int kThreads = 256;
constexpr int kMaxV = 256;  // v_head_dim limit: 256 threads x 16 rows x 1 column

__device__ int64_t seq_of_row(const int32_t* cu, int64_t num_seqs, int64_t row) {
  int64_t lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (cu[mid] <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// grid: (ceil(total_q / kQ), num_heads)
__global__ void __launch_bounds__(kThreads) mla_prefill_kernel(MlaExpandedParams p, int64_t total_q) {
  extern __shared__ float smem[];
  const int64_t qk = p.qk_dim, vd = p.v_dim, qpad = qk + 1, vpad = vd + 1;
  float* q_s = smem;                      // [kQ][qpad]
  float* k_s = q_s + kQ * qpad;           // [kK][qpad]
  float* v_s = k_s + kK * qpad;           // [kK][vpad]
  float* p_s = v_s + kK * vpad;           // [kQ][kK]
  float* sc_s = p_s + kQ * kK;            // [kQ]
  float* m_s = sc_s + kQ;                 // [kQ]
  float* l_s = m_s + kQ;                  // [kQ]
  __shared__ int64_t lo_s[kQ], hi_s[kQ];  // each row's key range [lo, hi) in the gathered k/v

  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kQ, h = blockIdx.y;
  const int tid = threadIdx.x;
  const int64_t nq = min(static_cast<int64_t>(kQ), total_q - q0);
  if (tid < kQ) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
    lo_s[tid] = 0;
    hi_s[tid] = 0;
    if (tid < nq) {
      const int64_t row = q0 + tid, b = seq_of_row(p.seqs.cu_q, p.seqs.num_seqs, row);
      const int64_t q_len = p.seqs.cu_q[b + 1] - p.seqs.cu_q[b];
      const int64_t kv0 = p.seqs.cu_kv[b], kv_len = p.seqs.cu_kv[b + 1] - kv0;
      lo_s[tid] = kv0;
      hi_s[tid] = kv0 + kv_len - q_len + (row - p.seqs.cu_q[b]) + 1;
    }
  }
  for (int64_t i = tid; i < kQ * qk; i += kThreads) {
    const int64_t r = i / qk, d = i % qk;
    q_s[r * qpad + d] = r < nq ? p.q[((q0 + r) * p.num_heads + h) * qk + d] : 0.0f;
  }
  __syncthreads();
  int64_t klo = INT64_MAX, khi = 0;
  for (int r = 0; r < nq; ++r) {
    klo = min(klo, lo_s[r]);
    khi = max(khi, hi_s[r]);
  }
  // Output: thread -> (row tid / 16, columns tid % 16 + 16 * c).
  const int orow = tid / 16, ocol = tid % 16;
  float acc[kMaxV / 16];
#pragma unroll
  for (int c = 0; c < kMaxV / 16; ++c) acc[c] = 0.0f;

  for (int64_t kb = klo; kb < khi; kb += kK) {
    const int64_t n = min(static_cast<int64_t>(kK), khi - kb);
    for (int64_t i = tid; i < n * qk; i += kThreads) {
      const int64_t r = i / qk, d = i % qk;
      k_s[r * qpad + d] = p.k[((kb + r) * p.num_heads + h) * qk + d];
    }
    for (int64_t i = tid; i < n * vd; i += kThreads) {
      const int64_t r = i / vd, d = i % vd;
      v_s[r * vpad + d] = p.v[((kb + r) * p.num_heads + h) * vd + d];
    }
    __syncthreads();
    for (int pair = tid; pair < kQ * kK; pair += kThreads) {  // scores
      const int r = pair / kK, c = pair % kK;
      const int64_t key = kb + c;
      float s = -INFINITY;
      if (r < nq && c < n && key >= lo_s[r] && key < hi_s[r]) {
        s = 0.0f;
        for (int64_t d = 0; d < qk; ++d) s += q_s[r * qpad + d] * k_s[c * qpad + d];
        s *= p.scale;
      }
      p_s[r * kK + c] = s;
    }
    __syncthreads();
    if (tid < kQ) {
      sc_s[tid] = online_softmax_step(p_s + tid * kK, kK, m_s[tid], l_s[tid]);
    }
    __syncthreads();
    const float sc = sc_s[orow];
#pragma unroll
    for (int c = 0; c < kMaxV / 16; ++c) {
      const int64_t col = ocol + 16 * c;
      if (col >= vd) break;
      float a = acc[c] * sc;
      for (int64_t j = 0; j < n; ++j) a += p_s[orow * kK + j] * v_s[j * vpad + col];
      acc[c] = a;
    }
    __syncthreads();
  }
  if (orow < nq) {
    const float inv = l_s[orow] > 0 ? 1.0f / l_s[orow] : 0.0f;
#pragma unroll
    for (int c = 0; c < kMaxV / 16; ++c) {
      const int64_t col = ocol + 16 * c;
      if (col >= vd) break;
      p.out[((q0 + orow) * p.num_heads + h) * vd + col] = acc[c] * inv;
    }
  }
}

}  // namespace

void mla_expanded(const MlaExpandedParams& p, cudaStream_t s) {
  const int64_t total_q = p.total_q;
  if (total_q == 0) return;
  KILN_REQUIRE(p.v_dim <= kMaxV,
               "mla_expanded: v_head_dim " + std::to_string(p.v_dim) + " exceeds " + std::to_string(kMaxV));
  const size_t smem =
      sizeof(float) * static_cast<size_t>((kQ + kK) * (p.qk_dim + 1) + kK * (p.v_dim + 1) + kQ * kK + 3 * kQ);
  static bool attr = [] {
    cudaFuncSetAttribute(mla_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024);
    return true;
  }();
  (void)attr;
  dim3 grid(static_cast<unsigned>((total_q + kQ - 1) / kQ), static_cast<unsigned>(p.num_heads));
  mla_prefill_kernel<<<grid, kThreads, smem, s>>>(p, total_q);
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kiln::ops::cuda
