// The speculation policy inside the engine (engine/spec_policy.h) on the bundled models: whatever
// it decides, greedy output is the plain engine's; with a step-time table that makes verifying
// cheap it speculates, and with a drafter whose proposals are always wrong it measures that
// speculation does not pay and decodes plainly on the overlapped loop, probing now and then.
#include <unistd.h>

#include <filesystem>

#include "engine_spec_util.h"

namespace kiln::spec {
namespace {

std::vector<Request> requests(int64_t max_tokens) {
  std::vector<Request> reqs;
  for (const auto& p : models().prompts) reqs.push_back(request(p, max_tokens));
  return reqs;
}

EngineConfig adaptive(int64_t k, std::shared_ptr<Speculator> speculator = nullptr) {
  EngineConfig c = config(speculator ? 0 : k);
  if (speculator) c.speculator = std::move(speculator);
  c.spec_policy.mode = SpecPolicyMode::Adaptive;
  return c;
}

// A step-time table for 1-8 rows: a plain step 1 ms, a verify step (1 + serial + per_draft * K) ms,
// a draft forward `draft` ms. The tests freeze it (no online measurement): this shared CPU's own
// step times are too noisy to decide on, and the decisions should follow acceptance alone.
std::string table(const std::string& name, double serial, double per_draft, double draft) {
  const auto path = (std::filesystem::temp_directory_path() /
                     ("kiln_engine_spec_policy_" + name + "_" + std::to_string(::getpid()) + ".json"))
                        .string();
  nlohmann::json j = {
      {"plain", nlohmann::json::array()}, {"verify", nlohmann::json::array()}, {"draft", nlohmann::json::array()}};
  for (int64_t rows = 1; rows <= 8; ++rows) {
    j["plain"].push_back({{"rows", rows}, {"seconds", 1e-3}});
    j["draft"].push_back({{"rows", rows}, {"seconds", 1e-3 * draft}});
    for (int64_t d = 1; d <= 4; ++d)
      j["verify"].push_back({{"rows", rows},
                             {"drafts_per_row", d},
                             {"seconds", 1e-3 * (1 + serial + per_draft * static_cast<double>(d))}});
  }
  std::ofstream(path) << j.dump();
  return path;
}

TEST(EngineSpecPolicy, AdaptiveGivesThePlainEnginesGreedyOutput) {
  const std::vector<Request> reqs = requests(24);
  Engine plain(*models().target, config(0));
  const auto want = run_all(plain, reqs);
  {  // measured online on this CPU: whatever it decides
    Engine spec(*models().target, adaptive(4));
    EXPECT_EQ(run_all(spec, reqs), want);
    const SpecPolicyStats p = spec.stats().spec.policy;
    EXPECT_GT(p.speculate_steps + p.plain_steps, 0);
  }
  {  // a table that says verifying is cheap, frozen: it speculates, with the drafter's good drafts
    EngineConfig c = adaptive(4);
    c.spec_policy.table_path = table("cheap", 0, 0.05, 0.01);
    c.spec_policy.measure = false;
    Engine spec(*models().target, std::move(c));
    EXPECT_EQ(run_all(spec, reqs), want);
    const EngineStats s = spec.stats();
    EXPECT_GT(s.spec.verifies, 0);
    EXPECT_GT(s.spec.accepted_tokens, 0);
    EXPECT_GT(s.spec.policy.speculate_steps, s.spec.policy.plain_steps);
    EXPECT_LT(s.decode_steps, plain.stats().decode_steps);
  }
}

TEST(EngineSpecPolicy, SwitchingEveryFewStepsUnderPreemptionLosesNothing) {
  // Probes every 2-4 steps: the loop keeps moving between the overlapped and the serial loop
  // (and the drafter catching up) while a tiny pool preempts, and the prefix cache serves blocks.
  const std::vector<Request> reqs = requests(30);
  Engine plain(*models().target, config(0));
  const auto want = run_all(plain, reqs);
  EngineConfig c = config(4, 4, 24);
  c.spec_policy.mode = SpecPolicyMode::Adaptive;
  c.spec_policy.probe_interval = 2;
  c.spec_policy.max_probe_interval = 4;
  Engine spec(*models().target, std::move(c));
  EXPECT_EQ(run_all(spec, reqs), want);
  EXPECT_EQ(run_all(spec, reqs), want);  // again, from the prefix cache
  const EngineStats s = spec.stats();
  EXPECT_GT(s.preemptions, 0);
  EXPECT_GT(s.spec.policy.speculate_steps, 0);
  EXPECT_GT(s.spec.policy.plain_steps, 0);
  EXPECT_GT(s.overlapped_steps, 0);
}

// Proposes the same token everywhere: kiln-tiny's greedy choice is almost never it.
class WrongDrafter : public Drafter {
 public:
  explicit WrongDrafter(int64_t vocab) : vocab_(vocab) {}
  int64_t vocab_size() const override { return vocab_; }
  void propose(std::span<const DraftInput> seqs, int64_t k, DraftOutput& out) override {
    out.num_seqs = static_cast<int64_t>(seqs.size()), out.k = k, out.vocab = vocab_;
    out.tokens.assign(seqs.size() * static_cast<size_t>(k), static_cast<int32_t>(vocab_ - 1));
    out.probs.assign(seqs.size() * static_cast<size_t>(k * vocab_), 0.0f);
    for (size_t i = 0; i < out.tokens.size(); ++i) out.probs[i * static_cast<size_t>(vocab_) + vocab_ - 1] = 1.0f;
  }
  void rollback(int64_t, int64_t) override {}
  void release(int64_t) override {}

 private:
  int64_t vocab_;
};

TEST(EngineSpecPolicy, AlwaysWrongDraftsTurnSpeculationOff) {
  const int64_t V = models().target->config().vocab_size;
  // Prompts of one length: the batch stays at 5 rows from the first decode step to the last.
  std::vector<Request> reqs = requests(48);
  for (Request& r : reqs) r.prompt.resize(5);
  Engine plain(*models().target, config(0));
  const auto want = run_all(plain, reqs);
  // A verify step costs 10% over a plain one plus 10% per draft, a draft forward 10%: with the
  // prior's acceptance (0.6) K = 2 pays, with none nothing does.
  EngineConfig c = adaptive(0, std::make_shared<DrafterSpeculator>(std::make_unique<WrongDrafter>(V), 4, V, "wrong"));
  c.spec_policy.table_path = table("realistic", 0.1, 0.1, 0.1);
  c.spec_policy.measure = false;
  c.spec_policy.probe_interval = c.spec_policy.max_probe_interval = 1000;  // no re-probe within the test
  Engine spec(*models().target, std::move(c));
  EXPECT_EQ(run_all(spec, reqs), want);
  const EngineStats s = spec.stats();
  const SpecPolicyStats& p = s.spec.policy;
  EXPECT_LT(s.spec.acceptance_rate(), 0.1);
  EXPECT_FALSE(p.speculating);
  EXPECT_EQ(p.drafts_per_row, 0);
  // Speculating only until the first verifications showed the drafts are wrong (K falling from
  // 2 to 1 to 0), then plain on the overlapped loop.
  EXPECT_GT(p.speculate_steps, 0);
  EXPECT_LE(p.speculate_steps, 4) << spec_summary(s.spec);
  EXPECT_GE(p.plain_steps, 40);
  EXPECT_EQ(p.switches, 1);
  EXPECT_GT(s.overlapped_steps, s.decode_steps / 2);
  EXPECT_LE(s.spec.draft_tokens, 2 * s.spec.verifies);
  // The same table with the real draft model, whose drafts are often right (re-probing every 8
  // steps, as its acceptance varies over the text): it speculates most of the time.
  EngineConfig good = adaptive(4);
  good.spec_policy.table_path = table("realistic", 0.1, 0.1, 0.1);
  good.spec_policy.measure = false;
  good.spec_policy.probe_interval = good.spec_policy.max_probe_interval = 8;
  Engine draft(*models().target, std::move(good));
  reqs = requests(48);
  EXPECT_EQ(run_all(draft, reqs), run_all(plain, reqs));
  EXPECT_GT(draft.stats().spec.policy.speculate_steps, draft.stats().spec.policy.plain_steps)
      << spec_summary(draft.stats().spec);
}

TEST(EngineSpecPolicy, FixedVerifiesTheFullKAsBefore) {
  const std::vector<Request> reqs = requests(16);
  Engine plain(*models().target, config(0));
  Engine spec(*models().target, config(3));  // the library default: fixed
  EXPECT_EQ(run_all(spec, reqs), run_all(plain, reqs));
  const EngineStats s = spec.stats();
  EXPECT_EQ(s.spec.policy.plain_steps, 0);
  EXPECT_GT(s.spec.policy.speculate_steps, 0);
  EXPECT_GT(static_cast<double>(s.spec.draft_tokens), 2.0 * static_cast<double>(s.spec.verifies));
}

}  // namespace
}  // namespace kiln::spec
