// The engine on a fixture model (CPU): batching, chunked prefill, prefix reuse, preemption,
// cancellation, seeds and stop conditions all leave each request's output as if it ran alone.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <future>
#include <random>
#include <thread>

#include "core/error.h"
#include "test_util.h"

namespace kiln::test {
namespace {

struct Fixture {
  std::unique_ptr<ops::Backend> be = ops::make_cpu_backend();
  std::unique_ptr<DeepseekV3Model> model;
  Fixture() { model = DeepseekV3Model::load(data_path("fixtures/h12_qlora_grouped_yarn"), *be); }
  int64_t vocab() const { return model->config().vocab_size; }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

EngineConfig small_config(int64_t block_size = 16, int64_t num_blocks = 256) {
  EngineConfig c;
  c.block_size = block_size;
  c.kv.num_blocks = num_blocks;
  c.check_invariants = true;
  return c;
}

std::vector<int32_t> random_prompt(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(2 + rng() % 150));  // past bos/eos
  return p;
}

Request greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.logprobs = true;
  r.sampling.top_logprobs = 3;
  return r;
}

Request clone(const Request& r) {
  Request c;
  c.prompt = r.prompt;
  c.sampling = r.sampling;
  return c;
}

OutputChunk drain(RequestStream& s) {
  OutputChunk all;
  while (auto c = s.next()) all.merge(std::move(*c));
  EXPECT_TRUE(all.finish.has_value());
  EXPECT_EQ(all.error, "");
  return all;
}

std::vector<OutputChunk> run_all(Engine& e, const std::vector<Request>& reqs) {
  std::vector<RequestStream> streams;
  for (const auto& r : reqs) streams.push_back(e.submit(clone(r)));
  std::vector<OutputChunk> out;
  for (auto& s : streams) out.push_back(drain(s));
  return out;
}

std::vector<Request> one(const Request& r) {
  std::vector<Request> v;
  v.push_back(clone(r));
  return v;
}

OutputChunk run_alone(const Request& r, EngineConfig cfg = small_config()) {
  Engine e(*fixture().model, cfg);
  return run_all(e, one(r))[0];
}

// Same tokens; logprobs and top logprobs within `tol`, relative to the logprob's size (at least 1).
// Different batch shapes round differently even in one MLA form: OpenBLAS's sgemm gives a row
// results that depend on how many rows share the call (~3e-6 on values of ~5), and the layers add
// up such differences. Tokens must match exactly.
void expect_same(const OutputChunk& a, const OutputChunk& b, double tol) {
  auto near = [tol](float x, float y) { return std::fabs(x - y) <= tol * std::max(1.0f, std::fabs(y)); };
  ASSERT_EQ(a.token_ids, b.token_ids);
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
  for (size_t i = 0; i < a.logprobs.size(); ++i) {
    EXPECT_PRED2(near, a.logprobs[i], b.logprobs[i]) << "token " << i;
    ASSERT_EQ(a.top[i].size(), b.top[i].size());
    for (size_t k = 0; k < a.top[i].size(); ++k) {
      EXPECT_EQ(a.top[i][k].token, b.top[i][k].token);
      EXPECT_PRED2(near, a.top[i][k].logprob, b.top[i][k].logprob) << "token " << i << " alternative " << k;
    }
  }
  EXPECT_EQ(a.finish, b.finish);
}

TEST(Engine, BatchedPromptsMatchEachAlone) {
  std::vector<Request> reqs;
  const int64_t lens[] = {1, 5, 16, 23, 41, 70};
  for (int i = 0; i < 6; ++i) reqs.push_back(greedy(random_prompt(lens[i], 100 + i), 6 + i));
  Engine e(*fixture().model, small_config());
  auto together = run_all(e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE(i);
    auto alone = run_alone(reqs[i]);
    expect_same(together[i], alone, 1e-4);
    EXPECT_EQ(together[i].finish, FinishReason::Length);
    EXPECT_EQ(together[i].output_tokens, 6 + static_cast<int64_t>(i));
    EXPECT_EQ(together[i].prompt_tokens, lens[i]);
  }
}

TEST(Engine, StatsSplitTheLoopTimeByPhase) {
  Engine e(*fixture().model, small_config());
  run_all(e, one(greedy(random_prompt(30, 5), 4)));
  e.wait_idle();
  const EngineStats s = e.stats();
  EXPECT_GE(s.steps, 4);
  EXPECT_GT(s.forward_seconds, 0);
  EXPECT_GE(s.schedule_seconds, 0);
  EXPECT_GE(s.post_seconds, 0);
  EXPECT_GT(s.device_seconds, 0);
}

// The overlapped loop (step n+1 queued before step n's tokens are read) against the serial one:
// the same tokens for fixed seeds, greedy and sampled, through stop strings, max_tokens, a shared
// prefix and a pool small enough to preempt. Requests with penalties run serially either way.
TEST(Engine, OverlappedLoopGivesTheSerialLoopsTokens) {
  std::vector<Request> reqs;
  const std::vector<int32_t> shared = random_prompt(40, 77);
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> p = i % 3 == 0 ? shared : random_prompt(5 + 9 * i, 300 + i);
    if (i % 3 == 0) p.push_back(static_cast<int32_t>(10 + i));
    Request r = greedy(std::move(p), 6 + 3 * i);
    if (i % 2) r.sampling.temperature = 1.0f, r.sampling.top_k = 20, r.sampling.seed = 1000 + i;
    reqs.push_back(std::move(r));
  }
  auto run = [&](bool overlap, const std::vector<Request>& rs, EngineStats* stats) {
    EngineConfig c = small_config(16, 14);  // 224 tokens for ~600 wanted: preemption
    c.overlap_schedule = overlap;
    Engine e(*fixture().model, c);
    auto out = run_all(e, rs);
    e.wait_idle();
    *stats = e.stats();
    return out;
  };
  EngineStats serial_stats, overlap_stats;
  const auto serial = run(false, reqs, &serial_stats);
  const auto overlapped = run(true, reqs, &overlap_stats);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE(i);
    expect_same(overlapped[i], serial[i], 1e-4);
    EXPECT_EQ(overlapped[i].output_tokens, serial[i].output_tokens);
  }
  EXPECT_EQ(serial_stats.overlapped_steps, 0);
  EXPECT_GT(overlap_stats.overlapped_steps, overlap_stats.steps / 2);
  EXPECT_GT(overlap_stats.preemptions, 0);
  // A request whose penalties are counted on the host between steps keeps the loop serial.
  std::vector<Request> penalised;
  penalised.push_back(clone(reqs[1]));
  penalised[0].sampling.repetition_penalty = 1.3f;
  EngineStats pen_stats;
  run(true, penalised, &pen_stats);
  EXPECT_EQ(pen_stats.overlapped_steps, 0);
}

TEST(Engine, ChunkedPrefillGivesTheSameLogprobs) {
  const Request r = greedy(random_prompt(90, 7), 5);
  auto with_chunk = [&](int64_t chunk) {
    EngineConfig c = small_config();
    c.scheduler.max_prefill_chunk = chunk;
    c.prefix_caching = false;
    return run_alone(r, c);
  };
  const OutputChunk whole = with_chunk(0);
  for (int64_t chunk : {1, 7, 64}) {
    SCOPED_TRACE(chunk);
    expect_same(with_chunk(chunk), whole, 1e-5);
  }
  // The step budget splits prompts too.
  EngineConfig budget = small_config();
  budget.scheduler.max_batched_tokens = 13;
  expect_same(run_alone(r, budget), whole, 1e-5);
}

TEST(Engine, SharedPrefixReusesCachedBlocks) {
  const std::vector<int32_t> prefix = random_prompt(50, 11);
  std::vector<int32_t> longer = prefix;
  for (int32_t t : random_prompt(9, 12)) longer.push_back(t);
  Engine e(*fixture().model, small_config());
  auto first = run_all(e, one(greedy(prefix, 4)))[0];
  EXPECT_EQ(first.cached_prompt_tokens, 0);
  EXPECT_EQ(e.stats().prefix_hit_tokens, 0);

  // The same prompt again: 3 of its blocks come from the cache (the last token is recomputed).
  auto again = run_all(e, one(greedy(prefix, 4)))[0];
  EXPECT_EQ(again.cached_prompt_tokens, 48);
  expect_same(again, first, 1e-5);

  // A longer prompt sharing the prefix.
  auto extended = run_all(e, one(greedy(longer, 4)))[0];
  EXPECT_EQ(extended.cached_prompt_tokens, 48);
  EngineConfig no_cache = small_config();
  no_cache.prefix_caching = false;
  expect_same(extended, run_alone(greedy(longer, 4), no_cache), 1e-5);
  EXPECT_EQ(e.stats().prefix_hit_tokens, 96);
  EXPECT_GT(e.stats().blocks_cached, 0);
}

TEST(Engine, PreemptionWhenTheKvPoolIsTooSmallLosesNothing) {
  // 8 requests of up to 10 + 22 tokens need up to 8 blocks of 4 each; the pool holds 12 blocks.
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) {
    Request r = greedy(random_prompt(4 + i, 200 + i), 22);
    if (i % 2) {  // some sample: their generators must survive preemption too
      r.sampling.temperature = 0.9f;
      r.sampling.seed = 1000 + i;
    }
    reqs.push_back(std::move(r));
  }
  for (bool caching : {false, true}) {
    SCOPED_TRACE(caching);
    EngineConfig big = small_config(4, 512), small = small_config(4, 12);
    big.prefix_caching = small.prefix_caching = caching;
    Engine large(*fixture().model, big), tight(*fixture().model, small);
    auto want = run_all(large, reqs);
    auto got = run_all(tight, reqs);
    EXPECT_EQ(large.stats().preemptions, 0);
    EXPECT_GT(tight.stats().preemptions, 0);
    for (size_t i = 0; i < reqs.size(); ++i) {
      SCOPED_TRACE(i);
      expect_same(got[i], want[i], 1e-4);
    }
    EXPECT_EQ(tight.stats().running + tight.stats().waiting, 0);
  }
}

TEST(Engine, CancelFreesTheBlocks) {
  for (bool caching : {false, true}) {
    SCOPED_TRACE(caching);
    // Long enough (2400 tokens) that the cancel always lands while it runs.
    EngineConfig cfg = small_config(16, 160);
    cfg.prefix_caching = caching;
    Engine e(*fixture().model, cfg);
    const EngineStats base = e.stats();
    RequestStream s = e.submit(greedy(random_prompt(30, 5), 2400));
    auto first = s.next();  // it is running
    ASSERT_TRUE(first.has_value());
    s.cancel();
    OutputChunk rest;
    while (auto c = s.next()) rest.merge(std::move(*c));
    EXPECT_EQ(rest.finish, FinishReason::Abort);
    const EngineStats after = e.stats();
    EXPECT_EQ(after.running + after.waiting, 0);
    EXPECT_EQ(after.requests_aborted, 1);
    // Everything is free, or held only by the prefix cache and free to evict.
    EXPECT_EQ(after.blocks_free + after.blocks_cached, base.blocks_free);
    EXPECT_EQ(after.blocks_cached_evictable, after.blocks_cached);
    if (!caching) {
      EXPECT_EQ(after.blocks_free, base.blocks_total);
    }

    // Dropping the handle cancels too (a client that went away).
    { RequestStream gone = e.submit(greedy(random_prompt(30, 6), 2400)); }
    e.wait_idle();
    EXPECT_EQ(e.stats().requests_aborted, 2);
    EXPECT_EQ(e.stats().blocks_free + e.stats().blocks_cached, base.blocks_free);
  }
}

// stop() mid-run: the running request ends aborted, submit() refuses, and a thread waiting for
// the engine to go idle is released rather than left waiting for work that will never finish.
TEST(Engine, StopMidRunAbortsAndReleasesWaiters) {
  Engine e(*fixture().model, small_config(16, 160));
  RequestStream s = e.submit(greedy(random_prompt(30, 7), 2400));
  ASSERT_TRUE(s.next().has_value());  // it is running
  auto idle = std::async(std::launch::async, [&] { e.wait_idle(); });
  e.stop();
  OutputChunk rest;
  while (auto c = s.next()) rest.merge(std::move(*c));
  EXPECT_EQ(rest.finish, FinishReason::Abort);
  EXPECT_THROW(e.submit(greedy(random_prompt(5, 8), 4)), Error);
  ASSERT_EQ(idle.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "wait_idle() hangs after stop()";
  e.stop();  // idempotent
}

TEST(Engine, SeedGivesTheSameTokensWhateverElseIsBatched) {
  Request r;
  r.prompt = random_prompt(20, 31);
  r.sampling.temperature = 1.0f;
  r.sampling.top_k = 50;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = 1234;
  r.sampling.max_tokens = 16;
  r.sampling.ignore_eos = true;
  const auto alone = run_alone(r);
  std::vector<Request> crowd;
  for (int i = 0; i < 4; ++i) {
    Request o = greedy(random_prompt(10 + 13 * i, 40 + i), 12);
    o.sampling.temperature = 1.0f;  // and unseeded: the engine picks
    crowd.push_back(std::move(o));
  }
  crowd.insert(crowd.begin() + 2, clone(r));
  Engine e(*fixture().model, small_config());
  auto together = run_all(e, crowd);
  EXPECT_EQ(together[2].token_ids, alone.token_ids);
  // A different seed gives different tokens (with overwhelming probability at temperature 1).
  Request other = clone(r);
  other.sampling.seed = 4321;
  EXPECT_NE(run_alone(other).token_ids, alone.token_ids);
}

// Each id becomes one or two letters, so stop strings fall across token boundaries.
class LetterDetokenizer : public Detokenizer {
 public:
  static std::string text(int32_t id) {
    std::string s(1, static_cast<char>('a' + id % 26));
    if (id % 3) s.push_back(static_cast<char>('A' + id % 26));
    return s;
  }
  std::string step(int32_t id) override { return text(id); }
  std::string finish() override { return ""; }
};

TEST(Engine, StopStringsAcrossTokenBoundaries) {
  Engine e(*fixture().model, small_config());
  Request base = greedy(random_prompt(12, 77), 12);
  base.detokenizer = std::make_unique<LetterDetokenizer>();
  RequestStream s0 = e.submit(std::move(base));
  const OutputChunk full = drain(s0);
  ASSERT_EQ(full.token_ids.size(), 12u);
  std::string text;
  for (int32_t t : full.token_ids) text += LetterDetokenizer::text(t);
  EXPECT_EQ(full.text, text);

  // A stop string made of the last letter of token 4 and the first of token 5.
  std::string before;
  for (int i = 0; i < 4; ++i) before += LetterDetokenizer::text(full.token_ids[static_cast<size_t>(i)]);
  const std::string stop = before.substr(before.size() - 1) + LetterDetokenizer::text(full.token_ids[4]).substr(0, 1);
  ASSERT_EQ(text.find(stop), before.size() - 1) << "pick a prompt whose output does not contain the stop earlier";
  Request r = greedy(random_prompt(12, 77), 12);
  r.detokenizer = std::make_unique<LetterDetokenizer>();
  r.sampling.stop = {"never-there", stop};
  RequestStream s1 = e.submit(std::move(r));
  const OutputChunk cut = drain(s1);
  EXPECT_EQ(cut.finish, FinishReason::Stop);
  EXPECT_EQ(cut.stop_string, stop);
  EXPECT_EQ(cut.text, before.substr(0, before.size() - 1));  // the stop string is not output
  EXPECT_EQ(cut.token_ids, std::vector<int32_t>(full.token_ids.begin(), full.token_ids.begin() + 5));
}

TEST(Engine, StopTokenIdsMaxTokensAndLimits) {
  Engine e(*fixture().model, small_config());
  const auto full = run_all(e, one(greedy(random_prompt(12, 3), 10)))[0];
  Request r = greedy(random_prompt(12, 3), 10);
  r.sampling.stop_token_ids = {full.token_ids[3]};
  const auto stopped = run_all(e, one(r))[0];
  const auto first = std::find(full.token_ids.begin(), full.token_ids.end(), full.token_ids[3]);
  EXPECT_EQ(stopped.token_ids, std::vector<int32_t>(full.token_ids.begin(), first + 1));
  EXPECT_EQ(stopped.finish, FinishReason::Stop);
  EXPECT_EQ(stopped.stop_token, full.token_ids[3]);

  const auto none = run_all(e, one(greedy(random_prompt(5, 3), 0)))[0];
  EXPECT_TRUE(none.token_ids.empty());
  EXPECT_EQ(none.finish, FinishReason::Length);

  // Bad requests are refused at submit, naming the problem.
  EXPECT_THROW(e.submit(greedy({}, 3)), Error);
  EXPECT_THROW(e.submit(greedy({1, 2, static_cast<int32_t>(fixture().vocab())}, 3)), Error);
  Request needs_text = greedy({5, 6}, 3);
  needs_text.sampling.stop = {"x"};
  EXPECT_THROW(e.submit(std::move(needs_text)), Error);
  EXPECT_THROW(e.submit(greedy({5, 6}, e.max_model_len())), Error);
  Request unlimited = greedy({5, 6}, -1);
  unlimited.sampling.ignore_eos = false;
  EXPECT_NO_THROW(e.submit(std::move(unlimited)).cancel());
}

// Prompt logprobs (echo + logprobs) equal the model's own log-softmax over one full forward of the
// prompt, whether the prompt is split into several prefill chunks, preempted midway and
// recomputed, or only scored (max_tokens 0); the prefix cache is never used for them.
TEST(Engine, PromptLogprobsMatchAFullForward) {
  DeepseekV3Model& m = *fixture().model;
  const int64_t V = fixture().vocab();
  const std::vector<int32_t> prompt = random_prompt(24, 55);
  SequenceCache cache = m.new_cache(static_cast<int64_t>(prompt.size()), 4);
  const std::vector<float> logits = m.forward(prompt, cache, /*all_logits=*/true);
  auto check = [&](const OutputChunk& got) {
    ASSERT_EQ(got.prompt_logprobs.size(), prompt.size() - 1);
    ASSERT_EQ(got.prompt_top.size(), prompt.size() - 1);
    for (size_t i = 1; i < prompt.size(); ++i) {
      const std::vector<float> lp = log_softmax_row(logits.data() + static_cast<int64_t>(i - 1) * V, V);
      const float want = lp[static_cast<size_t>(prompt[i])];
      EXPECT_NEAR(got.prompt_logprobs[i - 1], want, 2e-4 * std::max(1.0f, std::fabs(want))) << "token " << i;
      ASSERT_EQ(got.prompt_top[i - 1].size(), 2u);
      const auto best = std::max_element(lp.begin(), lp.end()) - lp.begin();
      EXPECT_EQ(got.prompt_top[i - 1][0].token, best) << "token " << i;
    }
  };
  auto scoring = [&](int64_t max_tokens) {
    Request r = greedy(prompt, max_tokens);
    r.prompt_logprobs = 2;
    return r;
  };

  // Chunks of 4 tokens (6 prefill steps), twice: the second run must not take the cached blocks.
  EngineConfig chunked = small_config(4, 64);
  chunked.scheduler.max_prefill_chunk = 4;
  Engine e(m, chunked);
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run);
    RequestStream s = e.submit(scoring(3));
    const OutputChunk got = drain(s);
    check(got);
    EXPECT_EQ(got.cached_prompt_tokens, 0);
    EXPECT_EQ(got.token_ids.size(), 3u);
  }
  // max_tokens 0: the prompt is scored, nothing is generated.
  RequestStream score = e.submit(scoring(0));
  const OutputChunk scored = drain(score);
  check(scored);
  EXPECT_TRUE(scored.token_ids.empty());
  EXPECT_EQ(scored.finish, FinishReason::Length);
  EXPECT_EQ(scored.output_tokens, 0);

  // A pool too small for both: the older request preempts the scoring one during its prefill;
  // it recomputes later and reports every prompt token exactly once.
  EngineConfig tight = small_config(4, 12);
  tight.scheduler.max_prefill_chunk = 4;
  Engine t(m, tight);
  RequestStream older = t.submit(greedy(random_prompt(30, 56), 14));
  RequestStream s = t.submit(scoring(3));
  check(drain(s));
  drain(older);
  EXPECT_GT(t.stats().preemptions, 0);
}

TEST(Engine, ManyThreadsSubmitAtOnce) {
  Engine e(*fixture().model, small_config(8, 64));
  std::vector<std::thread> threads;
  std::vector<OutputChunk> out(6);
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&, t] {
      RequestStream s = e.submit(greedy(random_prompt(9 + 5 * t, 900 + t), 8));
      out[static_cast<size_t>(t)] = drain(s);
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 6; ++t) {
    SCOPED_TRACE(t);
    expect_same(out[static_cast<size_t>(t)], run_alone(greedy(random_prompt(9 + 5 * t, 900 + t), 8)), 1e-4);
  }
  const EngineStats s = e.stats();
  EXPECT_EQ(s.requests_finished, 6);
  EXPECT_EQ(s.generated_tokens, 48);
}

TEST(BenchModel, PrintsATableAndWritesJson) {
  const std::string json = std::filesystem::temp_directory_path() / "kiln_bench_model_test.json";
  auto r = run_kiln("bench model --model " + data_path("fixtures/h12_qlora_grouped_yarn") +
                    " --batch-sizes 1,3 --prompt-len 8 --decode-steps 4 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("prefill tok/s"), std::string::npos) << r.out;
  auto j = read_json(json);
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][1]["batch_size"], 3);
  EXPECT_EQ(j["results"][1]["decode_steps"], 3);
  EXPECT_EQ(j["results"][1]["prefill_tokens"], 24);
  auto rnd = run_kiln("bench model --config " + data_path("fixtures/h5_noqlora_dense2_odd/config.json") +
                      " --random-weights --batch-sizes 2 --prompt-len 4 --decode-steps 3");
  ASSERT_EQ(rnd.exit_code, 0) << rnd.out;
  auto bad = run_kiln("bench model --config " + data_path("fixtures/h5_noqlora_dense2_odd/config.json"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("--random-weights"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace kiln::test
