// Embedding, RMSNorm, add, SwiGLU, copies, RoPE, KV scatter/gather, log-softmax, fills, casts.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/pdl.cuh"
#include "ops/rope_math.h"

namespace kiln::ops::cuda {
namespace {

__global__ void copy_kernel(CopyParams p) {
  pdl_wait();  // PDL: the previous kernel's outputs are visible from here on
  pdl_trigger();
  const int64_t r = blockIdx.x, rs = r / (p.src_repeat > 1 ? p.src_repeat : 1);
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) p.dst[r * p.dst_stride + c] = p.src[rs * p.src_stride + c];
}

__global__ void embedding_kernel(EmbeddingParams p, bool bf16) {
  pdl_wait();  // PDL: the previous kernel's outputs are visible from here on
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int64_t id = p.ids[t] - p.vocab_begin;
  if (id < 0 || id >= p.vocab) {  // another rank's row (vocabulary parallel); else checked on the host
    if (p.zero_outside)
      for (int64_t i = threadIdx.x; i < p.hidden; i += blockDim.x) p.out[t * p.hidden + i] = 0.0f;
    return;
  }
  for (int64_t i = threadIdx.x; i < p.hidden; i += blockDim.x)
    p.out[t * p.hidden + i] = load_w(p.table, id * p.hidden + i, bf16);
}

__device__ __forceinline__ float4 load_w4(const void* w, int64_t i, bool bf16) {
  if (!bf16) return reinterpret_cast<const float4*>(w)[i];
  const uint2 u = reinterpret_cast<const uint2*>(w)[i];
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}

// vec: dim % 4 == 0 and every row 16-byte aligned (8-byte for bf16 parts), so rows move as float4
// (a decode step's norm is one CTA per token: its latency is the loads each thread issues one after
// another). With `preload` (KILN_NORM_PRELOAD=0 turns it off, for the A/B), each thread's first
// kPreW float4 of the weights, which are constant, are in registers before the wait instead of
// requested from DRAM after the reduction, and its first kPreW of x + residual stay in registers
// for the second pass.
// H200 (session 13): the single-stream input norm's body 4.8 -> 2.0-2.3 us after its release (kernel
// trace), single-stream steps 2.56-2.66 -> 2.53-2.60 ms in two runs.
// kParts: the normalised row is written as bf16 parts (`parts`) instead of f32 at p.out.
constexpr int kPreW = 2;
template <bool kParts>
__global__ void rms_norm_kernel(RmsNormParams p, int64_t xs, int64_t os, bool bf16, bool vec, bool preload,
                                BfParts parts) {
  float4 w_pre[kPreW];
  if (vec && preload) {
#pragma unroll
    for (int j = 0; j < kPreW; ++j) {
      const int64_t i = threadIdx.x + j * static_cast<int64_t>(blockDim.x);
      if (i < p.dim / 4) w_pre[j] = load_w4(p.weight, i, bf16);
    }
  }
  pdl_wait();  // PDL: the previous kernel's outputs are visible from here on
  pdl_trigger();
  __shared__ float red[32];
  const float* x = p.x + blockIdx.x * xs;
  float* o = kParts ? nullptr : p.out + blockIdx.x * os;
  __nv_bfloat16* o_parts = kParts ? parts.hi + blockIdx.x * parts.ld : nullptr;
  float ss = 0;
  if (vec) {
    const int64_t n4 = p.dim / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    // x + residual, the row that is normalised; the second pass adds again unless `sum` kept it
    // (each thread re-reads only the sums it wrote: no barrier needed).
    const float4* r4 = p.residual ? reinterpret_cast<const float4*>(p.residual + blockIdx.x * xs) : nullptr;
    float4* s4 = p.residual && p.sum ? reinterpret_cast<float4*>(p.sum + blockIdx.x * xs) : nullptr;
    auto in4 = [&](int64_t i) {
      const float4 a = x4[i];
      if (!r4) return a;
      const float4 b = r4[i];
      return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    };
    // The first kPreW float4 of x + residual stay in registers for the second pass (with preload).
    float4 v_keep[kPreW];
#pragma unroll
    for (int j = 0; j < kPreW; ++j) {
      const int64_t i = threadIdx.x + j * static_cast<int64_t>(blockDim.x);
      if (i >= n4) break;
      const float4 v = in4(i);
      v_keep[j] = v;
      if (s4) s4[i] = v;
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
#pragma unroll 4
    for (int64_t i = threadIdx.x + kPreW * static_cast<int64_t>(blockDim.x); i < n4; i += blockDim.x) {
      const float4 v = in4(i);
      if (s4) s4[i] = v;
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    trace_phase(0);  // kernel trace: loaded, reduced, stored
    if (s4) x4 = s4, r4 = nullptr;
    const float inv = block_rms_inv(ss, p.dim, p.eps, red);
    trace_phase(1);
    auto store = [&](int64_t i, const float4& v, const float4& w) {
      const float y[4] = {w.x * (v.x * inv), w.y * (v.y * inv), w.z * (v.z * inv), w.w * (v.w * inv)};
      if constexpr (kParts)
        store_parts_vec(o_parts + 4 * i, parts.lo_offset, y);
      else
        store_vec(o + 4 * i, y);
    };
#pragma unroll
    for (int j = 0; j < kPreW; ++j) {
      const int64_t i = threadIdx.x + j * static_cast<int64_t>(blockDim.x);
      if (i < n4) store(i, preload ? v_keep[j] : in4(i), preload ? w_pre[j] : load_w4(p.weight, i, bf16));
    }
    for (int64_t i = threadIdx.x + kPreW * static_cast<int64_t>(blockDim.x); i < n4; i += blockDim.x)
      store(i, in4(i), load_w4(p.weight, i, bf16));
    trace_phase(2);
    return;
  }
  const float* res = p.residual ? p.residual + blockIdx.x * xs : nullptr;
  float* sum = p.residual && p.sum ? p.sum + blockIdx.x * xs : nullptr;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    const float v = res ? x[i] + res[i] : x[i];
    if (sum) sum[i] = v;
    ss += v * v;
  }
  if (sum) x = sum, res = nullptr;
  const float inv = block_rms_inv(ss, p.dim, p.eps, red);
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    const float y[1] = {load_w(p.weight, i, bf16) * ((res ? x[i] + res[i] : x[i]) * inv)};
    if constexpr (kParts)
      store_parts_vec(o_parts + i, parts.lo_offset, y);
    else
      o[i] = y[0];
  }
}

__global__ void add_kernel(AddParams p) {
  pdl_wait();  // PDL: the previous kernel's outputs are visible from here on
  pdl_trigger();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < p.n) p.out[i] = p.a[i] + p.b[i];
}

__global__ void take_tokens_kernel(TakeTokensParams p) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < p.n && p.from[i] >= 0) p.ids[i] = p.src[p.from[i]];
}

// V columns a thread (row_pass_at); kParts: written as bf16 parts (`parts`) instead of f32 at p.out.
template <int V, bool kParts>
__global__ void swiglu_kernel(SwigluParams p, BfParts parts) {
  int64_t r, c;
  if (!row_pass_at(p.inter, V, r, c)) return;
  const float* gu = p.gate_up + r * 2 * p.inter + c;
  float g[V], u[V];
  load_vec(gu, g);
  load_vec(gu + p.inter, u);
#pragma unroll
  for (int i = 0; i < V; ++i) g[i] = silu_mul_ieee(g[i], u[i]);
  if constexpr (kParts)
    store_parts_vec(parts.hi + r * parts.ld + c, parts.lo_offset, g);
  else
    store_vec(p.out + r * p.inter + c, g);
}

// One thread per (token, head, pair).
__global__ void rope_kernel(RopeParams p) {
  const int64_t half = p.rot_dim / 2;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= p.num_tokens * p.num_heads * half) return;
  const int64_t pair = i % half, h = (i / half) % p.num_heads, t = i / (half * p.num_heads);
  float* x = p.x + t * p.token_stride + h * p.head_stride;
  const RopePair ab = rope_pair(pair, half, p.interleaved);
  rope_rotate(x[ab.a], x[ab.b], rope_cos_sin(p.inv_freq[pair], p.positions[t], p.attention_factor));
}

__global__ void kv_scatter_kernel(KvScatterParams p) {
  const int64_t t = blockIdx.x;
  const int64_t slot = p.slots[t];
  const bool bf16 = p.pool_dtype == DType::BF16;
  for (int64_t c = threadIdx.x; c < p.row_dim; c += blockDim.x) {
    store_kv(p.pool, slot * p.row_dim + c, p.rows[t * p.row_dim + c], bf16);
  }
}

// grid.x = total rows; each block finds its sequence by scanning cu_kv (few sequences).
__global__ void kv_gather_kernel(KvGatherParams p) {
  const int64_t r = blockIdx.x;
  int64_t b = 0;
  while (b + 1 < p.num_seqs && r >= p.cu_kv[b + 1]) ++b;
  const int64_t j = r - p.cu_kv[b];
  const int64_t block = p.kv.block_table[b * p.kv.max_blocks + j / p.kv.block_size];
  const int64_t src = (block * p.kv.block_size + j % p.kv.block_size) * p.row_dim;
  const bool bf16 = p.kv.pool_dtype == DType::BF16;
  for (int64_t c = threadIdx.x; c < p.row_dim; c += blockDim.x)
    p.out[r * p.row_dim + c] = load_w(p.kv.pool, src + c, bf16);
}

__global__ void log_softmax_kernel(LogSoftmaxParams p) {
  __shared__ float red[32];
  const float* l = p.logits + blockIdx.x * p.vocab;
  float* o = p.out + blockIdx.x * p.vocab;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < p.vocab; i += blockDim.x) mx = fmaxf(mx, l[i]);
  mx = block_max(mx, red);
  float sum = 0;
  for (int64_t i = threadIdx.x; i < p.vocab; i += blockDim.x) sum += __expf(l[i] - mx);
  sum = block_sum(sum, red);
  const float lse = mx + logf(sum);
  for (int64_t i = threadIdx.x; i < p.vocab; i += blockDim.x) o[i] = l[i] - lse;
}

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void fill_random_kernel(void* data, bool bf16, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u =
        static_cast<float>(mix64(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
    const float v = (2.0f * u - 1.0f) * scale;
    if (bf16)
      static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16(v);
    else
      static_cast<float*>(data)[i] = v;
  }
}

}  // namespace

void copy(const CopyParams& p, cudaStream_t s) {
  if (p.rows == 0) return;
  launch_pdl(copy_kernel, dim3(static_cast<unsigned>(p.rows)), dim3(row_threads(p.cols)), 0, s, p);
}
void embedding(const EmbeddingParams& p, cudaStream_t s) {
  if (p.num_tokens == 0) return;
  launch_pdl(embedding_kernel, dim3(static_cast<unsigned>(p.num_tokens)), dim3(row_threads(p.hidden)), 0, s, p,
             p.table_dtype == DType::BF16);
}
namespace {

// parts null: f32 rows at p.out.
void launch_rms_norm(const RmsNormParams& p, const BfParts* parts, cudaStream_t s) {
  if (p.rows == 0) return;
  const int64_t xs = p.x_stride ? p.x_stride : p.dim, os = p.out_stride ? p.out_stride : p.dim;
  auto a16 = [](const void* q) { return q == nullptr || (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  const bool out_vec = parts ? parts->vec4() : os % 4 == 0 && a16(p.out);
  const bool vec = p.dim % 4 == 0 && xs % 4 == 0 && out_vec && a16(p.x) && a16(p.residual) && a16(p.sum) &&
                   a16(p.weight) && (p.weight_dtype == DType::BF16 || p.weight_dtype == DType::F32);
  static const bool preload = env_int("KILN_NORM_PRELOAD", 1, 0, 1) != 0;
  const dim3 grid(static_cast<unsigned>(p.rows)), block(row_threads(vec ? p.dim / 4 : p.dim));
  const bool bf16 = p.weight_dtype == DType::BF16;
  if (parts)
    launch_pdl(rms_norm_kernel<true>, grid, block, 0, s, p, xs, os, bf16, vec, preload, *parts);
  else
    launch_pdl(rms_norm_kernel<false>, grid, block, 0, s, p, xs, os, bf16, vec, preload, BfParts{});
}

void launch_swiglu(const SwigluParams& p, const BfParts* parts, cudaStream_t s) {
  if (p.rows * p.inter == 0) return;
  const bool vec = parts ? rows_vec4(p.inter, {2 * p.inter}, {p.gate_up}) && parts->vec4()
                         : rows_vec4(p.inter, {2 * p.inter}, {p.gate_up, p.out});
  const int v = vec ? 4 : 1;
  const BfParts out = parts ? *parts : BfParts{};
  const unsigned grid = row_pass_blocks(p.rows, p.inter, v);
  if (vec && parts)
    swiglu_kernel<4, true><<<grid, kRowPassThreads, 0, s>>>(p, out);
  else if (vec)
    swiglu_kernel<4, false><<<grid, kRowPassThreads, 0, s>>>(p, out);
  else if (parts)
    swiglu_kernel<1, true><<<grid, kRowPassThreads, 0, s>>>(p, out);
  else
    swiglu_kernel<1, false><<<grid, kRowPassThreads, 0, s>>>(p, out);
}

}  // namespace

void rms_norm(const RmsNormParams& p, cudaStream_t s) {
  launch_rms_norm(p, nullptr, s);
}
void rms_norm(const RmsNormParams& p, const BfParts& out, cudaStream_t s) {
  launch_rms_norm(p, &out, s);
}
void add(const AddParams& p, cudaStream_t s) {
  if (p.n) launch_pdl(add_kernel, dim3(blocks_for(p.n, 256)), dim3(256), 0, s, p);
}
void take_tokens(const TakeTokensParams& p, cudaStream_t s) {
  if (p.n) take_tokens_kernel<<<blocks_for(p.n, 256), 256, 0, s>>>(p);
}
void swiglu(const SwigluParams& p, cudaStream_t s) {
  launch_swiglu(p, nullptr, s);
}
void swiglu(const SwigluParams& p, const BfParts& out, cudaStream_t s) {
  launch_swiglu(p, &out, s);
}
void rope(const RopeParams& p, cudaStream_t s) {
  const int64_t n = p.num_tokens * p.num_heads * (p.rot_dim / 2);
  if (n) rope_kernel<<<blocks_for(n, 256), 256, 0, s>>>(p);
}
void kv_scatter(const KvScatterParams& p, cudaStream_t s) {
  KILN_REQUIRE(p.pool_dtype == DType::F32 || p.pool_dtype == DType::BF16,
               std::string("kv_scatter: unsupported pool dtype ") + dtype_name(p.pool_dtype));
  if (p.num_tokens) kv_scatter_kernel<<<static_cast<unsigned>(p.num_tokens), 128, 0, s>>>(p);
}
void kv_gather(const KvGatherParams& p, cudaStream_t s) {
  KILN_REQUIRE(p.kv.pool_dtype == DType::F32 || p.kv.pool_dtype == DType::BF16,
               std::string("kv_gather: unsupported pool dtype ") + dtype_name(p.kv.pool_dtype));
  if (p.total_rows) kv_gather_kernel<<<static_cast<unsigned>(p.total_rows), 128, 0, s>>>(p);
}
void log_softmax(const LogSoftmaxParams& p, cudaStream_t s) {
  if (p.rows) log_softmax_kernel<<<static_cast<unsigned>(p.rows), 256, 0, s>>>(p);
}
void fill_random(void* data, DType dtype, int64_t n, uint64_t seed, float scale, cudaStream_t s) {
  if (n)
    fill_random_kernel<<<std::min<int64_t>(65535, (n + 255) / 256), 256, 0, s>>>(data, dtype == DType::BF16, n, seed,
                                                                                 scale);
}
}  // namespace kiln::ops::cuda
