// Decode steps replayed from CUDA graphs give what the same steps give op by op, at batch sizes
// that are and are not captured sizes (padding by repeating the last sequence must be harmless),
// on the fixture checkpoints. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "model/deepseek_v3.h"
#include "test_util.h"

namespace kiln::test {

namespace {

// `B` sequences of different lengths, blocks_per_seq blocks each: decode step `s` for all of them.
ForwardBatch decode_step(int64_t B, int64_t step, int64_t blocks_per_seq, int64_t bs, int64_t vocab) {
  ForwardBatch fb;
  fb.max_blocks = blocks_per_seq;
  fb.cu_q = {0};
  for (int64_t b = 0; b < B; ++b) {
    const int64_t pos = 3 + 5 * b + step;  // prompt of 3 + 5b tokens, then `step` decoded ones
    for (int64_t i = 0; i < blocks_per_seq; ++i)
      fb.block_tables.push_back(static_cast<int32_t>(b * blocks_per_seq + i));
    fb.logit_rows.push_back(static_cast<int32_t>(b));
    fb.tokens.push_back(static_cast<int32_t>((b * 31 + step * 17) % vocab));
    fb.positions.push_back(static_cast<int32_t>(pos));
    fb.slot_mapping.push_back(static_cast<int32_t>(b * blocks_per_seq * bs + pos));
    fb.cu_q.push_back(static_cast<int32_t>(b + 1));
    fb.kv_lens.push_back(static_cast<int32_t>(pos + 1));
  }
  return fb;
}

ForwardBatch prompts(int64_t B, int64_t blocks_per_seq, int64_t bs, int64_t vocab) {
  ForwardBatch fb;
  fb.max_blocks = blocks_per_seq;
  fb.cu_q = {0};
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = 3 + 5 * b;
    for (int64_t i = 0; i < blocks_per_seq; ++i)
      fb.block_tables.push_back(static_cast<int32_t>(b * blocks_per_seq + i));
    for (int64_t p = 0; p < len; ++p) {
      fb.tokens.push_back(static_cast<int32_t>((b * 7 + p * 13) % vocab));
      fb.positions.push_back(static_cast<int32_t>(p));
      fb.slot_mapping.push_back(static_cast<int32_t>(b * blocks_per_seq * bs + p));
    }
    fb.logit_rows.push_back(static_cast<int32_t>(fb.tokens.size() - 1));
    fb.cu_q.push_back(static_cast<int32_t>(fb.tokens.size()));
    fb.kv_lens.push_back(static_cast<int32_t>(len));
  }
  return fb;
}

class CudaGraphs : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGraphs, DecodeStepsMatchEager) {
  if (!ops::cuda_available()) GTEST_SKIP() << "no CUDA GPU (or a build without CUDA)";
  auto be = ops::make_cuda_backend();
  auto model = DeepseekV3Model::load(GetParam(), *be);
  const int64_t V = model->config().vocab_size, bs = 16, bps = 8;
  for (int64_t B : {1, 3, 5, 8, 13, 20}) {
    SCOPED_TRACE(B);
    LatentKvPool eager = model->new_pool(B * bps, bs), graphed = model->new_pool(B * bps, bs);
    model->forward(prompts(B, bps, bs, V), eager);
    model->forward(prompts(B, bps, bs, V), graphed);
    model->enable_decode_graphs(graphed, 32, bps);  // `eager` is another pool: never replayed
    for (int64_t step = 0; step < 4; ++step) {      // step 0 captures, later ones replay
      const ForwardBatch fb = decode_step(B, step, bps, bs, V);
      const std::vector<float> want = model->forward(fb, eager);
      const std::vector<float> got = model->forward(fb, graphed);
      ASSERT_EQ(got.size(), want.size());
      double worst = 0, scale = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
      }
      EXPECT_LE(worst, 1e-4 * std::max(1.0, scale)) << "step " << step;
    }
    model->disable_decode_graphs();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGraphs, ::testing::ValuesIn(fixture_dirs()),
                         [](const auto& p) { return std::filesystem::path(p.param).filename().string(); });

}  // namespace
}  // namespace kiln::test
