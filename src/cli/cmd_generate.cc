// `kiln generate --model DIR --prompt-ids 1,2,3 [--max-tokens N] [--temperature T] ...`:
// prompt, then token-by-token decode.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "cli/command.h"
#include "cli/common.h"
#include "core/error.h"
#include "engine/sampler.h"

namespace kiln::cli {
namespace {

struct GenerateArgs {
  std::string model, device = "cpu", prompt, prompt_ids;
  int64_t max_tokens = 32;
  SamplingParams sampling;
  bool ignore_eos = false, json = false;
};

int run_generate(const GenerateArgs& a) {
  KILN_CHECK(a.prompt.empty() != a.prompt_ids.empty(), "generate needs exactly one of --prompt or --prompt-ids");
  KILN_CHECK(a.prompt.empty(), "--prompt: text prompts need the tokenizer, which this build lacks; use --prompt-ids");
  KILN_CHECK(a.max_tokens >= 0, "--max-tokens must be >= 0, got {}", a.max_tokens);
  KILN_CHECK(a.sampling.temperature >= 0, "--temperature must be >= 0");
  KILN_CHECK(a.sampling.top_p > 0 && a.sampling.top_p <= 1, "--top-p must be in (0, 1]");
  KILN_CHECK(a.sampling.top_k >= 0, "--top-k must be >= 0");
  std::vector<int32_t> prompt = parse_ids(a.prompt_ids, "--prompt-ids");
  LoadedModel m = load_model(a.model, a.device);
  const ModelConfig& c = m.model->config();
  const int64_t V = c.vocab_size;
  const int64_t capacity = static_cast<int64_t>(prompt.size()) + a.max_tokens;
  KILN_CHECK(capacity <= c.max_position_embeddings, "prompt ({}) + max tokens ({}) exceed the model's {} positions",
             prompt.size(), a.max_tokens, c.max_position_embeddings);
  SequenceCache cache = m.model->new_cache(capacity);
  Sampler sampler(a.sampling);
  std::vector<int32_t> out;
  std::vector<float> lps;
  std::string finish = "length";
  std::vector<float> logits = m.model->forward(prompt, cache, false);
  for (int64_t step = 0; step < a.max_tokens; ++step) {
    const int32_t tok = sampler.sample(logits.data(), V);
    out.push_back(tok);
    lps.push_back(log_softmax_row(logits.data(), V)[static_cast<size_t>(tok)]);
    const bool eos = std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), tok) != c.eos_token_ids.end();
    if (eos && !a.ignore_eos) {
      finish = "stop";
      break;
    }
    if (step + 1 < a.max_tokens) logits = m.model->forward({tok}, cache, false);
  }
  if (a.json) {
    nlohmann::json j = {
        {"prompt_ids", prompt}, {"output_ids", out}, {"logprobs", lps}, {"text", ""}, {"finish_reason", finish}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
    std::printf("\n");
  }
  return 0;
}

KILN_COMMAND("generate", "Generate a continuation of a prompt", [](CLI::App& sub) {
  auto a = std::make_shared<GenerateArgs>();
  sub.add_option("--model", a->model, "checkpoint directory")->required();
  sub.add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  sub.add_option("--prompt", a->prompt, "prompt text");
  sub.add_option("--prompt-ids", a->prompt_ids, "prompt as comma-separated token ids");
  sub.add_option("--max-tokens", a->max_tokens, "tokens to generate")->capture_default_str();
  sub.add_option("--temperature", a->sampling.temperature, "0 for greedy")->capture_default_str();
  sub.add_option("--top-k", a->sampling.top_k, "keep the k most likely tokens (0: off)");
  sub.add_option("--top-p", a->sampling.top_p, "keep the smallest set with this mass (1: off)");
  sub.add_option("--seed", a->sampling.seed, "sampling seed");
  sub.add_flag("--ignore-eos", a->ignore_eos, "do not stop at the end-of-sequence token");
  sub.add_flag("--json", a->json, "print JSON");
  return [a] { return run_generate(*a); };
});

}  // namespace
}  // namespace kiln::cli
