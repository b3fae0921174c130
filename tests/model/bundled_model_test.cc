// The bundled models under models/ (made by tools/train_small_models.py, see models/README.md):
// Kiln's held-out perplexity must match PyTorch's (stored in each model's heldout.json) within 0.5%,
// and Kiln's greedy continuation must match the target's greedy tokens recorded by the training run.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "test_util.h"

namespace kiln::test {
namespace {

using json = nlohmann::json;

std::string model_dir(const std::string& name) {
  return std::string(KILN_TEST_DATA) + "/../../models/" + name;
}

class BundledModel : public ::testing::TestWithParam<std::string> {};

// heldout.json's rule: non-overlapping windows of `window` ids, each scored alone from position 0,
// every id but a window's first predicted, NLL averaged over all predicted ids. All 16 windows
// (8176 predicted ids) of both models take about 25 s of CPU time (Release build).
TEST_P(BundledModel, HeldoutPerplexityMatchesPyTorch) {
  const std::string dir = model_dir(GetParam());
  ASSERT_TRUE(std::filesystem::exists(dir + "/heldout.json")) << dir;
  json h = read_json(dir + "/heldout.json");
  const auto ids = h["ids"].get<std::vector<int>>();
  const size_t window = h["window"].get<size_t>();
  const size_t windows = h["num_windows"].get<size_t>();
  ASSERT_EQ(ids.size(), window * windows);
  double nll = 0;
  size_t scored = 0;
  for (size_t w = 0; w < windows; ++w) {
    std::vector<int> win(ids.begin() + static_cast<std::ptrdiff_t>(w * window),
                         ids.begin() + static_cast<std::ptrdiff_t>((w + 1) * window));
    auto r = run_kiln("score --model " + dir + " --ids " + join_ids(win) + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    json s = json::parse(r.out.substr(r.out.find('{')));
    ASSERT_EQ(s["logprobs"].size(), window);
    EXPECT_TRUE(s["logprobs"][0].is_null());
    for (size_t i = 1; i < window; ++i) nll -= s["logprobs"][i].get<double>();
    scored += window - 1;
  }
  const double kiln_nll = nll / static_cast<double>(scored);
  const double kiln_ppl = std::exp(kiln_nll);
  const double torch_ppl = h["pytorch_ppl"].get<double>();
  RecordProperty("kiln_nll_per_token", std::to_string(kiln_nll));
  RecordProperty("kiln_ppl", std::to_string(kiln_ppl));
  RecordProperty("pytorch_ppl", std::to_string(torch_ppl));
  EXPECT_NEAR(kiln_ppl / torch_ppl, 1.0, 0.005)
      << GetParam() << ": kiln ppl " << kiln_ppl << " vs PyTorch " << torch_ppl;
  EXPECT_NEAR(kiln_nll, h["pytorch_nll_per_token"].get<double>(), 0.005 * h["pytorch_nll_per_token"].get<double>());
}

std::string param_name(const ::testing::TestParamInfo<std::string>& p) {
  std::string n = p.param;
  for (auto& c : n)
    if (c == '-') c = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Models, BundledModel, ::testing::Values("kiln-tiny", "kiln-tiny-draft"), param_name);

// The target's greedy continuation of the first acceptance prompt (PyTorch, float32), 32 tokens.
TEST(BundledModelGreedy, TargetMatchesPyTorch) {
  const std::string dir = model_dir("kiln-tiny");
  json a = read_json(dir + "/heldout.json")["acceptance"];
  const auto prompt = a["prompt_ids"][0].get<std::vector<int>>();
  auto want = a["target_greedy_ids"][0].get<std::vector<int>>();
  want.resize(32);
  auto r = run_kiln("generate --model " + dir + " --prompt-ids " + join_ids(prompt) +
                    " --max-tokens 32 --temperature 0 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto got = json::parse(r.out.substr(r.out.find('{')))["output_ids"].get<std::vector<int>>();
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace kiln::test
