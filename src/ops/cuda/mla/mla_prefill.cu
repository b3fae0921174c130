// Expanded MLA (prefill form): flash-attention over per-head k = (k_nope ‖ k_pe) and v, causal,
// variable-length sequences whose earlier context came from the paged cache (gathered). k_nope and v
// come from the kv_b_proj output (per head k_nope ‖ v), the shared k_pe from the gathered latent rows.
//
// Two kernels:
//  - qk 192 / v 128 (every DeepSeek-V3-family checkpoint): flash attention on Hopper warpgroup MMAs
//    (mla_prefill_wgmma.cuh) over bf16 tile images of K and Vᵀ made once per call.
//  - any other head dims (small test configs): the f32 CUDA-core kernel mla_prefill_kernel below,
//    which assembles key rows in shared memory from the two sources.
//
// The f32 kernel: a CTA takes 16 query rows of one head and streams 32-key tiles through shared
// memory with an online softmax. Rows of a tile may belong to different sequences (at sequence
// boundaries); each row masks keys outside its own causal range. Any head count works: heads are a
// grid dimension.
#include <algorithm>
#include <cstdint>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/env.h"
#include "ops/cuda/mla/mla_prefill_wgmma.cuh"

namespace kiln::ops::cuda {
namespace {

constexpr int kQ = 16;  // query rows per CTA
constexpr int kK = 32;  // keys per tile
constexpr int kThreads = 256;
constexpr int kMaxV = 256;  // v_head_dim limit: 256 threads x 16 rows x 1 column

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
      const int64_t row = q0 + tid, b = seq_of(p.seqs.cu_q, p.seqs.num_seqs, row);
      const int64_t q_len = p.seqs.cu_q[b + 1] - p.seqs.cu_q[b];
      const int64_t kv0 = p.seqs.cu_kv[b], kv_len = p.seqs.cu_kv[b + 1] - kv0;
      lo_s[tid] = kv0;
      hi_s[tid] = kv0 + kv_len - q_len + (row - p.seqs.cu_q[b]) + 1;
    }
  }
  for (int64_t i = tid; i < kQ * qk; i += kThreads) {
    const int64_t r = i / qk, d = i % qk;
    q_s[r * qpad + d] = r < nq ? p.q[(q0 + r) * p.q_stride + h * qk + d] : 0.0f;
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

  // Key row j of this head: columns [0, nope) from kv_b, [nope, qk) from the shared k_pe; value
  // row j: kv_b's columns [nope, nope + vd) of this head.
  const int64_t nope = p.nope_dim;
  const float* kvb_h = p.kv_b + h * (nope + vd);  // row j at kvb_h + j * kv_b_stride
  for (int64_t kb = klo; kb < khi; kb += kK) {
    const int64_t n = min(static_cast<int64_t>(kK), khi - kb);
    for (int64_t i = tid; i < n * qk; i += kThreads) {
      const int64_t r = i / qk, d = i % qk;
      k_s[r * qpad + d] =
          d < nope ? kvb_h[(kb + r) * p.kv_b_stride + d] : p.k_pe[(kb + r) * p.k_pe_stride + (d - nope)];
    }
    for (int64_t i = tid; i < n * vd; i += kThreads) {
      const int64_t r = i / vd, d = i % vd;
      v_s[r * vpad + d] = kvb_h[(kb + r) * p.kv_b_stride + nope + d];
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

// qk 192 / v 128 with 16-byte aligned tensors (always, from the allocator), q, kv_b and k_pe rows a
// multiple of 4 floats apart and nope_dim a multiple of 8 (the model's k_pe: columns 512.. of
// 576-wide latent rows) take the tensor cores; anything else the f32 kernel.
bool uses_wgmma(const MlaExpandedParams& p) {
  namespace fa = mla_prefill_wgmma;
  return p.qk_dim == fa::kQk && p.v_dim == fa::kV && p.nope_dim % 8 == 0 && aligned16(p.q) && p.q_stride % 4 == 0 &&
         aligned16(p.kv_b) && p.kv_b_stride % 4 == 0 && aligned16(p.k_pe) && p.k_pe_stride % 4 == 0 && aligned16(p.out);
}

// Tile images per round of heads: all heads at once up to ~16 heads x 8k tokens (84 MB for
// Moonlight's 16 heads at 8,192 tokens), DeepSeek-V3's 128 heads in rounds of 43 at 8k (the budget
// allows 50; rounds are evened out). A soft bound: a round has at least one head, whose images
// take 640 bytes per token (~640 MB at a million tokens), and GrowOnlyScratch keeps its peak.
constexpr int64_t kImageBudget = int64_t{256} << 20;

// Per group of heads whose tile images fit kImageBudget: the images, then the flash kernel.
void mla_expanded_wgmma(const MlaExpandedParams& p, cudaStream_t s) {
  namespace fa = mla_prefill_wgmma;
  // A/B switches, read per call so that tests can vary them (results are identical either way):
  // KILN_MLA_PREFILL_STAGES, key tile stages (4 by default: 2 tiles loading ahead; 3: 1 tile);
  // KILN_MLA_PREFILL_GROUP_HEADS, heads per round of images (0: as many as kImageBudget allows).
  const int stages = static_cast<int>(env_int("KILN_MLA_PREFILL_STAGES", 4, 3, 4));
  const int64_t max_group = env_int("KILN_MLA_PREFILL_GROUP_HEADS", 0, 0);
  struct Depth {
    decltype(&fa::flash_kernel<3>) kernel;
    size_t smem;
  };
  static const Depth depths[] = {{fa::flash_kernel<3>, fa::smem_bytes<3>()},
                                 {fa::flash_kernel<4>, fa::smem_bytes<4>()}};
  static SmemGrants smem_done[2];
  const auto [kernel, smem] = depths[stages - 3];
  allow_smem(kernel, static_cast<int>(smem), smem_done[stages - 3]);

  const int64_t H = p.num_heads, blocks = fa::max_blocks(p.total_kv, p.seqs.num_seqs);
  int64_t group = std::clamp<int64_t>(kImageBudget / (blocks * fa::kTileImage), 1, H);
  if (max_group > 0) group = std::min(group, max_group);
  const int64_t rounds = (H + group - 1) / group;
  group = (H + rounds - 1) / rounds;  // the same rounds, evened out
  static GrowOnlyScratch img_buf;
  auto* img = img_buf.get<unsigned char>(static_cast<size_t>(blocks * group * fa::kTileImage));
  const int64_t ctas = p.total_q / fa::kBM + p.seqs.num_seqs;
  for (int64_t h0 = 0; h0 < H; h0 += group) {
    const auto hg = static_cast<unsigned>(std::min(group, H - h0));
    fa::tile_images_kernel<<<dim3(static_cast<unsigned>(blocks), hg), fa::kThreads, 0, s>>>(
        p.kv_b, p.kv_b_stride, h0, p.nope_dim, p.k_pe, p.k_pe_stride, p.seqs, img);
    const fa::Params fp{p.q, p.q_stride, img, blocks, p.out, p.seqs, H, h0, p.scale};
    kernel<<<dim3(static_cast<unsigned>(ctas), hg), fa::kThreads, smem, s>>>(fp);
    KILN_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

void mla_expanded(const MlaExpandedParams& params, cudaStream_t s) {
  MlaExpandedParams p = params;
  KILN_REQUIRE(p.nope_dim >= 0 && p.nope_dim <= p.qk_dim,
               "mla_expanded: nope_dim " + std::to_string(p.nope_dim) + " outside qk_dim " + std::to_string(p.qk_dim));
  // The kernels read explicit rows.
  if (p.q_stride == 0) p.q_stride = p.num_heads * p.qk_dim;
  if (p.kv_b_stride == 0) p.kv_b_stride = p.num_heads * (p.nope_dim + p.v_dim);
  if (p.k_pe_stride == 0) p.k_pe_stride = p.qk_dim - p.nope_dim;
  const int64_t total_q = p.total_q;
  if (total_q == 0 || p.num_heads == 0) return;
  KILN_REQUIRE(p.total_kv >= total_q, "mla_expanded: total_kv " + std::to_string(p.total_kv) +
                                          " (cu_kv[num_seqs]) is less than total_q " + std::to_string(total_q));
  if (uses_wgmma(p)) {
    mla_expanded_wgmma(p, s);
    return;
  }
  KILN_REQUIRE(p.v_dim <= kMaxV,
               "mla_expanded: v_head_dim " + std::to_string(p.v_dim) + " exceeds " + std::to_string(kMaxV));
  const size_t smem =
      sizeof(float) * static_cast<size_t>((kQ + kK) * (p.qk_dim + 1) + kK * (p.v_dim + 1) + kQ * kK + 3 * kQ);
  static SmemGrants smem_done;
  allow_smem(mla_prefill_kernel, 160 * 1024, smem_done);
  dim3 grid(static_cast<unsigned>((total_q + kQ - 1) / kQ), static_cast<unsigned>(p.num_heads));
  mla_prefill_kernel<<<grid, kThreads, smem, s>>>(p, total_q);
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kiln::ops::cuda
