// Router (sigmoid, bias for choice, grouped top-k) and routed experts.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/quant.h"

namespace kiln::ops::cpu {
namespace {

// Indices of the k largest values (ties: lower index first, as a stable order).
std::vector<int64_t> top_k_indices(const std::vector<float>& v, int64_t k) {
  std::vector<int64_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
    const float va = v[static_cast<size_t>(a)], vb = v[static_cast<size_t>(b)];
    return va > vb || (va == vb && a < b);
  });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

// Expert e's slice of a per-expert weight [E, n, k] and of its scales [E, grid of one].
LinearParams expert_linear(const float* x, const void* w, DType t, const WeightScales& s, int64_t e, float* y,
                           int64_t m, int64_t n, int64_t k) {
  LinearParams l{x, 0, static_cast<const char*>(w) + static_cast<size_t>(e * weight_elems(t, n, k)) * dtype_size(t),
                 t, y, 0,
                 m, n, k};
  l.w_scales = s;
  if (s.quantized())
    l.w_scales.data =
        static_cast<const char*>(s.data) + static_cast<size_t>(e * scale_elems(s, n, k)) * dtype_size(s.dtype);
  return l;
}

}  // namespace

void router(const RouterParams& p_in) {
  RouterParams p = p_in;
  if (p.x) {  // the fused gate projection: logits first, then the same routing
    KILN_CHECK(p.gate_weight && p.gate_logits && p.hidden > 0,
               "router: a fused gate needs its weight, output and width");
    if (p.norm_weight) {  // the input norm first, into normed_x: the gate reads that
      KILN_CHECK(p.normed_x, "router: a fused input norm needs its output");
      RmsNormParams n{p.x, 0, p.norm_weight, p.norm_weight_dtype, p.normed_x, 0, p.num_tokens, p.hidden, p.norm_eps};
      n.residual = p.norm_residual;
      rms_norm(n);
      p.x = p.normed_x;
    }
    linear({p.x, 0, p.gate_weight, DType::F32, p.gate_logits, 0, p.num_tokens, p.num_experts, p.hidden});
    p.logits = p.gate_logits;
  }
  const int64_t E = p.num_experts, per_group = E / p.n_group;
  KILN_CHECK(E % p.n_group == 0 && p.topk_group <= p.n_group && p.top_k <= p.topk_group * per_group,
             "router: {} experts cannot be split into {} groups keeping {} for top-{}", E, p.n_group, p.topk_group,
             p.top_k);
  std::vector<float> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E)),
      group(static_cast<size_t>(p.n_group));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      const float s = 1.0f / (1.0f + std::exp(-p.logits[t * E + e]));
      score[static_cast<size_t>(e)] = s;
      choice[static_cast<size_t>(e)] = s + p.bias[e];
    }
    // A group's strength is the sum of its two best biased scores.
    for (int64_t g = 0; g < p.n_group; ++g) {
      std::vector<float> members(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
      auto best = top_k_indices(members, std::min<int64_t>(2, per_group));
      float sum = 0;
      for (int64_t i : best) sum += members[static_cast<size_t>(i)];
      group[static_cast<size_t>(g)] = sum;
    }
    std::vector<char> keep(static_cast<size_t>(p.n_group), 0);
    for (int64_t g : top_k_indices(group, p.topk_group)) keep[static_cast<size_t>(g)] = 1;
    // Dropped groups score 0.0 (not -inf), exactly as transformers masks them.
    for (int64_t e = 0; e < E; ++e)
      if (!keep[static_cast<size_t>(e / per_group)]) choice[static_cast<size_t>(e)] = 0.0f;
    auto chosen = top_k_indices(choice, p.top_k);
    float denom = 0;
    for (int64_t e : chosen) denom += score[static_cast<size_t>(e)];
    for (int64_t j = 0; j < p.top_k; ++j) {
      const int64_t e = chosen[static_cast<size_t>(j)];
      float w = score[static_cast<size_t>(e)];
      if (p.norm_topk_prob) w /= (denom + 1e-20f);
      p.topk_ids[t * p.top_k + j] = static_cast<int32_t>(e);
      p.topk_weights[t * p.top_k + j] = w * p.routed_scaling_factor;
    }
  }
}

void moe(const MoeParams& p) {
  const int64_t H = p.hidden, I = p.inter;
  std::fill(p.out, p.out + p.num_tokens * H, 0.0f);
  // Gather the tokens of each expert so each runs as one GEMM.
  std::vector<std::vector<std::pair<int64_t, float>>> by_expert(static_cast<size_t>(p.num_experts));
  for (int64_t t = 0; t < p.num_tokens; ++t)
    for (int64_t j = 0; j < p.top_k; ++j) {
      const int32_t e = p.topk_ids[t * p.top_k + j];
      KILN_CHECK(e >= 0 && e < p.num_experts, "moe: expert id {} out of range [0, {})", e, p.num_experts);
      by_expert[static_cast<size_t>(e)].push_back({t, p.topk_weights[t * p.top_k + j]});
    }
  check_weight("moe experts", p.w_dtype, p.w_gate_up_scales);
  check_weight("moe experts", p.w_dtype, p.w_down_scales);
  KILN_CHECK(p.w_gate_up_scales.quantized() == p.w_down_scales.quantized(),
             "moe: gate/up and down weights must both be scaled or both plain");
  for (int64_t e = 0; e < p.num_experts; ++e) {
    const auto& toks = by_expert[static_cast<size_t>(e)];
    if (toks.empty()) continue;
    const int64_t n = static_cast<int64_t>(toks.size());
    std::vector<float> xin(static_cast<size_t>(n * H)), gu(static_cast<size_t>(n * 2 * I)),
        act(static_cast<size_t>(n * I)), y(static_cast<size_t>(n * H));
    for (int64_t i = 0; i < n; ++i) std::copy_n(p.x + toks[static_cast<size_t>(i)].first * H, H, xin.data() + i * H);
    linear(expert_linear(xin.data(), p.w_gate_up, p.w_dtype, p.w_gate_up_scales, e, gu.data(), n, 2 * I, H));
    swiglu({gu.data(), act.data(), n, I});
    linear(expert_linear(act.data(), p.w_down, p.w_dtype, p.w_down_scales, e, y.data(), n, H, I));
    for (int64_t i = 0; i < n; ++i) {
      const auto [t, w] = toks[static_cast<size_t>(i)];
      for (int64_t d = 0; d < H; ++d) p.out[t * H + d] += w * y[static_cast<size_t>(i * H + d)];
    }
  }
  if (p.shared_inter > 0) {  // the shared experts: one dense SwiGLU MLP over every token, weight 1
    KILN_CHECK(p.w_shared_gate_up && p.w_shared_down, "moe: shared experts need both weights");
    const int64_t T = p.num_tokens, S = p.shared_inter;
    std::vector<float> gu(static_cast<size_t>(T * 2 * S)), act(static_cast<size_t>(T * S)),
        y(static_cast<size_t>(T * H));
    linear(
        expert_linear(p.x, p.w_shared_gate_up, p.shared_dtype(), p.w_shared_gate_up_scales, 0, gu.data(), T, 2 * S, H));
    swiglu({gu.data(), act.data(), T, S});
    linear(expert_linear(act.data(), p.w_shared_down, p.shared_dtype(), p.w_shared_down_scales, 0, y.data(), T, H, S));
    for (int64_t i = 0; i < T * H; ++i) p.out[i] += y[static_cast<size_t>(i)];
  }
  if (p.add)
    for (int64_t i = 0; i < p.num_tokens * H; ++i) p.out[i] += p.add[i];
}

}  // namespace kiln::ops::cpu
