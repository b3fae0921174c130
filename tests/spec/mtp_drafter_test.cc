// The MTP / NextN drafter on the bundled kiln-tiny (one trained MTP layer): the hidden-state and
// input plumbing it runs on, and inside the engine greedy output is the plain engine's token for
// token under continuous batching, chunked prefill, preemption and prefix-cache hits
// (mtp_quality_test: its held-out NLL against PyTorch's, its acceptance, sampling's distribution).
#include <cmath>

#include "core/error.h"
#include "mtp_util.h"

namespace kiln::spec {
namespace {

TEST(MtpLayer, HiddenStateTapsLeaveTheLogitsAlone) {
  // The plumbing the drafter relies on: asking for hidden states changes no logit, and a row's taps
  // are the same when its sequence is batched before a one-token sequence (which the forward moves
  // first: absorbed form). mtp_quality_test checks the final-norm tap's meaning against PyTorch.
  DeepseekV3Model& target = *models().target;
  const std::vector<int32_t>& p = models().prompts[3];
  const auto n = static_cast<int64_t>(p.size());
  const int64_t H = target.config().hidden_size;
  const std::vector<int32_t> taps = {0, kHiddenFinalNorm, static_cast<int32_t>(target.config().num_hidden_layers - 1)};
  ForwardBatch b = one_sequence(p, 1);
  b.logit_rows = {static_cast<int32_t>(n - 1)};
  LatentKvPool pool = target.new_pool(2, 64);
  const std::vector<float> plain = target.forward(b, pool);
  b.hidden_rows = iota_rows(n);
  b.hidden_taps = taps;
  EXPECT_EQ(target.forward(b, pool), plain);
  const Tensor hs = target.hidden_states();
  ASSERT_EQ(hs.shape, (Shape{n, 3, H}));
  std::vector<float> alone(static_cast<size_t>(hs.numel()));
  target.backend().download(alone.data(), hs);
  EXPECT_NE(alone[0], alone[static_cast<size_t>(H)]);  // layer 0 is not the final norm

  // Sequence 0 is the prompt (expanded form), sequence 1 one token in block 1 (absorbed: runs first).
  ForwardBatch both = b;
  both.tokens.push_back(p[0]);
  both.positions.push_back(0);
  both.slot_mapping.push_back(64);
  both.cu_q.push_back(static_cast<int32_t>(n + 1));
  both.kv_lens.push_back(1);
  both.block_tables = {0, 1};
  both.hidden_rows.push_back(static_cast<int32_t>(n));
  target.forward(both, pool);
  std::vector<float> mixed(static_cast<size_t>(target.hidden_states().numel()));
  ASSERT_EQ(mixed.size(), alone.size() + static_cast<size_t>(3 * H));
  target.backend().download(mixed.data(), target.hidden_states());
  for (size_t i = 0; i < alone.size(); ++i) ASSERT_NEAR(mixed[i], alone[i], 1e-4) << "value " << i;
  for (size_t i = 0; i < static_cast<size_t>(3 * H); ++i)  // the one-token sequence is the prompt's first row
    ASSERT_NEAR(mixed[alone.size() + i], alone[i], 1e-4) << "value " << i;
}

TEST(MtpLayer, InputsFollowTheirRowsWhenTheBatchIsReordered) {
  // A prompt-like sequence (expanded form) before a one-token one (absorbed): the model runs the
  // absorbed one first, so each sequence's input rows must move with it.
  DeepseekV3Model& target = *models().target;
  MtpLayer layer(model_dir("kiln-tiny"), target.config(), target.backend());
  const int64_t H = target.config().hidden_size;
  std::vector<float> h(static_cast<size_t>(4 * H));
  for (size_t i = 0; i < h.size(); ++i) h[i] = std::sin(0.37f * static_cast<float>(i));
  auto run = [&](std::vector<int64_t> lens, std::vector<int32_t> tokens, std::span<const float> hs) {
    ForwardBatch b;
    b.cu_q.push_back(0);
    int32_t block = 0;
    for (int64_t len : lens) {
      for (int64_t p = 0; p < len; ++p) {
        b.positions.push_back(static_cast<int32_t>(p));
        b.slot_mapping.push_back(block * 16 + static_cast<int32_t>(p));
      }
      b.cu_q.push_back(b.cu_q.back() + static_cast<int32_t>(len));
      b.kv_lens.push_back(static_cast<int32_t>(len));
      b.block_tables.push_back(block++);
      b.logit_rows.push_back(b.cu_q.back() - 1);
    }
    b.tokens = std::move(tokens);
    b.max_blocks = 1;
    LatentKvPool pool = layer.new_pool(2, 16);
    std::vector<float> normed;
    return layer.forward(b, hs, pool, normed);
  };
  const std::span<const float> all(h);
  const std::vector<float> both = run({3, 1}, {11, 12, 13, 14}, all);
  const std::vector<float> first = run({3}, {11, 12, 13}, all.first(static_cast<size_t>(3 * H)));
  const std::vector<float> second = run({1}, {14}, all.subspan(static_cast<size_t>(3 * H)));
  // Equal up to the rounding of batched GEMMs; rows moved wrongly would differ by whole units.
  const size_t V = static_cast<size_t>(target.config().vocab_size);
  ASSERT_EQ(both.size(), 2 * V);
  for (size_t i = 0; i < V; ++i) {
    ASSERT_NEAR(both[i], first[i], 1e-4) << "logit " << i;
    ASSERT_NEAR(both[V + i], second[i], 1e-4) << "logit " << i;
  }
}

// The target's final-norm hidden states of every position of `ctx` [n, hidden], as the engine hands them.
std::vector<float> target_hidden(const std::vector<int32_t>& ctx) {
  DeepseekV3Model& target = *models().target;
  const auto n = static_cast<int64_t>(ctx.size());
  ForwardBatch b = one_sequence(ctx, kv::blocks_for(n, 64));
  b.hidden_rows = iota_rows(n);
  b.hidden_taps = {kHiddenFinalNorm};
  LatentKvPool pool = target.new_pool(b.max_blocks, 64);
  target.forward_logits(b, pool);
  std::vector<float> h(static_cast<size_t>(target.hidden_states().numel()));
  target.backend().download(h.data(), target.hidden_states());
  return h;
}

TEST(MtpDrafter, ACacheDroppedForRoomIsRebuiltWithTheSameDrafts) {
  // A pool with room for one sequence: drafting B drops A's cache and A's hidden states are gone,
  // so drafting A again rebuilds them with the target; its drafts are the ones a roomy drafter makes.
  DeepseekV3Model& target = *models().target;
  const std::vector<int32_t> a = models().prompts[3], b = models().prompts[2];  // 32 and 23 tokens
  SamplingParams greedy;
  greedy.temperature = 0;
  auto draft = [&](MtpDrafter& d, int64_t id, const std::vector<int32_t>& ctx, bool hand_over) {
    if (hand_over) d.accept_hidden(id, 0, static_cast<int64_t>(ctx.size()), target_hidden(ctx));
    const DraftInput in{id, ctx, &greedy, 1, 0};
    DraftOutput out;
    d.propose(std::span<const DraftInput>(&in, 1), 3, out);
    return out.tokens;
  };
  auto make = [&](int64_t blocks) {
    return MtpDrafter(std::make_unique<MtpLayer>(model_dir("kiln-tiny"), target.config(), target.backend()), target,
                      blocks, 8);
  };
  MtpDrafter roomy = make(64), tight = make(5);  // 40 tokens: A (32 + 3 - 2) or B, not both
  const std::vector<int32_t> want = draft(roomy, 1, a, true);
  EXPECT_EQ(draft(tight, 1, a, true), want);
  draft(tight, 2, b, true);  // takes A's blocks
  EXPECT_EQ(tight.rebuilt_positions(), 0);
  EXPECT_EQ(draft(tight, 1, a, false), want);
  EXPECT_EQ(tight.rebuilt_positions(), static_cast<int64_t>(a.size()) - 2) << "all but the last true row's";
}

TEST(MtpDrafter, GreedyOutputIsThePlainEnginesUnderContinuousBatching) {
  const std::vector<Request> reqs = mixed_requests();
  Engine plain(*models().target, config(0));
  const auto want = run_all(plain, reqs);
  for (int64_t k : {1, 3, 5}) {
    MtpSpec s = mtp_speculator(k);
    Engine spec(*models().target, mtp_config(s));
    EXPECT_EQ(run_all(spec, reqs), want) << "K " << k;
    const SpecDecodeStats st = spec.stats().spec;
    EXPECT_GT(st.accepted_tokens, 0);
    EXPECT_GT(st.mean_accepted_length(), 1.3) << "K " << k;
    EXPECT_LT(spec.stats().decode_steps, plain.stats().decode_steps) << "K " << k;
    EXPECT_EQ(s.drafter->rebuilt_positions(), 0) << "the engine handed over every hidden state";
    EXPECT_EQ(s.drafter->num_states(), 0) << "finished requests release their state";
  }
}

TEST(MtpDrafter, ChunkedPrefillsAndPreemptionLoseNothing) {
  const std::vector<Request> reqs = mixed_requests();
  Engine plain(*models().target, config(0));
  const auto want = run_all(plain, reqs);
  {
    MtpSpec s = mtp_speculator(3);
    EngineConfig c = mtp_config(s);
    c.scheduler.max_prefill_chunk = 4;  // verify rows beside prompt chunks
    Engine spec(*models().target, std::move(c));
    EXPECT_EQ(run_all(spec, reqs), want);
    EXPECT_GT(spec.stats().spec.mean_accepted_length(), 1.3);
  }
  MtpSpec s = mtp_speculator(4);
  Engine tight(*models().target, mtp_config(s, 4, 20));  // 80 tokens for ~200 wanted
  EXPECT_EQ(run_all(tight, reqs), want);
  EXPECT_GT(tight.stats().preemptions, 0);
  EXPECT_GT(tight.stats().spec.mean_accepted_length(), 1.3);
}

TEST(MtpDrafter, PrefixCacheHitsAreRebuiltAndGiveTheSameTokens) {
  // Later requests continue the first one's prompt and output: their prefixes come from the
  // prefix cache, so the target never computes those hidden states; the drafter rebuilds them.
  const std::vector<int32_t>& base = models().prompts[4];
  Engine plain(*models().target, config(0));
  MtpSpec s = mtp_speculator(3);
  Engine spec(*models().target, mtp_config(s, 4));
  std::vector<int32_t> prompt = base;
  for (int round = 0; round < 3; ++round) {
    std::vector<Request> one;
    one.push_back(request(prompt, 20));
    const auto want = run_all(plain, one);
    EXPECT_EQ(run_all(spec, one), want) << "round " << round;
    prompt.insert(prompt.end(), want[0].begin(), want[0].begin() + 15);
  }
  EXPECT_GT(spec.stats().prefix_hit_tokens, static_cast<int64_t>(base.size()));
  EXPECT_GT(s.drafter->rebuilt_positions(), 0);
  EXPECT_GT(spec.stats().spec.mean_accepted_length(), 1.3);
}

TEST(MtpDrafter, SampledOutputFollowsTheSeedWhateverIsBatched) {
  const std::vector<Request> reqs = sampled_mixed_requests();
  MtpSpec s = mtp_speculator(3);
  Engine spec(*models().target, mtp_config(s));
  const auto together = expect_alone_as_together(spec, reqs);
}

TEST(MtpDrafter, MakeSpeculatorTakesBothSpellings) {
  for (const char* a : {"mtp", "deepseek_mtp"}) {
    auto s = make_speculator(a, model_dir("kiln-tiny"), 2, *models().target);
    EXPECT_STREQ(s->name(), "mtp");
    EXPECT_EQ(s->hidden_taps(), std::vector<int32_t>{kHiddenFinalNorm});
  }
  // kiln-tiny-draft has no NextN layer.
  EXPECT_THROW(make_speculator("mtp", model_dir("kiln-tiny-draft"), 2, *models().target), Error);
}

}  // namespace
}  // namespace kiln::spec
