// The sharded forward's small ops: expert_slice and attention_merge (ops/params.h), and the
// optional log-sum-exp of mla_absorbed they merge. The CPU backend (Backend's host defaults)
// against the math written out here; the CUDA backend against the CPU one when a GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ops/backend.h"

namespace kiln::test {
namespace {

std::vector<std::unique_ptr<ops::Backend>> all_backends() {
  std::vector<std::unique_ptr<ops::Backend>> out;
  out.push_back(ops::make_cpu_backend());
  if (ops::cuda_available()) out.push_back(ops::make_cuda_backend());
  return out;
}

template <typename T>
ops::OwnedTensor put(ops::Backend& be, const std::vector<T>& v, DType dt) {
  ops::OwnedTensor t = be.alloc(dt, {static_cast<int64_t>(v.size())});
  be.upload(t.t, v.data());
  return t;
}

TEST(ExpertSlice, KeepsTheRanksExpertsAsLocalIdsAndZeroesTheRest) {
  const std::vector<int32_t> ids = {0, 5, 3, 7, 4, 2, 6, 1};
  const std::vector<float> wts = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
  for (auto& be : all_backends()) {
    auto i = put(*be, ids, DType::I32);
    auto w = put(*be, wts, DType::F32);
    be->expert_slice({i.t.as<int32_t>(), w.f32(), 8, 4, 3});  // experts 4, 5, 6 are this rank's
    std::vector<int32_t> gi(8);
    std::vector<float> gw(8);
    be->download(gi.data(), i.t);
    be->download(gw.data(), w.t);
    EXPECT_EQ(gi, (std::vector<int32_t>{0, 1, 0, 0, 0, 0, 2, 0})) << be->name();
    EXPECT_EQ(gw, (std::vector<float>{0, 0.2f, 0, 0, 0.5f, 0, 0.7f, 0})) << be->name();
  }
}

TEST(AttentionMerge, WeighsEachPartByItsShareOfTheSoftmaxMass) {
  const float inf = std::numeric_limits<float>::infinity();
  // 3 parts, 2 rows, dim 2; row 1 has no keys in part 2, and in no part in the last test below.
  const std::vector<float> parts = {1, 2, 3, 4, /**/ 5, 6, 7, 8, /**/ 9, 10, 11, 12};
  const std::vector<float> lse = {0.5f, -1.0f, /**/ 1.5f, 2.0f, /**/ -0.25f, -inf};
  std::vector<float> want(4, 0.0f);
  for (int r = 0; r < 2; ++r) {
    double total = 0;
    for (int q = 0; q < 3; ++q) total += std::exp(static_cast<double>(lse[q * 2 + r]));
    for (int q = 0; q < 3; ++q)
      for (int d = 0; d < 2; ++d)
        want[r * 2 + d] +=
            static_cast<float>(std::exp(static_cast<double>(lse[q * 2 + r])) / total) * parts[(q * 2 + r) * 2 + d];
  }
  for (auto& be : all_backends()) {
    auto p = put(*be, parts, DType::F32);
    auto l = put(*be, lse, DType::F32);
    auto out = be->alloc(DType::F32, {4});
    be->attention_merge({p.f32(), l.f32(), out.f32(), 3, 2, 2});
    std::vector<float> got(4);
    be->download(got.data(), out.t);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << be->name() << " " << i;
    // No keys anywhere: zeros.
    auto l2 = put(*be, std::vector<float>(6, -inf), DType::F32);
    be->attention_merge({p.f32(), l2.f32(), out.f32(), 3, 2, 2});
    be->download(got.data(), out.t);
    EXPECT_EQ(got, std::vector<float>(4, 0.0f)) << be->name();
  }
}

// Attention over a context split in two (rows 0..k-1 and k..n-1 as two one-sequence pools) merged
// by log-sum-exp equals attention over the whole context: what DCP relies on.
TEST(AttentionMerge, SplitContextMergesToTheWholeAttention) {
  auto be = ops::make_cpu_backend();
  const int64_t heads = 3, lora = 4, rope = 2, row = lora + rope, n = 7, k = 3;
  std::vector<float> q(static_cast<size_t>(heads * row)), kv(static_cast<size_t>(n * row));
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(static_cast<float>(i) * 0.7f);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = std::cos(static_cast<float>(i) * 0.3f);
  auto qt = put(*be, q, DType::F32);
  auto pool = put(*be, kv, DType::F32);
  const std::vector<int32_t> cu = {0, 1}, table = {0};
  auto cut = put(*be, cu, DType::I32), tab = put(*be, table, DType::I32);
  auto attend = [&](int64_t first, int64_t len, float* out, float* lse) {
    auto lens = put(*be, std::vector<int32_t>{static_cast<int32_t>(len)}, DType::I32);
    ops::MlaAbsorbedParams p{qt.f32(),
                             {pool.f32() + first * row, DType::F32, tab.t.as<int32_t>(), lens.t.as<int32_t>(), 64, 1},
                             cut.t.as<int32_t>(),
                             1,
                             1,
                             out,
                             heads,
                             lora,
                             rope,
                             0.5f};
    p.lse = lse;
    be->mla_absorbed(p);
  };
  auto whole = be->alloc(DType::F32, {heads * lora}), parts = be->alloc(DType::F32, {2 * heads * lora}),
       lse = be->alloc(DType::F32, {2 * heads}), merged = be->alloc(DType::F32, {heads * lora});
  attend(0, n, whole.f32(), nullptr);
  attend(0, k, parts.f32(), lse.f32());
  attend(k, n - k, parts.f32() + heads * lora, lse.f32() + heads);
  be->attention_merge({parts.f32(), lse.f32(), merged.f32(), 2, heads, lora});
  for (int64_t i = 0; i < heads * lora; ++i) EXPECT_NEAR(merged.f32()[i], whole.f32()[i], 1e-5) << i;
}

}  // namespace
}  // namespace kiln::test
