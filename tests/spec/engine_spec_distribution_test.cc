// Speculative sampling through the engine follows plain sampling's distribution: the pairs of
// tokens a verify step decides, counted over many seeds, against the target's own probabilities.
// Hundreds of kiln-tiny steps: kept out of the sanitizer pass.
#include "spec_chi_square.h"

namespace kiln::spec {
namespace {

TEST(EngineSpec, SampledPairsFollowPlainSamplingsDistribution) {
  // max_tokens 3: the prefill draws t0 as plain sampling does, then one verify step over one
  // draft emits t1 (the accepted draft or the residual draw). (t0, t1) must be distributed as
  // p(t0) p(t1 | t0) of the target: 16 cells under top_k 4.
  constexpr int kSamples = 800;
  const std::vector<int32_t>& prompt = models().prompts[1];
  SamplingParams s;
  s.temperature = 1.0f, s.top_k = 4;
  std::vector<Request> reqs;
  for (int i = 0; i < kSamples; ++i) {
    reqs.push_back(request(prompt, 3, 1.0f, 7000 + static_cast<uint64_t>(i)));
    reqs.back().sampling.top_k = 4;
  }
  Engine spec(*models().target, config(1, 8, 2048));
  const auto got = run_all(spec, reqs);
  EXPECT_EQ(spec.stats().spec.verifies, kSamples);
  EXPECT_GT(spec.stats().spec.accepted_tokens, 0);
  EXPECT_LT(spec.stats().spec.accepted_tokens, kSamples) << "some drafts must be rejected for the test to bite";

  const std::vector<float> p0 = next_probs(prompt, s);
  const auto [chi2, cells] = pair_chi_square(got, kSamples, p0, second_probs(prompt, p0, s));
  ASSERT_EQ(cells, 16);
  // 15 degrees of freedom: P(chi2 > 37.7) = 0.001 under the null.
  EXPECT_LT(chi2, 37.7);
  std::printf("chi-square %.2f over %d cells, %d samples\n", chi2, cells, kSamples);
}

}  // namespace
}  // namespace kiln::spec
