// Every non-attention op: CUDA against the CPU reference on fresh random inputs.
#include <numeric>

#include "parity_util.h"

namespace kiln::test {
namespace {

using ops::OwnedTensor;

TEST(Parity, RmsNormAddSwigluCopy) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 64}, {5, 90}, {257, 7168}, {64, 513}}) {
    auto x = randn(static_cast<size_t>(rows * dim), 1), w = bf16_round(randn(static_cast<size_t>(dim), 2));
    std::vector<float> out[2];
    ops::Backend* be[2] = {cpu.get(), gpu.get()};
    for (int b = 0; b < 2; ++b) {
      auto tx = put(*be[b], x), tw = put(*be[b], w, b ? DType::BF16 : DType::F32);
      auto to = poisoned(*be[b], x.size());
      be[b]->rms_norm({tx.f32(), 0, tw.t.data, tw.t.dtype, to.f32(), 0, rows, dim, 1e-6f});
      be[b]->add({to.f32(), tx.f32(), to.f32(), rows * dim});
      auto tgu = put(*be[b], randn(static_cast<size_t>(rows * dim), 3));
      auto ts = poisoned(*be[b], static_cast<size_t>(rows * dim / 2));
      be[b]->swiglu({tgu.f32(), ts.f32(), rows, dim / 2});
      be[b]->copy({ts.f32(), dim / 2, to.f32() + 1, dim, rows, dim / 2 - 1});
      out[b] = get(*be[b], to);
    }
    EXPECT_LE(norm_err(out[0], out[1]), 1e-5) << rows << "x" << dim;
  }
}

TEST(Parity, EmbeddingRopeLogSoftmax) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  const int64_t V = 1000, H = 96, T = 37;
  auto table = bf16_round(randn(static_cast<size_t>(V * H), 4));
  std::vector<int32_t> ids(T), pos(T);
  for (int64_t i = 0; i < T; ++i)
    ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % V),
    pos[static_cast<size_t>(i)] = static_cast<int32_t>(i * 883 % 32768);
  std::vector<float> inv(8);
  for (size_t i = 0; i < inv.size(); ++i) inv[i] = std::pow(10000.0f, -static_cast<float>(2 * i) / 16.0f);
  for (bool interleaved : {true, false}) {
    std::vector<float> out[2], lsm[2];
    ops::Backend* be[2] = {cpu.get(), gpu.get()};
    for (int b = 0; b < 2; ++b) {
      auto tt = put(*be[b], table, b ? DType::BF16 : DType::F32);
      auto ti = put_raw(*be[b], ids, DType::I32), tp = put_raw(*be[b], pos, DType::I32), tf = put(*be[b], inv);
      auto to = poisoned(*be[b], static_cast<size_t>(T * H));
      be[b]->embedding({ti.t.as<int32_t>(), tt.t.data, tt.t.dtype, to.f32(), T, V, H});
      // 6 heads of 16 rotary dims at stride 16 inside each 96-wide row.
      be[b]->rope({to.f32(), T, 6, H, 16, 16, tp.t.as<int32_t>(), tf.f32(), 1.3f, interleaved});
      out[b] = get(*be[b], to);
      auto tl = put(*be[b], randn(static_cast<size_t>(T * V), 5, 3.0f));
      auto tls = poisoned(*be[b], static_cast<size_t>(T * V));
      be[b]->log_softmax({tl.f32(), tls.f32(), T, V});
      lsm[b] = get(*be[b], tls);
    }
    EXPECT_LE(norm_err(out[0], out[1]), 1e-5) << "interleaved " << interleaved;
    EXPECT_LE(norm_err(lsm[0], lsm[1]), 1e-5);
  }
}

TEST(Parity, Linear) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  struct S {
    int64_t m, n, k;
  };
  for (S s : {S{1, 64, 64}, S{7, 300, 129}, S{1, 2048, 7168}, S{256, 512, 1000}, S{33, 4096, 512}, S{128, 163, 90}}) {
    // The GPU multiplies bf16 operands: round x too, so the comparison measures accumulation only.
    auto x = bf16_round(randn(static_cast<size_t>(s.m * s.k), 6)),
         w = bf16_round(randn(static_cast<size_t>(s.n * s.k), 7));
    std::vector<float> out[2];
    ops::Backend* be[2] = {cpu.get(), gpu.get()};
    for (int b = 0; b < 2; ++b) {
      auto tx = put(*be[b], x), tw = put(*be[b], w, b ? DType::BF16 : DType::F32);
      auto ty = poisoned(*be[b], static_cast<size_t>(s.m * s.n));
      be[b]->linear({tx.f32(), 0, tw.t.data, tw.t.dtype, ty.f32(), 0, s.m, s.n, s.k});
      out[b] = get(*be[b], ty);
    }
    EXPECT_LE(norm_err(out[0], out[1]), 1e-4) << s.m << "x" << s.n << "x" << s.k;
  }
}

TEST(Parity, LinearHeads) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  for (int64_t m : {1, 3, 8, 33}) {
    for (int64_t heads : {1, 5, 12, 16}) {
      const int64_t n = 512, k = 128, xs = heads * (k + 64), ys = heads * (n + 64);  // strided like the model
      auto x = bf16_round(randn(static_cast<size_t>(m * xs), 20));
      auto w = bf16_round(randn(static_cast<size_t>(heads * (n + 128) * k), 21, 0.1f));
      std::vector<float> out[2];
      ops::Backend* be[2] = {cpu.get(), gpu.get()};
      for (int b = 0; b < 2; ++b) {
        auto tx = put(*be[b], x), tw = put(*be[b], w, b ? DType::BF16 : DType::F32);
        auto ty = put(*be[b], std::vector<float>(static_cast<size_t>(m * ys), 0.0f));
        be[b]->linear_heads(
            {tx.f32(), xs, k + 64, tw.t.data, (n + 128) * k, tw.t.dtype, ty.f32(), ys, n + 64, heads, m, n, k});
        out[b] = get(*be[b], ty);
      }
      EXPECT_LE(norm_err(out[0], out[1]), 1e-4) << m << " rows, " << heads << " heads";
    }
  }
}

struct RouterShape {
  int64_t tokens, experts, top_k, groups, topk_groups;
};

TEST(Parity, RouterChoosesTheSameExperts) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  for (RouterShape r : {RouterShape{1, 8, 2, 4, 2}, RouterShape{37, 64, 6, 1, 1}, RouterShape{256, 256, 8, 8, 4},
                        RouterShape{19, 384, 8, 1, 1}, RouterShape{5, 16, 3, 4, 2}}) {
    auto logits = randn(static_cast<size_t>(r.tokens * r.experts), 8, 2.0f);
    auto bias = randn(static_cast<size_t>(r.experts), 9, 0.05f);
    std::vector<float> w[2];
    std::vector<int32_t> ids[2];
    ops::Backend* be[2] = {cpu.get(), gpu.get()};
    for (int b = 0; b < 2; ++b) {
      auto tl = put(*be[b], logits), tb = put(*be[b], bias);
      auto tw = poisoned(*be[b], static_cast<size_t>(r.tokens * r.top_k));
      auto ti = be[b]->alloc(DType::I32, {r.tokens * r.top_k});
      be[b]->router({tl.f32(), tb.f32(), ti.t.as<int32_t>(), tw.f32(), r.tokens, r.experts, r.top_k, r.groups,
                     r.topk_groups, true, 2.5f});
      w[b] = get(*be[b], tw);
      ids[b].resize(static_cast<size_t>(r.tokens * r.top_k));
      be[b]->download(ids[b].data(), ti.t);
    }
    EXPECT_EQ(ids[0], ids[1]) << r.experts << " experts";
    EXPECT_LE(norm_err(w[0], w[1]), 1e-5);
  }
}

struct MoeShape {
  int64_t tokens, hidden, inter, experts, top_k;
};

TEST(Parity, MoeExpertsBothPaths) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  // 1-4 tokens take the GEMV path, more take the expert-grouped GEMMs.
  for (MoeShape s : {MoeShape{1, 64, 36, 8, 2}, MoeShape{3, 90, 36, 6, 2}, MoeShape{4, 2048, 1408, 64, 6},
                     MoeShape{8, 256, 128, 16, 4}, MoeShape{37, 90, 36, 6, 2}, MoeShape{256, 512, 256, 64, 6}}) {
    auto x = bf16_round(randn(static_cast<size_t>(s.tokens * s.hidden), 10));
    auto wgu = bf16_round(randn(static_cast<size_t>(s.experts * 2 * s.inter * s.hidden), 11, 0.05f));
    auto wd = bf16_round(randn(static_cast<size_t>(s.experts * s.hidden * s.inter), 12, 0.05f));
    std::vector<int32_t> ids(static_cast<size_t>(s.tokens * s.top_k));
    std::vector<float> tw(ids.size());
    for (int64_t t = 0; t < s.tokens; ++t)
      for (int64_t j = 0; j < s.top_k; ++j) {
        ids[static_cast<size_t>(t * s.top_k + j)] = static_cast<int32_t>((t * 5 + j * 3) % s.experts);
        tw[static_cast<size_t>(t * s.top_k + j)] = 0.1f + 0.2f * static_cast<float>(j);
      }
    std::vector<float> out[2];
    ops::Backend* be[2] = {cpu.get(), gpu.get()};
    for (int b = 0; b < 2; ++b) {
      const DType dt = b ? DType::BF16 : DType::F32;
      auto tx = put(*be[b], x), tg = put(*be[b], wgu, dt), td = put(*be[b], wd, dt);
      auto ti = put_raw(*be[b], ids, DType::I32), tww = put(*be[b], tw);
      auto to = poisoned(*be[b], x.size());
      be[b]->moe({tx.f32(), ti.t.as<int32_t>(), tww.f32(), tg.t.data, td.t.data, dt, to.f32(), s.tokens, s.hidden,
                  s.inter, s.experts, s.top_k});
      out[b] = get(*be[b], to);
    }
    // The grouped path rounds the SwiGLU activations to bf16 before the down GEMM.
    EXPECT_LE(norm_err(out[0], out[1]), s.tokens <= 4 ? 1e-4 : 1e-2) << s.tokens << " tokens";
  }
}

TEST(Parity, KvScatterGather) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  const int64_t row = 576, bs = 64, blocks = 10;
  std::vector<int32_t> slots = {5, 64, 130, 639, 0};
  auto rows = randn(slots.size() * row, 13);
  std::vector<int32_t> table = {3, 1, 9, 0, 2, 5}, lens = {100, 70}, cu = {0, 100, 170};
  std::vector<float> out[2];
  ops::Backend* be[2] = {cpu.get(), gpu.get()};
  for (int b = 0; b < 2; ++b) {
    auto pool = put(*be[b], randn(static_cast<size_t>(blocks * bs * row), 14));
    auto tr = put(*be[b], rows), ts = put_raw(*be[b], slots, DType::I32);
    be[b]->kv_scatter({tr.f32(), ts.t.as<int32_t>(), pool.f32(), static_cast<int64_t>(slots.size()), row});
    auto tt = put_raw(*be[b], table, DType::I32), tl = put_raw(*be[b], lens, DType::I32),
         tc = put_raw(*be[b], cu, DType::I32);
    auto to = poisoned(*be[b], static_cast<size_t>(170 * row));
    be[b]->kv_gather(
        {{pool.f32(), tt.t.as<int32_t>(), tl.t.as<int32_t>(), bs, 3}, tc.t.as<int32_t>(), 2, row, 170, to.f32()});
    out[b] = get(*be[b], to);
  }
  EXPECT_EQ(norm_err(out[0], out[1]), 0.0);
}

}  // namespace
}  // namespace kiln::test
