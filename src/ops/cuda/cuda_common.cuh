// Shared CUDA helpers: error checks, bf16 loads, launch sizing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/cuda/cuda_error.h"

#define KILN_CUDA_CHECK(expr)                                                                                       \
  do {                                                                                                              \
    cudaError_t err_ = (expr);                                                                                      \
    if (err_ != cudaSuccess)                                                                                        \
      ::kiln::ops::cuda::throw_error(std::string("CUDA error at " __FILE__ ":") + std::to_string(__LINE__) + ": " + \
                                     cudaGetErrorString(err_));                                                     \
  } while (0)

namespace kiln::ops::cuda {

inline unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// Threads of a one-CTA-per-row kernel whose threads stride over `work` items of the row.
inline int row_threads(int64_t work) {
  return work >= 512 ? 256 : (work >= 128 ? 128 : 32);
}
// Row passes over [rows, cols] (activation splits, their halves' sums, SwiGLU): a CTA of
// kRowPassThreads threads per kRowPassThreads x V columns of a row, a thread per V-column vector.
// One CTA per row left the 32-row GEMMs of decode steps on 32 SMs; one thread per element divided
// a 64-bit index per element (~40% of the copy rate in 8k-token prefills, H200).
constexpr int kRowPassThreads = 128;
inline unsigned row_pass_blocks(int64_t rows, int64_t cols, int v) {
  const int64_t n = rows * ((cols + int64_t{v} * kRowPassThreads - 1) / (int64_t{v} * kRowPassThreads));
  KILN_REQUIRE(n < (int64_t{1} << 31),
               "row pass: " + std::to_string(rows) + " x " + std::to_string(cols) + " exceeds the grid");
  return static_cast<unsigned>(n);
}
// This thread's row r and first column c of the grid above; false past the row's end.
__device__ __forceinline__ bool row_pass_at(int64_t cols, int v, int64_t& r, int64_t& c) {
  const auto per_row =
      static_cast<unsigned>((cols + int64_t{v} * kRowPassThreads - 1) / (int64_t{v} * kRowPassThreads));
  r = blockIdx.x / per_row;
  c = (int64_t{blockIdx.x % per_row} * kRowPassThreads + threadIdx.x) * v;
  return c < cols;
}
// Streaming multiprocessors of the current device (read once per process).
inline int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 132;
  }();
  return n;
}

// Opts a kernel into `bytes` of dynamic shared memory on the current device (the attribute is per
// device context), once per new maximum: `g` is that kernel's own record of the largest grant per
// device, so a kernel whose size depends on the shape pays one call per larger shape, not one per
// launch. The fast path is one atomic load; the lock keeps a smaller request landing after a larger
// one from lowering the attribute under the larger one's launch.
struct SmemGrants {
  std::mutex mu;
  std::atomic<int> bytes[64] = {};
};
template <typename Kernel>
void allow_smem(Kernel* k, int bytes, SmemGrants& g) {
  // No shortcut below 48 KB: that default bounds static plus dynamic shared memory together.
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_REQUIRE(dev < 64, "allow_smem: device " + std::to_string(dev) + " past the 64 it records");
  std::atomic<int>& have = g.bytes[dev];
  if (have.load(std::memory_order_acquire) >= bytes) return;
  std::lock_guard<std::mutex> lock(g.mu);
  if (have.load(std::memory_order_relaxed) >= bytes) return;
  KILN_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  have.store(bytes, std::memory_order_release);
}

// Weights arrive as bf16 (the backend's weight dtype) or f32 (router, tests).
__device__ __forceinline__ float load_w(const void* p, int64_t i, bool bf16) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
}

// Latent KV pool values are f32 or bf16; bf16 stores round to nearest even (as the CPU reference).
__device__ __forceinline__ void store_kv(void* pool, int64_t i, float v, bool bf16) {
  if (bf16)
    static_cast<__nv_bfloat16*>(pool)[i] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(pool)[i] = v;
}

// The 8 bf16 values of one 16-byte load, widened to f32.
__device__ __forceinline__ void bf16x8_to_f32(const uint4& v, float (&out)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(h[j]);
    out[2 * j] = f.x;
    out[2 * j + 1] = f.y;
  }
}

// The 8 weights wf dotted with x [a, b], in the one order every decode GEMV uses (the fused
// heads_linear kernel must give the same bits as the GEMVs it replaces).
__device__ __forceinline__ float dot8(const float (&wf)[8], const float4& a, const float4& b) {
  return wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
}

// acc[t] += the 8 bf16 weights in v · x[t * x_stride + col, +8) for t < rows (x 16-byte aligned):
// the inner step of every decode GEMV over bf16 weights and f32 activations.
template <int M>
__device__ __forceinline__ void dot8_accumulate(const uint4& v, const float* x, int64_t x_stride, int64_t col, int rows,
                                                float (&acc)[M]) {
  float wf[8];
  bf16x8_to_f32(v, wf);
#pragma unroll
  for (int t = 0; t < M; ++t) {
    if (t >= rows) break;
    const float4 a = __ldg(reinterpret_cast<const float4*>(x + t * x_stride + col));
    const float4 b = __ldg(reinterpret_cast<const float4*>(x + t * x_stride + col + 4));
    acc[t] += dot8(wf, a, b);
  }
}

// v rounded to bf16 at *hi and, when lo is set, the rounding remainder at *lo (v ≈ hi + lo, ~16
// mantissa bits): how f32 activations enter the tensor-core GEMMs (hi alone with bf16 activations).
__device__ __forceinline__ void store_bf16_parts(float v, __nv_bfloat16* hi, __nv_bfloat16* lo) {
  const __nv_bfloat16 h = __float2bfloat16(v);
  *hi = h;
  if (lo) *lo = __float2bfloat16(v - __bfloat162float(h));
}

// V consecutive values at p as f32, and back, for the row-wise glue passes (activation splits,
// SwiGLU, the MoE gather and combine): 16-byte loads and stores where V values fill them (p then
// 16-byte aligned; 8-byte stores of 4 bf16), V = 1 the scalar fallback for odd widths and
// unaligned pointers. Values are converted one by one exactly as a scalar loop would, so a
// vectorised pass gives the same bits as a scalar one.
template <int V>
__device__ __forceinline__ void load_vec(const float* p, float (&v)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int q = 0; q < V / 4; ++q) {
      const float4 f = reinterpret_cast<const float4*>(p)[q];
      v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = p[i];
  }
}
template <int V>
__device__ __forceinline__ void load_vec(const __nv_bfloat16* p, float (&v)[V]) {
  if constexpr (V % 8 == 0) {
#pragma unroll
    for (int q = 0; q < V / 8; ++q) {
      float f[8];
      bf16x8_to_f32(reinterpret_cast<const uint4*>(p)[q], f);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[8 * q + i] = f[i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = __bfloat162float(p[i]);
  }
}
template <int V>
__device__ __forceinline__ void store_vec(float* p, const float (&v)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int q = 0; q < V / 4; ++q)
      reinterpret_cast<float4*>(p)[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = v[i];
  }
}
template <int V>
__device__ __forceinline__ void store_vec(__nv_bfloat16* p, const __nv_bfloat16 (&v)[V]) {
  if constexpr (V % 4 == 0) {
    constexpr int W = V % 8 == 0 ? 8 : 4;  // values a store: 16 or 8 bytes
    using Word = std::conditional_t<W == 8, uint4, uint2>;
#pragma unroll
    for (int q = 0; q < V / W; ++q) {
      Word u;
      __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
      for (int i = 0; i < W / 2; ++i) h[i] = __halves2bfloat162(v[W * q + 2 * i], v[W * q + 2 * i + 1]);
      reinterpret_cast<Word*>(p)[q] = u;
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = v[i];
  }
}

// V values as bf16 at hi and, when lo_offset is not 0, their rounding remainders lo_offset
// elements further (store_bf16_parts per value, stored as store_vec does): how every row pass
// that feeds a tensor-core GEMM writes its f32 results.
template <int V>
__device__ __forceinline__ void store_parts_vec(__nv_bfloat16* hi, int64_t lo_offset, const float (&v)[V]) {
  __nv_bfloat16 h[V], l[V];
#pragma unroll
  for (int i = 0; i < V; ++i) store_bf16_parts(v[i], &h[i], &l[i]);
  store_vec(hi, h);
  if (lo_offset) store_vec(hi + lo_offset, l);
}

__host__ __device__ inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}
// Whether a row pass may take 4 columns a thread: the width and every row stride multiples of 4
// elements, every base (null: none) 16-byte aligned.
inline bool rows_vec4(int64_t cols, std::initializer_list<int64_t> strides, std::initializer_list<const void*> ptrs) {
  if (cols % 4) return false;
  for (int64_t st : strides)
    if (st % 4) return false;
  for (const void* p : ptrs)
    if (p && !aligned16(p)) return false;
  return true;
}

// Split cluster barrier (sm_90): arrive without ordering memory (e.g. "this CTA has started"),
// and wait with acquire ordering.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}
// Named CTA barrier `id` (1-15; 0 is __syncthreads) over `threads` threads, a multiple of 32:
// arrive without waiting, or arrive and wait for the rest. One warpgroup can make another wait
// for it (one arrives, the other syncs), without a whole-CTA barrier.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Whole-CTA barrier without .aligned (barrier.sync 0): threads may reach it through different
// barrier instructions, as two copies of a loop taken by different warps do; __syncthreads (the
// aligned bar.sync) requires every thread to execute the same one.
__device__ __forceinline__ void cta_barrier_unaligned() {
  asm volatile("barrier.sync 0;\n" ::: "memory");
}
// silu(g) · u, SwiGLU's two forms. silu_mul, fast exp and division: the grouped expert GEMMs'
// epilogues (and the cuBLASLt MoE path's pass). In one session-18 run's A/B binary (H200, bf16
// activations, a runtime switch between the two) the wgmma gate/up kernel at 1k tokens took 297-301
// us alone with IEEE division and 248-249 with this. Finite g below ~-87.3 gives -0 (the
// denominator is past 2^126). silu_mul_ieee, IEEE division: the swiglu op and the decode MoE
// kernels, expected to be bound by memory (one value a warp there; not measured).
__device__ __forceinline__ float silu_mul(float g, float u) {
  return __fdividef(g, 1.0f + __expf(-g)) * u;
}
__device__ __forceinline__ float silu_mul_ieee(float g, float u) {
  return g / (1.0f + __expf(-g)) * u;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One online-softmax step for a row of n scores (-inf = masked): exponentiates the scores in place
// against the new running max, updates the running max m and sum l, and returns the factor the
// row's accumulator must be scaled by (0 while nothing was accumulated yet).
__device__ __forceinline__ float online_softmax_step(float* scores, int n, float& m, float& l) {
  float mx = m;
  for (int i = 0; i < n; ++i) mx = fmaxf(mx, scores[i]);
  const float scale = m == -INFINITY ? 0.0f : __expf(m - mx);
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float e = scores[i] == -INFINITY ? 0.0f : __expf(scores[i] - mx);
    scores[i] = e;
    sum += e;
  }
  l = l * scale + sum;
  m = mx;
  return scale;
}

// The last b in [0, n) with key(b) <= target, for key non-decreasing in b (0 when there is none).
template <typename Key>
__device__ __forceinline__ int64_t last_at_most(int64_t n, int64_t target, Key key) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (key(mid) <= target)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// The sequence a row belongs to: the last b with cu[b] <= row (skips empty sequences before it).
__device__ __forceinline__ int64_t seq_of(const int32_t* cu, int64_t num_seqs, int64_t row) {
  return last_at_most(num_seqs, row, [cu](int64_t b) { return static_cast<int64_t>(cu[b]); });
}

// Block-wide sum for blockDim.x a multiple of 32 (<= 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* smem32) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) smem32[warp] = v;
  __syncthreads();
  const int nw = blockDim.x >> 5;
  float r = lane < nw ? smem32[lane] : 0.0f;
  return warp_sum(r);
}
// RMSNorm's 1 / sqrt(mean(x²) + eps) of a dim-wide row whose threads hold partial sums of squares.
__device__ __forceinline__ float block_rms_inv(float sum_sq, int64_t dim, float eps, float* smem32) {
  return rsqrtf(block_sum(sum_sq, smem32) / static_cast<float>(dim) + eps);
}
__device__ __forceinline__ float block_max(float v, float* smem32) {
  v = warp_max(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) smem32[warp] = v;
  __syncthreads();
  const int nw = blockDim.x >> 5;
  float r = lane < nw ? smem32[lane] : -INFINITY;
  return warp_max(r);
}

// Device scratch that only grows. A grown-out buffer is retired, never freed, while the process
// lives: a captured CUDA graph keeps the address it saw at capture time, so freeing it would let a
// replay write into memory someone else owns. Growth doubles, so retired bytes stay below the live.
class GrowOnlyScratch {
 public:
  GrowOnlyScratch() = default;
  template <typename T>
  T* get(size_t count) {
    const size_t need = count * sizeof(T);
    std::lock_guard<std::mutex> lock(mu_);
    if (need > bytes_) {
      void* fresh = nullptr;
      const size_t n = need > 2 * bytes_ ? need : 2 * bytes_;
      retired_.reserve(retired_.size() + 1);  // before the allocation: nothing below may throw and leak it
      KILN_CUDA_CHECK(cudaMalloc(&fresh, n));
      if (zeroed_) {
        // A failed zeroing frees the fresh block and keeps the old one: the scratch stays usable.
        const cudaError_t err = zero_privately(fresh, n);
        if (err != cudaSuccess) cudaFree(fresh);
        KILN_CUDA_CHECK(err);
      }
      if (ptr_) retired_.push_back(ptr_);
      ptr_ = fresh, bytes_ = n;
    }
    return static_cast<T*>(ptr_);
  }

 protected:
  explicit GrowOnlyScratch(bool zeroed) : zeroed_(zeroed) {}

 private:
  // Zeroes [p, p + n) on a private stream and waits: the caller's stream may be capturing a graph,
  // where a memset would run only at replay, after eager launches had used the memory. The stream
  // is destroyed on every path.
  static cudaError_t zero_privately(void* p, size_t n) {
    cudaStream_t st = nullptr;  // on the current device, as the memory is
    cudaError_t err = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    if (err != cudaSuccess) return err;
    err = cudaMemsetAsync(p, 0, n, st);
    if (err == cudaSuccess) err = cudaStreamSynchronize(st);
    const cudaError_t destroyed = cudaStreamDestroy(st);
    return err != cudaSuccess ? err : destroyed;
  }

  bool zeroed_ = false;
  std::mutex mu_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  std::vector<void*> retired_;
};

// Scratch that is zero whenever a launch starts (counters, histograms): zeroed when it grows, and
// every kernel using it leaves it zero (the last arrival resets what it merged: its counter, and
// the sampler's histogram bins). Growing during a capture relies on the backend's relaxed capture
// mode, which allows the allocation, the private stream and the wait.
class ZeroedScratch : public GrowOnlyScratch {
 public:
  ZeroedScratch() : GrowOnlyScratch(true) {}
};

}  // namespace kiln::ops::cuda
