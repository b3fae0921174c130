// The MLA attention prologue in one launch: one CTA per new token rotates the rope slice of every
// query head and writes the token's latent row (RMS-normalised c_kv ‖ roped k_pe) into its pool
// slot. A decode step's tokens are few and these ops tiny, so launches, not bytes, were the cost of
// the five kernels this replaces. The arithmetic is the rope / rms_norm / kv_scatter kernels' own
// (rope_math.h, cuda_common.cuh). With the W_uk fold at <= 8 tokens, more CTAs of the same grid
// run it as a GEMV over W_uk (a decode step's tokens all share each weight row read), so the
// absorbed form's prologue is a single launch; more tokens fold through the batched GEMM first.
// No host sync, no scratch beyond the GEMM's own: graph-capturable.
#include <cstdint>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/pdl.cuh"
#include "ops/rope_math.h"

namespace kiln::ops::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int64_t kFoldMaxTokens = 8;  // more tokens fold through the batched GEMM (Gemm::linear_heads)

// Lanes that share one W_uk row: enough for one 8-value chunk each (a power of two, at most 32),
// so nope 128 puts two rows in a warp and every lane issues one 16-byte load.
int fold_lanes(int64_t nope) {
  int lanes = 1;
  while (lanes < 32 && lanes * 8 < nope) lanes *= 2;
  return lanes;
}

// The W_uk fold's share of the grid: CTA `cta` owns rows [row0, row0 + kWarps * 32 / lanes) of
// W_uk seen as [num_heads * kv_lora, nope] (row g = head g / kv_lora, latent column g % kv_lora; one
// contiguous span), `lanes` lanes a row, and dots each row with all num_tokens (<= 8) q_nope rows.
__device__ void fold_rows(const MlaPrepareParams& p, int64_t cta, int lanes) {
  const bool bf16 = p.w_uk_dtype == DType::BF16;
  const int64_t esz = bf16 ? 2 : 4, per_warp = 32 / lanes, total = p.num_heads * p.kv_lora;
  const int64_t row0 = cta * kWarps * per_warp;
  if (threadIdx.x == 0) {  // weights are constant: start pulling this CTA's span before the wait
    const char* span = static_cast<const char*>(p.w_uk) + row0 * p.nope_dim * esz;
    const int64_t bytes = min(kWarps * per_warp, total - row0) * p.nope_dim * esz;
    if (aligned16(span) && bytes % 16 == 0) prefetch_l2(span, static_cast<uint32_t>(bytes));
  }
  pdl_wait();  // q_nope is the previous kernel's output, and nothing may be written before this
  pdl_trigger();
  const int lane = threadIdx.x & 31, sub = lane % lanes;
  const int64_t g = row0 + (threadIdx.x >> 5) * per_warp + lane / lanes;
  const bool valid = g < total;
  const int64_t h = valid ? g / p.kv_lora : 0, c = g - h * p.kv_lora;
  const int tokens = static_cast<int>(p.num_tokens);
  const float* x = p.q_nope + h * p.q_in_head_stride;  // token t's q_nope of head h at x + t * q_in_stride
  float acc[kFoldMaxTokens];
#pragma unroll
  for (int t = 0; t < kFoldMaxTokens; ++t) acc[t] = 0.0f;
  // 16-byte loads need 8-value chunks of bf16 weights and float4-aligned q_nope rows; the rest
  // (f32 weights in tests, odd shapes) reads scalars.
  const bool vec = bf16 && p.nope_dim % 8 == 0 && aligned16(p.w_uk) && aligned16(p.q_nope) && p.q_in_stride % 4 == 0 &&
                   p.q_in_head_stride % 4 == 0;
  if (valid && vec) {
    const uint4* w4 = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.w_uk) + g * p.nope_dim);
    for (int64_t i = sub; i < p.nope_dim / 8; i += lanes)
      dot8_accumulate<kFoldMaxTokens>(__ldcs(w4 + i), x, p.q_in_stride, i * 8, tokens,
                                      acc);  // streamed once: keep L2 for q
  } else if (valid) {
    for (int64_t i = sub; i < p.nope_dim; i += lanes) {
      const float wv = load_w(p.w_uk, g * p.nope_dim + i, bf16);
#pragma unroll
      for (int t = 0; t < kFoldMaxTokens; ++t)
        if (t < tokens) acc[t] += wv * x[t * p.q_in_stride + i];
    }
  }
  // Each row's `lanes` lanes are aligned in the warp: xor shuffles below `lanes` stay inside it.
  // Every lane shuffles (invalid rows hold zeros), so the full mask is exact.
#pragma unroll
  for (int t = 0; t < kFoldMaxTokens; ++t) {
    if (t >= tokens) break;
    float v = acc[t];
    for (int o = lanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (valid && sub == 0) p.q_lat[t * p.q_out_stride + h * p.q_out_head_stride + c] = v;
  }
}

// Blocks [0, num_tokens): one token's prologue each. Blocks beyond (only with the fold at <= 8
// tokens): fold_rows, `lanes` lanes a W_uk row.
__global__ void __launch_bounds__(kThreads) mla_prepare_kernel(MlaPrepareParams p, int lanes) {
  extern __shared__ RopeCosSin rot_s[];  // [rope_dim / 2]: this token's rotation of each pair
  __shared__ float red[32];
  if (blockIdx.x >= p.num_tokens) {  // uniform per CTA: no barrier below is split
    fold_rows(p, blockIdx.x - p.num_tokens, lanes);
    return;
  }
  pdl_wait();  // PDL: the previous kernel's outputs are visible from here on
  pdl_trigger();
  const int64_t t = blockIdx.x, half = p.rope_dim / 2;
  for (int64_t i = threadIdx.x; i < half; i += kThreads)
    rot_s[i] = rope_cos_sin(p.inv_freq[i], p.positions[t], p.attention_factor);
  trace_phase(0);  // kernel trace (CTA 0: token 0): rotation, norm, latent row written, q_pe written

  // The latent row. block_rms_inv's barriers also publish rot_s for everything below.
  const float* kva = p.kva + t * p.kva_stride;
  float sum_sq = 0;
  for (int64_t i = threadIdx.x; i < p.kv_lora; i += kThreads) sum_sq += kva[i] * kva[i];
  const float inv = block_rms_inv(sum_sq, p.kv_lora, p.eps, red);
  trace_phase(1);
  const bool w_bf16 = p.norm_weight_dtype == DType::BF16, pool_bf16 = p.pool_dtype == DType::BF16;
  const int64_t dst = static_cast<int64_t>(p.slots[t]) * (p.kv_lora + p.rope_dim);
  for (int64_t i = threadIdx.x; i < p.kv_lora; i += kThreads)
    store_kv(p.pool, dst + i, load_w(p.norm_weight, i, w_bf16) * (kva[i] * inv), pool_bf16);
  for (int64_t i = threadIdx.x; i < half; i += kThreads) {
    const RopePair ab = rope_pair(i, half, p.interleaved);
    float xa = kva[p.kv_lora + ab.a], xb = kva[p.kv_lora + ab.b];
    rope_rotate(xa, xb, rot_s[i]);
    store_kv(p.pool, dst + p.kv_lora + ab.a, xa, pool_bf16);
    store_kv(p.pool, dst + p.kv_lora + ab.b, xb, pool_bf16);
  }
  trace_phase(2);

  // q_pe of every head: each thread reads its pair before writing it, so q_out may be q_in.
  for (int64_t j = threadIdx.x; j < p.num_heads * half; j += kThreads) {
    const int64_t h = j / half, i = j % half;
    const RopePair ab = rope_pair(i, half, p.interleaved);
    const float* q = p.q_in + t * p.q_in_stride + h * p.q_in_head_stride;
    float* out = p.q_out + t * p.q_out_stride + h * p.q_out_head_stride;
    float xa = q[ab.a], xb = q[ab.b];
    rope_rotate(xa, xb, rot_s[i]);
    out[ab.a] = xa;
    out[ab.b] = xb;
  }
  trace_phase(3);
}

}  // namespace

void mla_prepare(const MlaPrepareParams& p_in, Gemm& gemm, cudaStream_t s) {
  KILN_REQUIRE(p_in.pool_dtype == DType::F32 || p_in.pool_dtype == DType::BF16,
               std::string("mla_prepare: unsupported pool dtype ") + dtype_name(p_in.pool_dtype));
  KILN_REQUIRE(p_in.rope_dim % 2 == 0, "mla_prepare: rope_dim " + std::to_string(p_in.rope_dim) + " is odd");
  if (p_in.num_tokens == 0) return;
  MlaPrepareParams p = p_in;
  int64_t fold_ctas = 0;
  int lanes = 1;
  if (p.w_uk) {
    KILN_REQUIRE(p.w_uk_dtype == DType::BF16 || p.w_uk_dtype == DType::F32,
                 std::string("mla_prepare: unsupported w_uk dtype ") + dtype_name(p.w_uk_dtype));
    KILN_REQUIRE(p.q_nope && p.q_lat && p.nope_dim > 0, "mla_prepare: the W_uk fold needs q_nope, q_lat and nope_dim");
    if (p.num_tokens > kFoldMaxTokens) {  // prefill-sized: tensor cores, then the prologue alone
      gemm.linear_heads(
          {p.q_nope, p.q_in_stride, p.q_in_head_stride, p.w_uk, p.kv_lora * p.nope_dim, p.w_uk_dtype, p.q_lat,
           p.q_out_stride, p.q_out_head_stride, p.num_heads, p.num_tokens, p.kv_lora, p.nope_dim},
          s);
      p.w_uk = nullptr;
    } else {
      lanes = fold_lanes(p.nope_dim);
      const int64_t rows_per_cta = kWarps * (32 / lanes);
      fold_ctas = (p.num_heads * p.kv_lora + rows_per_cta - 1) / rows_per_cta;
    }
  }
  const size_t smem = sizeof(RopeCosSin) * static_cast<size_t>(p.rope_dim / 2);
  launch_pdl(mla_prepare_kernel, dim3(static_cast<unsigned>(p.num_tokens + fold_ctas)), dim3(kThreads), smem, s, p,
             lanes);
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kiln::ops::cuda
