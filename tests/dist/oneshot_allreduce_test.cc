// The one-shot all-reduce (CUDA builds, skipped without a GPU): at world size 1 every path of the
// kernel and its checks; with two or more GPUs, a thread per GPU gets the CPU communicators'
// rank-order sums bit for bit, round after round.
#include <gtest/gtest.h>

#include "collective_expect.h"
#include "core/error.h"
#include "rank_threads.h"

#ifdef KILN_WITH_CUDA
#include <cuda_runtime.h>

#include "dist/cuda/oneshot_allreduce.h"
#endif

namespace kiln::test {
namespace {

#ifdef KILN_WITH_CUDA
int visible_gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Runs rank `rank`'s all-reduce of `host` through device buffers and returns the result.
template <typename T>
std::vector<T> reduce_on_gpu(dist::OneShotAllReduce& ar, int rank, const std::vector<T>& host, DType dtype,
                             bool in_place) {
  const size_t bytes = host.size() * sizeof(T);
  void *in = nullptr, *out = nullptr;
  cudaStream_t stream;
  if (cudaStreamCreate(&stream) != cudaSuccess || cudaMalloc(&in, bytes) != cudaSuccess ||
      cudaMalloc(&out, bytes) != cudaSuccess)
    throw Error("cannot allocate on the GPU");
  cudaMemcpy(in, host.data(), bytes, cudaMemcpyHostToDevice);
  ar.all_reduce(rank, in, in_place ? in : out, host.size(), dtype, stream);
  std::vector<T> result(host.size());
  const cudaError_t e = cudaStreamSynchronize(stream);
  cudaMemcpy(result.data(), in_place ? in : out, bytes, cudaMemcpyDeviceToHost);
  cudaFree(in);
  cudaFree(out);
  cudaStreamDestroy(stream);
  if (e != cudaSuccess) throw Error(std::string("kernel failed: ") + cudaGetErrorString(e));
  return result;
}
#define KILN_NEED_GPUS(k) \
  if (visible_gpus() < (k)) GTEST_SKIP() << "needs " << (k) << " CUDA GPU(s)"
#else
#define KILN_NEED_GPUS(k) GTEST_SKIP() << "a build without CUDA"
#endif

TEST(OneShotAllReduce, WorldOfOneReturnsTheInput) {
  KILN_NEED_GPUS(1);
#ifdef KILN_WITH_CUDA
  dist::OneShotAllReduce ar({0}, 1 << 20);
  for (size_t n : {size_t{1}, size_t{777}, size_t{40000}}) {  // one block, several, the 64-block cap
    const std::vector<float> in = rank_input(0, n);
    EXPECT_EQ(reduce_on_gpu(ar, 0, in, DType::F32, false), in);
    EXPECT_EQ(reduce_on_gpu(ar, 0, in, DType::F32, true), in);
    const std::vector<uint16_t> in16 = to_bf16(in);
    EXPECT_EQ(reduce_on_gpu(ar, 0, in16, DType::BF16, false), in16);
  }
  EXPECT_THROW(ar.all_reduce(0, nullptr, nullptr, 1, DType::I32, nullptr), Error);
  EXPECT_THROW(ar.all_reduce(0, nullptr, nullptr, (1 << 20) / 4 + 1, DType::F32, nullptr), Error);
  EXPECT_THROW(ar.all_reduce(1, nullptr, nullptr, 1, DType::F32, nullptr), Error);
  EXPECT_THROW(dist::OneShotAllReduce({}, 1024), Error);
#endif
}

TEST(OneShotAllReduce, ThreadPerGpuGivesTheRankOrderSumsBitForBit) {
  KILN_NEED_GPUS(2);
#ifdef KILN_WITH_CUDA
  const int world = std::min(visible_gpus(), 8);
  std::vector<int> devices;
  for (int d = 0; d < world; ++d) devices.push_back(d);
  dist::OneShotAllReduce ar(devices, 1 << 20);
  run_ranks(world, [&](dist::Communicator& host) {
    cudaSetDevice(host.rank());
    for (int round = 0; round < 50; ++round) {
      const size_t n = round % 2 ? 1001 : 40000;
      const std::vector<float> want = rank_order_sum(world, n);
      if (reduce_on_gpu(ar, host.rank(), rank_input(host.rank(), n), DType::F32, round % 3 == 0) != want)
        throw Error("f32 sum differs in round " + std::to_string(round));
      host.barrier();
    }
  });
#endif
}

}  // namespace
}  // namespace kiln::test
