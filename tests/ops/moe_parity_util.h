// The MoE op's parity fixtures (moe_parity_test.cc, moe_stream_parity_test.cc): expert shapes,
// routings, weights and the op run on a backend.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "parity_util.h"

namespace kiln::test {

enum class MoeRouting { Random, FewExperts, OneHot };

struct MoeShape {
  int64_t tokens, hidden, inter, experts, top_k;
  MoeRouting routing = MoeRouting::Random;
  int64_t shared_inter = 0;  // shared experts' width (0: none)
};

// top_k distinct experts per token: Random draws from all experts; FewExperts only from the first
// top_k + 2 (most experts get no token); OneHot puts expert 0 in every token's slot 0.
inline std::vector<int32_t> moe_routing(const MoeShape& s, uint64_t seed) {
  std::mt19937_64 g(seed);
  const int64_t pool = s.routing == MoeRouting::FewExperts ? std::min(s.experts, s.top_k + 2) : s.experts;
  std::vector<int32_t> all(static_cast<size_t>(pool)), ids;
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::iota(all.begin(), all.end(), 0);
    int64_t first = 0;
    if (s.routing == MoeRouting::OneHot) {
      ids.push_back(0);
      first = 1;
    }
    for (int64_t j = first; j < s.top_k; ++j) {  // partial Fisher-Yates over experts [first, pool)
      const auto pick = static_cast<size_t>(j + static_cast<int64_t>(g() % static_cast<uint64_t>(pool - j)));
      std::swap(all[static_cast<size_t>(j)], all[pick]);
      ids.push_back(all[static_cast<size_t>(j)]);
    }
  }
  return ids;
}

// Uniform(-scale, scale) from a counter hash: the 7168 x 2048 x 8-expert weights would take
// seconds through std::normal_distribution.
inline std::vector<float> moe_uniform(size_t n, uint64_t seed, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
    v[i] = scale * (static_cast<float>((z >> 40) & 0xffffff) / 8388608.0f - 1.0f);
  }
  return v;
}

// The experts of shape s on `be`: weights, routing and shared experts from `seed`, input x, `add`
// fused into the op when given, and a NaN-poisoned output; the tensors live as long as this does.
struct MoeOnBackend {
  ops::OwnedTensor x, gate_up, down, ids, weights, out, shared_gate_up, shared_down, add;
  ops::MoeParams p{};
  MoeOnBackend(ops::Backend& be, const MoeShape& s, uint64_t seed, const std::vector<float>& xv,
               const std::vector<float>* addv = nullptr) {
    const auto wgu = bf16_round(moe_uniform(static_cast<size_t>(s.experts * 2 * s.inter * s.hidden), seed, 0.08f));
    const auto wd = bf16_round(moe_uniform(static_cast<size_t>(s.experts * s.hidden * s.inter), seed + 7, 0.08f));
    const auto idv = moe_routing(s, seed);
    std::vector<float> tw(idv.size());
    for (size_t i = 0; i < tw.size(); ++i) tw[i] = 0.05f + 0.9f * static_cast<float>((i * 37) % 101) / 101.0f;
    x = put(be, xv), gate_up = put(be, wgu, DType::BF16), down = put(be, wd, DType::BF16);
    ids = put_raw(be, idv, DType::I32), weights = put(be, tw);
    out = poisoned(be, xv.size());
    p = ops::MoeParams{x.f32(),       ids.t.as<int32_t>(),
                       weights.f32(), gate_up.t.data,
                       down.t.data,   DType::BF16,
                       out.f32(),     s.tokens,
                       s.hidden,      s.inter,
                       s.experts,     s.top_k};
    if (s.shared_inter > 0) {
      const auto sgu = bf16_round(moe_uniform(static_cast<size_t>(2 * s.shared_inter * s.hidden), seed + 11, 0.08f));
      const auto sd = bf16_round(moe_uniform(static_cast<size_t>(s.hidden * s.shared_inter), seed + 13, 0.08f));
      shared_gate_up = put(be, sgu, DType::BF16), shared_down = put(be, sd, DType::BF16);
      p.w_shared_gate_up = shared_gate_up.t.data, p.w_shared_down = shared_down.t.data;
      p.shared_inter = s.shared_inter;
    }
    if (addv) add = put(be, *addv), p.add = add.f32();
  }
};

inline std::vector<float> run_moe_experts(ops::Backend& be, const MoeShape& s, uint64_t seed,
                                          const std::vector<float>& x, const std::vector<float>* add = nullptr) {
  MoeOnBackend m(be, s, seed, x, add);
  be.moe(m.p);
  return get(be, m.out);
}

}  // namespace kiln::test
