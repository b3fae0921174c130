// The NCCL communicator: without NCCL in the build, a clear refusal; with it and a GPU, every
// collective at world size 1 (the GPU machine at hand has one), abort, and the unique id carried
// to the ranks by a host group; with two or more GPUs, a thread per GPU against the rank-order sums.
#include <gtest/gtest.h>

#include <thread>

#include "collective_expect.h"
#include "core/error.h"
#include "dist/nccl_communicator.h"
#include "rank_threads.h"

#ifdef KILN_WITH_NCCL
#include <cuda_runtime.h>
#endif

namespace kiln::test {
namespace {

#ifdef KILN_WITH_NCCL
int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// A device copy of a host vector, freed with the object.
template <typename T>
struct DeviceVec {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceVec(const std::vector<T>& host) : n(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
    if (n > 0) {
      EXPECT_EQ(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceVec() { cudaFree(ptr); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  std::vector<T> host() const {
    std::vector<T> out(n);
    if (n > 0) {
      EXPECT_EQ(cudaMemcpy(out.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return out;
  }
};
#define KILN_NEED_NCCL_GPUS(k) \
  if (gpu_count() < (k)) GTEST_SKIP() << "needs " << (k) << " CUDA GPU(s)"
#else
#define KILN_NEED_NCCL_GPUS(k) GTEST_SKIP() << "built without NCCL"
#endif

TEST(NcclCommunicator, BuildWithoutNcclSaysSo) {
  if (dist::nccl_available()) GTEST_SKIP() << "this build has NCCL";
  try {
    dist::connect_nccl({}, {});
    ADD_FAILURE() << "made an NCCL communicator without NCCL";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("this build has no NCCL"), std::string::npos) << e.what();
  }
}

TEST(NcclCommunicator, WorldOfOneGivesEveryCollectivesResult) {
  KILN_NEED_NCCL_GPUS(1);
#ifdef KILN_WITH_NCCL
  auto comm = dist::connect_nccl({}, dist::make_nccl_id());
  EXPECT_EQ(comm->kind(), "nccl");
  EXPECT_EQ(comm->world_size(), 1);
  const std::vector<float> in = rank_input(0, 1001);
  {
    DeviceVec<float> a(in), b(std::vector<float>(in.size(), 0.0f));
    comm->all_reduce(a.ptr, b.ptr, in.size(), DType::F32);
    comm->synchronize();
    EXPECT_EQ(b.host(), in);
    comm->all_reduce(a.ptr, a.ptr, in.size(), DType::F32);  // in place
    comm->synchronize();
    EXPECT_EQ(a.host(), in);
  }
  {
    const std::vector<uint16_t> in16 = to_bf16(in);
    DeviceVec<uint16_t> a(in16);
    comm->all_reduce(a.ptr, a.ptr, in16.size(), DType::BF16);
    comm->synchronize();
    EXPECT_EQ(a.host(), in16);
  }
  {
    DeviceVec<float> a(in), b(std::vector<float>(in.size(), 0.0f)), c(std::vector<float>(in.size(), 0.0f));
    comm->all_gather(a.ptr, b.ptr, in.size(), DType::F32);
    comm->reduce_scatter(a.ptr, c.ptr, in.size(), DType::F32);
    comm->synchronize();
    EXPECT_EQ(b.host(), in);
    EXPECT_EQ(c.host(), in);
  }
  {
    const std::vector<int32_t> send = {1, 2, 3, 4, 5, 6, 7};
    DeviceVec<int32_t> a(send), b(std::vector<int32_t>(7, 0));
    const std::vector<size_t> counts = {7};
    comm->all_to_all(a.ptr, counts, b.ptr, counts, DType::I32);
    comm->broadcast(a.ptr, 7, DType::I32, 0);
    comm->synchronize();
    EXPECT_EQ(b.host(), send);
    EXPECT_EQ(a.host(), send);
  }
  comm->barrier();
  int32_t x = 0;
  EXPECT_THROW(comm->all_reduce(&x, &x, 1, DType::I32), Error);  // sums F32 or BF16 only
  EXPECT_THROW(comm->broadcast(&x, 1, DType::I32, 1), Error);    // root outside the group
  comm->abort("the host group lost rank 3");
  try {
    comm->barrier();
    ADD_FAILURE() << "an aborted communicator ran a barrier";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 ended the NCCL group: the host group lost rank 3"), std::string::npos)
        << e.what();
  }
#endif
}

// One thread per GPU, the id carried by the thread group as the TCP group carries it across nodes.
TEST(NcclCommunicator, ThreadPerGpuMatchesTheRankOrderSums) {
  KILN_NEED_NCCL_GPUS(2);
#ifdef KILN_WITH_NCCL
  const int world = gpu_count();
  run_ranks(world, [&](dist::Communicator& host) {
    const dist::NcclId id = dist::share_nccl_id(host);
    dist::NcclOptions o;
    o.rank = host.rank();
    o.world_size = world;
    o.device = host.rank();
    auto comm = dist::connect_nccl(o, id);
    DeviceVec<float> a(rank_input(o.rank, 1001));
    comm->all_reduce(a.ptr, a.ptr, 1001, DType::F32);
    comm->synchronize();
    const auto got = a.host(), want = rank_order_sum(world, 1001);
    for (size_t i = 0; i < got.size(); ++i)  // NCCL adds in its own order: close, not bitwise
      if (std::abs(got[i] - want[i]) > 1e-3f * (1 + std::abs(want[i]))) throw Error("all_reduce differs");
  });
#endif
}

}  // namespace
}  // namespace kiln::test
