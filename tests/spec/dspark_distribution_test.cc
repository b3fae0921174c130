// Speculative sampling with the DSpark block drafter follows plain sampling's distribution
// (temperature 1, top-k and top-p): a chi-square test over (t0, t1) pairs on kiln-tiny with a
// random-weight draft of its shapes. The draft's Markov head is planted with the target's most
// likely t1 after each possible t0 (dspark_util.h), so drafts are accepted often but not always:
// both the accept and the residual paths are in the sample.
#include "dspark_util.h"
#include "spec/block_drafter_speculator.h"
#include "spec_chi_square.h"

namespace kiln::spec {
namespace {

TEST(DsparkDrafter, SampledPairsFollowPlainSamplingsDistribution) {
  // max_tokens 3: the prefill draws t0 as plain sampling does, then one verify step over one block
  // draft (anchor t0, context the prompt's hidden states) emits t1. (t0, t1) must be distributed as
  // p(t0) p(t1 | t0) of the target under the request's top-k 4 and top-p 0.9.
  constexpr int kSamples = 800;
  const std::vector<int32_t>& prompt = models().prompts[1];
  SamplingParams s;
  s.temperature = 1.0f, s.top_k = 4, s.top_p = 0.9f;
  const std::vector<float> p0 = next_probs(prompt, s);
  const std::map<int32_t, std::vector<float>> p1 = second_probs(prompt, p0, s);
  std::vector<std::pair<int32_t, int32_t>> plant;
  for (const auto& [a, q] : p1)
    plant.emplace_back(a, static_cast<int32_t>(std::max_element(q.begin(), q.end()) - q.begin()));
  std::vector<Request> reqs;
  for (int i = 0; i < kSamples; ++i) {
    reqs.push_back(request(prompt, 3, 1.0f, 9000 + static_cast<uint64_t>(i)));
    reqs.back().sampling.top_k = s.top_k, reqs.back().sampling.top_p = s.top_p;
  }
  EngineConfig c = config(0, 8, 2048);
  c.speculator = make_speculator("dspark", test::write_dspark_draft("chi2", test::dspark_tiny_config(), plant), 1,
                                 *models().target);
  Engine spec(*models().target, std::move(c));
  const auto got = run_all(spec, reqs);
  EXPECT_EQ(spec.stats().spec.verifies, kSamples);
  EXPECT_GT(spec.stats().spec.accepted_tokens, kSamples / 10) << "the planted bigrams must be accepted";
  EXPECT_LT(spec.stats().spec.accepted_tokens, kSamples) << "some drafts must be rejected for the test to bite";

  expect_under_chi2_999(pair_chi_square(got, kSamples, p0, p1), kSamples, spec.stats().spec.accepted_tokens);
}

}  // namespace
}  // namespace kiln::spec
