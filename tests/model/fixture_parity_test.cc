// Parity with Hugging Face transformers (tests/data/fixtures, made by tools/make_fixtures.py) and
// agreement of the two MLA forms.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "engine/sampler.h"
#include "model/deepseek_v3.h"
#include "model_test_util.h"
#include "test_util.h"

namespace kiln::test {
namespace {

using json = nlohmann::json;

class Fixture : public ::testing::TestWithParam<std::string> {};

// A token whose reference routing is a near tie (expected.json's optional "route_margins": per
// token, the smallest gap over MoE layers between the top_k-th and the next expert's choice score,
// group-masked, as tools/make_fixtures.py writes it). The CUDA prefill's bf16 flash attention moves
// router inputs by ~1e-3, enough to swap such a pair, and one swapped expert moves that token's
// logprob by up to a few nats: like greedy's near-tie margins, either routing is right.
constexpr double kRouteTie = 5e-3;
bool route_near_tie(const json& e, size_t token) {
  return e.contains("route_margins") && e["route_margins"][token].get<double>() < kRouteTie;
}

TEST_P(Fixture, ScoreMatchesTransformers) {
  json e = read_json(GetParam() + "/expected.json");
  auto ids = e["ids"].get<std::vector<int>>();
  auto r = run_kiln("score --model " + GetParam() + " --ids " + join_ids(ids) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  json s = json::parse(r.out);
  ASSERT_EQ(s["logprobs"].size(), ids.size());
  EXPECT_TRUE(s["logprobs"][0].is_null());
  double worst = 0;
  for (size_t i = 1; i < ids.size(); ++i)
    worst = std::max(worst, std::fabs(s["logprobs"][i].get<double>() - e["logprobs"][i].get<double>()));
  EXPECT_LE(worst, 1e-3) << GetParam();
}

TEST_P(Fixture, GreedyMatchesTransformers) {
  json g = read_json(GetParam() + "/expected.json")["greedy"];
  auto prompt = g["prompt_ids"].get<std::vector<int>>();
  auto want = g["output_ids"].get<std::vector<int>>();
  auto margins = g["top2_margins"].get<std::vector<double>>();
  auto r = run_kiln("generate --model " + GetParam() + " --prompt-ids " + join_ids(prompt) + " --max-tokens " +
                    std::to_string(want.size()) + " --temperature 0 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto got = json::parse(r.out)["output_ids"].get<std::vector<int>>();
  ASSERT_EQ(got.size(), want.size());
  size_t compared = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (margins[i] < 1e-2) break;  // a near tie: either choice is right, later steps diverge legitimately
    EXPECT_EQ(got[i], want[i]) << "step " << i;
    ++compared;
  }
  EXPECT_GT(compared, 0u);
}

// The CUDA backend (bf16 weights, f32 activations) on the same fixtures: mean |Δ logprob| <= 0.02
// over the tokens whose reference routing is no near tie (route_near_tie) and greedy continuations
// identical wherever the reference top-2 margin exceeds 0.1.
TEST_P(Fixture, CudaScoreAndGreedyMatchTransformers) {
  if (!ops::cuda_available()) GTEST_SKIP() << "no CUDA GPU (or a build without CUDA)";
  json e = read_json(GetParam() + "/expected.json");
  auto ids = e["ids"].get<std::vector<int>>();
  // The model's numerics with the reference's f32 cache must meet the 0.02 bound. The default
  // bf16 latent cache adds its own rounding (these tiny random-weight models amplify it: ~0.01-0.06
  // measured on an H200), bounded looser and recorded. bf16-rounded GEMM activations
  // (--activation-dtype bf16, the speed option) are recorded too; their bound only says the
  // option computes the same model (a wrong GEMM moves logprobs by whole nats). So are bf16
  // experts under f32 activations (--expert-activation-dtype bf16): 0.0025-0.025 measured (H200),
  // bounded well below what rounding everything costs (0.35 on h5), so the option must keep the
  // rest split.
  struct Run {
    std::string kv, act, experts;
    double bound;
  };
  for (const Run& run : {Run{"f32", "f32", "auto", 0.02}, Run{"auto", "f32", "auto", 0.1},
                         Run{"f32", "bf16", "auto", 0.5}, Run{"f32", "f32", "bf16", 0.05}}) {
    const std::string kv =
        run.kv + (run.act == "f32" ? "" : "_act_" + run.act) + (run.experts == "auto" ? "" : "_experts_" + run.experts);
    auto r = run_kiln("score --device cuda --kv-cache-dtype " + run.kv + " --activation-dtype " + run.act +
                      " --expert-activation-dtype " + run.experts + " --model " + GetParam() + " --ids " +
                      join_ids(ids) + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    json s = json::parse(r.out.substr(r.out.find('{')));
    double sum = 0;
    size_t counted = 0;
    for (size_t i = 1; i < ids.size(); ++i) {
      if (route_near_tie(e, i - 1)) continue;  // logprob i is token i - 1's output
      sum += std::fabs(s["logprobs"][i].get<double>() - e["logprobs"][i].get<double>());
      ++counted;
    }
    ASSERT_GE(counted * 10, (ids.size() - 1) * 9) << GetParam() << ": too many near-tied routings to compare";
    const double mean = sum / static_cast<double>(counted);
    RecordProperty("mean_abs_dlogprob_kv_" + kv, std::to_string(mean));
    std::printf("%s: mean |dlogprob| %.5f (KV cache %s, GEMM activations %s, experts %s)\n", GetParam().c_str(), mean,
                run.kv.c_str(), run.act.c_str(), run.experts.c_str());
    EXPECT_LE(mean, run.bound) << GetParam() << " kv " << kv;
  }
  json g = e["greedy"];
  auto prompt = g["prompt_ids"].get<std::vector<int>>();
  auto want = g["output_ids"].get<std::vector<int>>();
  auto margins = g["top2_margins"].get<std::vector<double>>();
  auto gr = run_kiln("generate --device cuda --activation-dtype f32 --model " + GetParam() + " --prompt-ids " +
                     join_ids(prompt) + " --max-tokens " + std::to_string(want.size()) +
                     " --temperature 0 --ignore-eos --json");
  ASSERT_EQ(gr.exit_code, 0) << gr.out;
  auto got = json::parse(gr.out.substr(gr.out.find('{')))["output_ids"].get<std::vector<int>>();
  for (size_t i = 0; i < want.size() && margins[i] > 0.1; ++i) EXPECT_EQ(got[i], want[i]) << "step " << i;
}

// The fixture data the CUDA score test relies on (no GPU needed): a routing margin per token where
// given, and near ties few enough that the comparison keeps nine tokens in ten.
TEST_P(Fixture, RouteMarginsCoverTheTokens) {
  json e = read_json(GetParam() + "/expected.json");
  if (!e.contains("route_margins")) GTEST_SKIP() << "written before make_fixtures.py recorded routing margins";
  const size_t n = e["ids"].size();
  ASSERT_EQ(e["route_margins"].size(), n);
  size_t ties = 0;
  for (size_t t = 0; t + 1 < n; ++t) ties += route_near_tie(e, t);
  EXPECT_LE(ties * 10, n - 1) << GetParam();
}

// The CUDA decode path against transformers: the fixture's ids one token a call (a one-token
// prefill, then absorbed decode steps over the growing cache), each call's log P(next id) against
// the reference's teacher-forced logprobs. The score above is one prefill, and the greedy
// comparison stops at the first small margin (h12_mla512_moonlight_widths: after one token), so
// without this no decode step at a fixture's widths would meet the reference; at Moonlight's widths
// the bf16 cache's steps run the mma.sync decode kernel. Bounds as for the score: 0.02 with the f32
// cache, 0.1 with the default bf16 one.
TEST_P(Fixture, CudaDecodeStepsMatchTransformers) {
  if (!ops::cuda_available()) GTEST_SKIP() << "no CUDA GPU (or a build without CUDA)";
  json e = read_json(GetParam() + "/expected.json");
  auto ids = e["ids"].get<std::vector<int32_t>>();
  const int64_t n = static_cast<int64_t>(ids.size());
  auto be = ops::make_cuda_backend();
  auto model = DeepseekV3Model::load(GetParam(), *be);
  const int64_t V = model->config().vocab_size;
  for (const auto& [kv, bound] : {std::pair{DType::F32, 0.02}, std::pair{DType::BF16, 0.1}}) {
    model->set_kv_dtype(kv);
    SequenceCache cache = model->new_cache(n);
    double sum = 0;
    for (int64_t i = 0; i + 1 < n; ++i) {
      const std::vector<float> row = model->forward({ids[static_cast<size_t>(i)]}, cache, false);
      ASSERT_EQ(row.size(), static_cast<size_t>(V));
      const std::vector<float> lp = log_softmax_row(row.data(), V);  // as `kiln score` does
      sum += std::fabs(lp[static_cast<size_t>(ids[static_cast<size_t>(i + 1)])] -
                       e["logprobs"][static_cast<size_t>(i + 1)].get<double>());
    }
    const double mean = sum / static_cast<double>(n - 1);
    std::printf("%s: decode steps, mean |dlogprob| %.5f (KV cache %s)\n", GetParam().c_str(), mean, dtype_name(kv));
    EXPECT_LE(mean, bound) << GetParam() << " kv " << dtype_name(kv);
  }
}

TEST_P(Fixture, AbsorbedAndExpandedFormsAgree) {
  auto be = ops::make_cpu_backend();
  auto model = DeepseekV3Model::load(GetParam(), *be);
  auto ids = read_json(GetParam() + "/expected.json")["ids"].get<std::vector<int32_t>>();
  const int64_t n = static_cast<int64_t>(ids.size());
  SequenceCache ce = model->new_cache(n), ca = model->new_cache(n), cd = model->new_cache(n);
  auto expanded = model->forward(ids, ce, true, MlaForm::Expanded);
  auto absorbed = model->forward(ids, ca, true, MlaForm::Absorbed);
  EXPECT_LE(rel_diff(expanded, absorbed), 1e-4);
  // Token-by-token decode (absorbed, over the growing cache) gives the same rows as one prefill.
  const int64_t V = model->config().vocab_size;
  std::vector<float> stepwise;
  for (int32_t id : ids) {
    auto row = model->forward({id}, cd, false);
    stepwise.insert(stepwise.end(), row.begin(), row.end());
  }
  ASSERT_EQ(stepwise.size(), static_cast<size_t>(n * V));
  EXPECT_LE(rel_diff(expanded, stepwise), 1e-4);
  // A prefix, then the rest as one chunk over the cached prefix (expanded form with history).
  SequenceCache cc = model->new_cache(n);
  std::vector<int32_t> head(ids.begin(), ids.begin() + n / 2), tail(ids.begin() + n / 2, ids.end());
  auto first = model->forward(head, cc, true);
  auto second = model->forward(tail, cc, true);
  first.insert(first.end(), second.begin(), second.end());
  EXPECT_LE(rel_diff(expanded, first), 1e-4);
}

// Two sequences in one batch, with scattered blocks, give the rows each gives alone; then a mixed
// step (one decode token + one prefill chunk) does too.
TEST_P(Fixture, BatchedSequencesMatchAlone) {
  auto be = ops::make_cpu_backend();
  auto model = DeepseekV3Model::load(GetParam(), *be);
  auto ids = read_json(GetParam() + "/expected.json")["ids"].get<std::vector<int32_t>>();
  const int64_t V = model->config().vocab_size, bs = 4;
  std::vector<int32_t> a(ids.begin(), ids.begin() + 13), b(ids.begin() + 5, ids.end());
  SequenceCache ca = model->new_cache(64, bs), cb = model->new_cache(64, bs);
  auto la = model->forward(a, ca, true), lb = model->forward(b, cb, true);
  LatentKvPool pool = model->new_pool(32, bs);
  // Sequence 0 takes blocks 31, 29, 27, ...; sequence 1 takes 0, 2, 4, ...
  ForwardBatch fb;
  fb.max_blocks = 16;
  fb.block_tables.resize(32);
  for (int i = 0; i < 16; ++i) {
    fb.block_tables[static_cast<size_t>(i)] = 31 - 2 * i;
    fb.block_tables[static_cast<size_t>(16 + i)] = 2 * i;
  }
  auto add_seq = [&](const std::vector<int32_t>& toks, int seq, int start) {
    for (size_t i = 0; i < toks.size(); ++i) {
      const int pos = start + static_cast<int>(i);
      fb.logit_rows.push_back(static_cast<int32_t>(fb.tokens.size()));
      fb.tokens.push_back(toks[i]);
      fb.positions.push_back(pos);
      fb.slot_mapping.push_back(fb.block_tables[static_cast<size_t>(seq * 16 + pos / bs)] * bs + pos % bs);
    }
    fb.cu_q.push_back(static_cast<int32_t>(fb.tokens.size()));
    fb.kv_lens.push_back(start + static_cast<int32_t>(toks.size()));
  };
  fb.cu_q = {0};
  add_seq(std::vector<int32_t>(a.begin(), a.end() - 1), 0, 0);
  add_seq(std::vector<int32_t>(b.begin(), b.end() - 3), 1, 0);
  auto step1 = model->forward(fb, pool);
  // Step 2: the last token of a (decode) and the last three of b (a chunk over its cached prefix).
  fb.tokens.clear();
  fb.positions.clear();
  fb.slot_mapping.clear();
  fb.logit_rows.clear();
  fb.kv_lens.clear();
  fb.cu_q = {0};
  add_seq({a.back()}, 0, static_cast<int>(a.size()) - 1);
  add_seq(std::vector<int32_t>(b.end() - 3, b.end()), 1, static_cast<int>(b.size()) - 3);
  auto step2 = model->forward(fb, pool);
  std::vector<float> got_a(step1.begin(), step1.begin() + (a.size() - 1) * V);
  got_a.insert(got_a.end(), step2.begin(), step2.begin() + V);
  std::vector<float> got_b(step1.begin() + (a.size() - 1) * V, step1.end());
  got_b.insert(got_b.end(), step2.begin() + V, step2.end());
  EXPECT_LE(rel_diff(la, got_a), 1e-4);
  EXPECT_LE(rel_diff(lb, got_b), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Fixture, ::testing::ValuesIn(fixture_dirs()),
                         [](const auto& p) { return std::filesystem::path(p.param).filename().string(); });

}  // namespace
}  // namespace kiln::test
