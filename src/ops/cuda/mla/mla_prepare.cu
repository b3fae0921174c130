// The MLA attention prologue in one launch: one CTA per new token rotates the rope slice of every
// query head and writes the token's latent row (RMS-normalised c_kv ‖ roped k_pe) into its pool
// slot. A decode step's tokens are few and these ops tiny, so launches, not bytes, were the cost of
// the five kernels this replaces. The arithmetic is the rope / rms_norm / kv_scatter kernels' own
// (rope_math.h, cuda_common.cuh). No scratch, no host sync: graph-capturable.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/pdl.cuh"
#include "ops/rope_math.h"

namespace kiln::ops::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) mla_prepare_kernel(MlaPrepareParams p) {
  extern __shared__ RopeCosSin rot_s[];  // [rope_dim / 2]: this token's rotation of each pair
  __shared__ float red[32];
  pdl_wait();  // PDL: the previous kernel's outputs are visible from here on
  pdl_trigger();
  const int64_t t = blockIdx.x, half = p.rope_dim / 2;
  for (int64_t i = threadIdx.x; i < half; i += kThreads)
    rot_s[i] = rope_cos_sin(p.inv_freq[i], p.positions[t], p.attention_factor);

  // The latent row. block_rms_inv's barriers also publish rot_s for everything below.
  const float* kva = p.kva + t * p.kva_stride;
  float sum_sq = 0;
  for (int64_t i = threadIdx.x; i < p.kv_lora; i += kThreads) sum_sq += kva[i] * kva[i];
  const float inv = block_rms_inv(sum_sq, p.kv_lora, p.eps, red);
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
}

}  // namespace

void mla_prepare(const MlaPrepareParams& p, cudaStream_t s) {
  KILN_REQUIRE(p.pool_dtype == DType::F32 || p.pool_dtype == DType::BF16,
               std::string("mla_prepare: unsupported pool dtype ") + dtype_name(p.pool_dtype));
  KILN_REQUIRE(p.rope_dim % 2 == 0, "mla_prepare: rope_dim " + std::to_string(p.rope_dim) + " is odd");
  if (p.num_tokens == 0) return;
  const size_t smem = sizeof(RopeCosSin) * static_cast<size_t>(p.rope_dim / 2);
  launch_pdl(mla_prepare_kernel, dim3(static_cast<unsigned>(p.num_tokens)), dim3(kThreads), smem, s, p);
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kiln::ops::cuda
