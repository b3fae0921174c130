// `kiln score --model DIR --ids 1,2,3 --json`: teacher-forced log P(ids[i] | ids[:i]).
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <cmath>
#include <cstdio>

#include "cli/command.h"
#include "cli/common.h"
#include "engine/sampler.h"

namespace kiln::cli {
namespace {

struct ScoreArgs {
  std::string model, device = "cpu", ids;
  Precision precision;
  Parallel parallel;
  bool json = false;
};

int run_score(const ScoreArgs& a) {
  std::vector<int32_t> ids = parse_ids(a.ids, "--ids");
  LoadedModel m = load_model(a.model, a.device, a.precision, "auto", a.parallel);
  const int64_t V = m.model->config().vocab_size, T = static_cast<int64_t>(ids.size());
  SequenceCache cache = m.model->new_cache(T);
  std::vector<float> logits = m.model->forward(ids, cache, /*all_logits=*/true);
  nlohmann::json lps = nlohmann::json::array({nullptr});
  double total = 0;
  for (int64_t i = 1; i < T; ++i) {
    std::vector<float> lp = log_softmax_row(logits.data() + (i - 1) * V, V);
    const float v = lp[static_cast<size_t>(ids[static_cast<size_t>(i)])];
    lps.push_back(v);
    total += v;
  }
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"ids", ids}, {"logprobs", lps}}.dump().c_str());
  } else {
    for (int64_t i = 0; i < T; ++i)
      std::printf("%6d  %s\n", ids[static_cast<size_t>(i)],
                  i ? fmt::format("{:.6f}", lps[static_cast<size_t>(i)].get<float>()).c_str() : "-");
    if (T > 1)
      std::printf("mean logprob %.6f, perplexity %.4f\n", total / static_cast<double>(T - 1),
                  std::exp(-total / static_cast<double>(T - 1)));
  }
  return 0;
}

KILN_COMMAND("score", "Teacher-forced log-probabilities of a token sequence", [](CLI::App& sub) {
  auto a = std::make_shared<ScoreArgs>();
  sub.add_option("--model", a->model, "checkpoint directory")->required();
  sub.add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  add_precision_options(sub, a->precision);
  add_parallel_options(sub, a->parallel);
  sub.add_option("--ids", a->ids, "comma-separated token ids")->required();
  sub.add_flag("--json", a->json, "print JSON");
  return [a] { return run_score(*a); };
});

}  // namespace
}  // namespace kiln::cli
