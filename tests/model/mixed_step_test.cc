// A step that mixes decode rows with prompt chunks (each sequence in its own attention form:
// absorbed for the decodes, expanded over its own context for each chunk) gives the logits the
// same rows give in separate steps: a pure decode step, the chunk over its cached prefix alone,
// the new prompt alone. On every fixture, CPU always; CUDA when a GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/sampler.h"
#include "model/deepseek_v3.h"
#include "test_util.h"

namespace kiln::test {
namespace {

constexpr int64_t kBlock = 16, kBlocksPerSeq = 8;

// One sequence's part of a step: tokens [start, start + n) of `ids`, in blocks of sequence `slot`.
struct Part {
  int64_t slot;
  const std::vector<int32_t>* ids;
  int64_t start, n;
};

// Every row's logits are requested, so every row is compared.
ForwardBatch batch_of(const std::vector<Part>& parts) {
  ForwardBatch fb;
  fb.max_blocks = kBlocksPerSeq;
  fb.cu_q = {0};
  for (const Part& p : parts) {
    for (int64_t i = 0; i < kBlocksPerSeq; ++i)
      fb.block_tables.push_back(static_cast<int32_t>(p.slot * kBlocksPerSeq + i));
    for (int64_t t = p.start; t < p.start + p.n; ++t) {
      fb.logit_rows.push_back(static_cast<int32_t>(fb.tokens.size()));
      fb.tokens.push_back((*p.ids)[static_cast<size_t>(t)]);
      fb.positions.push_back(static_cast<int32_t>(t));
      fb.slot_mapping.push_back(static_cast<int32_t>(p.slot * kBlocksPerSeq * kBlock + t));
    }
    fb.cu_q.push_back(static_cast<int32_t>(fb.tokens.size()));
    fb.kv_lens.push_back(static_cast<int32_t>(p.start + p.n));
  }
  return fb;
}

std::vector<int32_t> ids_of(int64_t n, int64_t seed, int64_t vocab) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<int32_t>((seed * 131 + i * 37 + i * i) % vocab));
  return v;
}

// Largest |Δ logprob| over matching rows.
double worst_logprob_gap(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t r = 0; r * vocab < std::min(a.size(), b.size()); ++r) {
    const std::vector<float> la = log_softmax_row(a.data() + r * vocab, vocab);
    const std::vector<float> lb = log_softmax_row(b.data() + r * vocab, vocab);
    for (int64_t v = 0; v < vocab; ++v)
      worst = std::max(worst, static_cast<double>(std::fabs(la[static_cast<size_t>(v)] - lb[static_cast<size_t>(v)])));
  }
  return worst;
}

struct Case {
  std::string fixture;
  std::string device;
};

class MixedStep : public ::testing::TestWithParam<Case> {};

TEST_P(MixedStep, MatchesTheSameRowsInSeparateSteps) {
  const Case& c = GetParam();
  if (c.device == "cuda" && !ops::cuda_available()) GTEST_SKIP() << "no CUDA GPU (or a build without CUDA)";
  auto be = c.device == "cuda" ? ops::make_cuda_backend() : ops::make_cpu_backend();
  auto model = DeepseekV3Model::load(data_path("fixtures/" + c.fixture), *be);
  const int64_t V = model->config().vocab_size;
  if (c.device == "cuda") model->set_kv_dtype(DType::F32);  // the comparison is of batching, not of cache rounding
  // A and B: prompts already in the cache, now decoding; C: a long prompt whose first chunk is
  // cached and whose second chunk runs now; D: a new prompt.
  const std::vector<int32_t> a = ids_of(21, 1, V), b = ids_of(9, 2, V), cc = ids_of(70, 3, V), d = ids_of(33, 4, V);
  auto history = [&](LatentKvPool& pool) {
    model->forward(batch_of({{0, &a, 0, 20}, {1, &b, 0, 8}}), pool);
    model->forward(batch_of({{2, &cc, 0, 40}}), pool);  // C's first chunk: a 40-token cached prefix
  };
  LatentKvPool mixed = model->new_pool(4 * kBlocksPerSeq, kBlock), apart = model->new_pool(4 * kBlocksPerSeq, kBlock);
  history(mixed);
  history(apart);
  // Interleaved on purpose: the forward orders sequences by form itself.
  const std::vector<float> got =
      model->forward(batch_of({{0, &a, 20, 1}, {2, &cc, 40, 30}, {1, &b, 8, 1}, {3, &d, 0, 33}}), mixed);
  const std::vector<float> dec = model->forward(batch_of({{0, &a, 20, 1}, {1, &b, 8, 1}}), apart);
  const std::vector<float> chunk = model->forward(batch_of({{2, &cc, 40, 30}}), apart);
  const std::vector<float> prompt = model->forward(batch_of({{3, &d, 0, 33}}), apart);
  // The same rows in the mixed step's order: A, C's chunk, B, D.
  std::vector<float> want(dec.begin(), dec.begin() + V);
  want.insert(want.end(), chunk.begin(), chunk.end());
  want.insert(want.end(), dec.begin() + V, dec.end());
  want.insert(want.end(), prompt.begin(), prompt.end());
  const double worst = worst_logprob_gap(got, want, V);
  // CPU: the same ops over the same rows, so only summation order may differ. CUDA: tile shapes
  // change with the batch (bf16 tensor cores), a batch-size effect, not a form one.
  EXPECT_LE(worst, c.device == "cpu" ? 1e-4 : 2e-2) << c.fixture;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (const char* f :
       {"h5_noqlora_dense2_odd", "h12_qlora_grouped_yarn", "h24_kimi_k2_style", "h12_mla512_moonlight_widths"})
    for (const char* d : {"cpu", "cuda"}) v.push_back({f, d});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MixedStep, ::testing::ValuesIn(cases()),
                         [](const auto& p) { return p.param.fixture + "_" + p.param.device; });

}  // namespace
}  // namespace kiln::test
