#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "dist/cuda/oneshot_allreduce.h"
#include "ops/cuda/cuda_error.h"

namespace kiln::dist {
namespace {

constexpr int kMaxRanks = 8;
constexpr int kMaxBlocks = 64;
constexpr int kThreads = 512;

// Per GPU. flag[b][p] is written by rank p's block b (into every peer's copy) to say it reached a
// barrier of round `round[b]`; two arrays, one per barrier of a round.
struct Signals {
  uint32_t ready[kMaxBlocks][kMaxRanks];
  uint32_t done[kMaxBlocks][kMaxRanks];
  uint32_t round[kMaxBlocks];
};

struct Peers {
  const void* staging[kMaxRanks];
  Signals* signals[kMaxRanks];
};

void check(cudaError_t e, const std::string& what) {
  KILN_REQUIRE(e == cudaSuccess, "one-shot all-reduce: " + what + ": " + cudaGetErrorString(e));
}

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Block b of this rank tells block b of every rank it reached this barrier of round `r`, then waits
// until block b of every rank has. A peer can be at most one barrier ahead (it cannot pass the next
// one without this rank), so equality with `r` is the test, which survives the counter wrapping.
__device__ void block_barrier(uint32_t (*mine)[kMaxRanks], size_t field_offset, const Peers& peers, int rank, int world,
                              uint32_t r, uint64_t timeout_ns) {
  __syncthreads();
  const int p = threadIdx.x;
  if (p < world) {
    auto* peer_flags =
        reinterpret_cast<uint32_t(*)[kMaxRanks]>(reinterpret_cast<char*>(peers.signals[p]) + field_offset);
    store_release_sys(&peer_flags[blockIdx.x][rank], r);
    const uint64_t start = now_ns();
    while (load_acquire_sys(&mine[blockIdx.x][p]) != r) {
      if (now_ns() - start > timeout_ns) {
        printf("kiln one-shot all-reduce: rank %d waited %llu ms for rank %d; stopping\n", rank,
               static_cast<unsigned long long>(timeout_ns / 1000000), p);
        __trap();
      }
    }
  }
  __syncthreads();
}

template <typename T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    oneshot_kernel(Peers peers, int rank, int world, T* out, size_t n, uint64_t timeout_ns) {
  Signals* me = peers.signals[rank];
  __shared__ uint32_t round;
  if (threadIdx.x == 0) round = me->round[blockIdx.x] + 1;  // only this block of this rank owns it
  __syncthreads();
  const uint32_t r = round;
  block_barrier(me->ready, offsetof(Signals, ready), peers, rank, world, r, timeout_ns);
  // Block b reads the same chunk on every rank, so after the second barrier no block of any rank
  // still reads a staging buffer and each rank may refill its own.
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float acc = to_f32(static_cast<const T*>(peers.staging[0])[i]);
    for (int p = 1; p < world; ++p) acc += to_f32(static_cast<const T*>(peers.staging[p])[i]);
    out[i] = world == 1 ? static_cast<const T*>(peers.staging[0])[i] : from_f32<T>(acc);
  }
  block_barrier(me->done, offsetof(Signals, done), peers, rank, world, r, timeout_ns);
  if (threadIdx.x == 0) me->round[blockIdx.x] = r;
}

}  // namespace

OneShotAllReduce::OneShotAllReduce(std::vector<int> devices, size_t max_bytes, double peer_timeout_s)
    : devices_(std::move(devices)), max_bytes_(max_bytes), peer_timeout_s_(peer_timeout_s) {
  const int world = world_size();
  KILN_REQUIRE(world >= 1 && world <= kMaxRanks,
               "one-shot all-reduce: " + std::to_string(world) + " ranks (1 to " + std::to_string(kMaxRanks) + ")");
  KILN_REQUIRE(max_bytes > 0, "one-shot all-reduce: a staging buffer of 0 bytes");
  KILN_REQUIRE(peer_timeout_s > 0, "one-shot all-reduce: the peer timeout must be positive");
  for (int i = 0; i < world; ++i)
    for (int j = 0; j < world; ++j) {
      if (i == j) continue;
      int can = 0;
      check(cudaDeviceCanAccessPeer(&can, devices_[i], devices_[j]), "cudaDeviceCanAccessPeer");
      KILN_REQUIRE(can, "one-shot all-reduce: GPU " + std::to_string(devices_[i]) + " cannot reach GPU " +
                            std::to_string(devices_[j]) + "'s memory (no NVLink or PCIe P2P); use NCCL");
    }
  int previous = 0;
  check(cudaGetDevice(&previous), "cudaGetDevice");
  try {
    for (int i = 0; i < world; ++i) {
      check(cudaSetDevice(devices_[i]), "cudaSetDevice");
      void* staging = nullptr;
      void* signals = nullptr;
      check(cudaMalloc(&staging, max_bytes), "staging buffer");
      staging_.push_back(staging);
      check(cudaMalloc(&signals, sizeof(Signals)), "signal flags");
      signals_.push_back(signals);
      check(cudaMemset(signals, 0, sizeof(Signals)), "zeroing the flags");
      for (int j = 0; j < world; ++j) {
        if (j == i) continue;
        const cudaError_t e = cudaDeviceEnablePeerAccess(devices_[j], 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) {
          cudaGetLastError();  // clear it: enabled earlier is what we want
          continue;
        }
        check(e, "enabling peer access");
      }
      check(cudaDeviceSynchronize(), "setting up");
    }
  } catch (...) {
    for (void* p : staging_) cudaFree(p);
    for (void* p : signals_) cudaFree(p);
    cudaSetDevice(previous);
    throw;
  }
  cudaSetDevice(previous);
}

OneShotAllReduce::~OneShotAllReduce() {
  for (void* p : staging_) cudaFree(p);
  for (void* p : signals_) cudaFree(p);
}

void OneShotAllReduce::all_reduce(int rank, const void* in, void* out, size_t count, DType dtype, void* stream) {
  KILN_REQUIRE(rank >= 0 && rank < world_size(), "one-shot all-reduce: rank " + std::to_string(rank) +
                                                     " is outside a group of " + std::to_string(world_size()));
  KILN_REQUIRE(dtype == DType::F32 || dtype == DType::BF16,
               std::string("one-shot all-reduce: sums F32 or BF16, not ") + dtype_name(dtype));
  const size_t bytes = count * dtype_size(dtype);
  KILN_REQUIRE(bytes <= max_bytes_, "one-shot all-reduce: " + std::to_string(bytes) +
                                        " bytes exceed the staging buffer's " + std::to_string(max_bytes_) +
                                        " (send larger messages through NCCL)");
  if (count == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  check(cudaMemcpyAsync(staging_[rank], in, bytes, cudaMemcpyDeviceToDevice, s), "staging the input");
  Peers peers{};
  for (int p = 0; p < world_size(); ++p) {
    peers.staging[p] = staging_[p];
    peers.signals[p] = static_cast<Signals*>(signals_[p]);
  }
  // The grid depends on the count alone, so block b covers the same chunk on every rank.
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>(kMaxBlocks, (count + kThreads - 1) / kThreads));
  const auto timeout_ns = static_cast<uint64_t>(peer_timeout_s_ * 1e9);
  if (dtype == DType::F32)
    oneshot_kernel<float>
        <<<blocks, kThreads, 0, s>>>(peers, rank, world_size(), static_cast<float*>(out), count, timeout_ns);
  else
    oneshot_kernel<__nv_bfloat16>
        <<<blocks, kThreads, 0, s>>>(peers, rank, world_size(), static_cast<__nv_bfloat16*>(out), count, timeout_ns);
  check(cudaGetLastError(), "launching the kernel");
}

}  // namespace kiln::dist
