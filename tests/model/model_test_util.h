// Shared by the model tests: comparing two models' logits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "model/deepseek_v3.h"

namespace kiln::test {

// Relative max difference of two logit vectors.
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, static_cast<double>(std::fabs(a[i] - b[i])));
    den = std::max(den, static_cast<double>(std::fabs(a[i])));
  }
  return num / den;
}

// Feeds ids[from, end) one token a step to `a` and to `b` (decode over each one's cache) and
// returns each one's logit rows, concatenated.
inline std::pair<std::vector<float>, std::vector<float>> decode_both(DeepseekV3Model& a, SequenceCache& ca,
                                                                     DeepseekV3Model& b, SequenceCache& cb,
                                                                     const std::vector<int32_t>& ids, int64_t from) {
  std::vector<float> sa, sb;
  for (auto i = static_cast<size_t>(from); i < ids.size(); ++i) {
    auto ra = a.forward({ids[i]}, ca, false);
    auto rb = b.forward({ids[i]}, cb, false);
    sa.insert(sa.end(), ra.begin(), ra.end());
    sb.insert(sb.end(), rb.begin(), rb.end());
  }
  return {std::move(sa), std::move(sb)};
}

}  // namespace kiln::test
