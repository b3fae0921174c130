// The MoE op's stream structure on CUDA, against itself: the wgmma expert path inside a CUDA
// graph against the eager op, and the shared experts on a side stream against the same op with
// them after the routed ones.
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "core/error.h"
#include "moe_parity_util.h"
#include "parity_util.h"
#ifdef KILN_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace kiln::test {
namespace {

// The op on m recorded in a CUDA graph; a throw ends the capture first, or the backend would stay
// capturing for the tests after this one.
std::shared_ptr<void> capture_moe(ops::Backend& gpu, const MoeOnBackend& m) {
  gpu.begin_capture();
  try {
    gpu.moe(m.p);
    return gpu.end_capture();
  } catch (...) {
    gpu.abort_capture();
    throw;
  }
}

// The wgmma expert path recorded in a CUDA graph (decode steps of 256 or more sequences take it,
// its down GEMM launched with programmatic dependent launch): a replay gives the eager op's bits,
// and a replay after new routing ids is the eager op on those ids. Shapes with padding-only
// warpgroups, partly filled column tiles and a 65-row last tile; both activation modes.
TEST(Parity, MoeWgmmaGraphReplayMatchesEager) {
  KILN_NEED_GPU();
  auto& gpu = backends().gpu;
  if (!gpu->supports_graphs()) GTEST_SKIP() << "CUDA graphs are off (KILN_OP_PROFILE)";
  const ScopedEnv wgmma("KILN_MOE_WGMMA_MIN_TOKENS", "0");
  const ScopedEnv cublas("KILN_MOE_CUBLAS_MIN_TOKENS", "1000000000");
  const MoeShape shapes[] = {{600, 320, 192, 16, 4, MoeRouting::Random, 128},
                             {321, 320, 192, 16, 4, MoeRouting::OneHot}};
  uint64_t seed = 1400;
  for (const MoeShape& s : shapes) {
    ++seed;
    const auto x = randn(static_cast<size_t>(s.tokens * s.hidden), seed);
    const std::vector<float> nan(x.size(), std::numeric_limits<float>::quiet_NaN());
    MoeShape other = s;
    other.routing = MoeRouting::Random;
    const auto new_ids = moe_routing(other, seed + 50);
    for (const DType act : {DType::F32, DType::BF16}) {
      const GpuActivations dtype(act);
      const std::string what = std::to_string(s.tokens) + " tokens, " + (act == DType::BF16 ? "bf16" : "f32");
      MoeOnBackend m(*gpu, s, seed, x);
      gpu->moe(m.p);  // eager first: the op's scratch is sized before the capture
      const auto want = get(*gpu, m.out);
      gpu->upload(m.out.t, nan.data());
      const std::shared_ptr<void> graph = capture_moe(*gpu, m);
      ASSERT_TRUE(graph) << what;
      gpu->replay(graph);
      const auto got = get(*gpu, m.out);
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << what;
      // New routing through the same graph, against the eager op on it.
      gpu->upload(m.ids.t, new_ids.data());
      gpu->upload(m.out.t, nan.data());
      gpu->replay(graph);
      const auto got_new = get(*gpu, m.out);
      gpu->upload(m.out.t, nan.data());
      gpu->moe(m.p);
      const auto want_new = get(*gpu, m.out);
      EXPECT_EQ(0, std::memcmp(want_new.data(), got_new.data(), want_new.size() * sizeof(float))) << what;
      EXPECT_NE(0, std::memcmp(want.data(), want_new.data(), want.size() * sizeof(float))) << what;
    }
  }
}

// The shared experts on a side stream beside the routed path (the default) or after it on the
// op's stream (KILN_MOE_SHARED_BESIDE=0, read per call): the same kernels on the same data, so the
// same bits, on the grouped mma.sync path (decode batches) and the wgmma one (prefill), with the
// residual add riding on the shared down GEMM, eagerly and replayed from a CUDA graph.
TEST(Parity, MoeSharedBesideMatchesAfter) {
  KILN_NEED_GPU();
  auto& gpu = backends().gpu;
  const MoeShape shapes[] = {{64, 2048, 1408, 64, 6, MoeRouting::Random, 2816},
                             {600, 2048, 1408, 64, 6, MoeRouting::Random, 2816},
                             {300, 100, 52, 16, 4, MoeRouting::FewExperts, 104}};
  uint64_t seed = 1500;
  for (const MoeShape& s : shapes) {
    ++seed;
    const auto x = randn(static_cast<size_t>(s.tokens * s.hidden), seed);
    const auto add = randn(x.size(), seed + 3);
    const std::vector<float> nan(x.size(), std::numeric_limits<float>::quiet_NaN());
    for (const DType act : {DType::F32, DType::BF16}) {
      const GpuActivations dtype(act);
      const std::string what = std::to_string(s.tokens) + " tokens, hidden " + std::to_string(s.hidden) + ", " +
                               (act == DType::BF16 ? "bf16" : "f32");
      std::vector<float> after;
      {
        const ScopedEnv off("KILN_MOE_SHARED_BESIDE", "0");
        after = run_moe_experts(*gpu, s, seed, x, &add);
      }
      const ScopedEnv on("KILN_MOE_SHARED_BESIDE", "1");
      MoeOnBackend m(*gpu, s, seed, x, &add);
      gpu->moe(m.p);
      const auto beside = get(*gpu, m.out);
      EXPECT_EQ(0, std::memcmp(after.data(), beside.data(), after.size() * sizeof(float))) << what;
      if (!gpu->supports_graphs()) continue;
      gpu->upload(m.out.t, nan.data());
      const std::shared_ptr<void> graph = capture_moe(*gpu, m);
      ASSERT_TRUE(graph) << what;
      gpu->replay(graph);
      const auto replayed = get(*gpu, m.out);
      EXPECT_EQ(0, std::memcmp(after.data(), replayed.data(), after.size() * sizeof(float))) << what << ", graph";
    }
  }
}

#ifdef KILN_WITH_CUDA
// Gemm::fork's contract, enforced: no nested fork, no GEMM of the object on another stream and no
// grouped GEMM until the join; after it, everything again.
TEST(Parity, GemmForkMisuseThrows) {
  KILN_NEED_GPU();
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    ops::cuda::Gemm gemm;
    const cudaStream_t side = gemm.fork(s);
    EXPECT_NE(side, s);
    EXPECT_THROW(gemm.fork(s), Error);
    // m = 0: were the check gone, nothing would run on the null pointers.
    EXPECT_THROW(gemm.linear_parts(nullptr, 64, nullptr, nullptr, 0, 0, 64, 64, nullptr, false, s), Error);
    EXPECT_NO_THROW(gemm.linear_parts(nullptr, 64, nullptr, nullptr, 0, 0, 64, 64, nullptr, false, side));
    EXPECT_THROW(gemm.grouped(nullptr, 0, 64, 64, 64, 64, s), Error);
    gemm.join(s);
    EXPECT_EQ(side, gemm.fork(s));  // the same side stream, forked again
    gemm.join(s);
    EXPECT_NO_THROW(gemm.grouped(nullptr, 0, 64, 64, 64, 64, s));  // no groups: nothing runs
  }
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  EXPECT_EQ(cudaSuccess, cudaStreamDestroy(s));
}
#endif

}  // namespace
}  // namespace kiln::test
