// `kiln generate --model DIR --prompt-ids 1,2,3 [--max-tokens N] [--temperature T] ...`: one
// request through the engine (the same loop the server runs), printed when it finishes.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/speculative.h"
#include "core/error.h"
#include "engine/engine.h"
#include "kv/block_allocator.h"
#include "kv/kv_sizing.h"
#include "tokenizer/tokenizer.h"

namespace kiln::cli {
namespace {

struct GenerateArgs {
  std::string model, device = "cpu", prompt, prompt_ids, stop_token_ids, kv_cache_memory;
  Precision precision;
  Parallel parallel;
  int64_t max_tokens = 32, block_size = 64;
  uint64_t seed = 0;
  SamplingParams sampling;
  bool json = false;
  bool enforce_eager = false;
  bool no_overlap = false;
  SpeculativeFlags speculative;
};

int run_generate(GenerateArgs a) {
  KILN_CHECK(a.prompt.empty() != a.prompt_ids.empty(), "generate needs exactly one of --prompt or --prompt-ids");
  KILN_CHECK(a.max_tokens >= 0, "--max-tokens must be >= 0, got {}", a.max_tokens);
  KILN_CHECK(a.block_size > 0, "--block-size must be > 0, got {}", a.block_size);
  // The checkpoint's tokenizer, when it ships one: text prompts in, text out.
  std::optional<tok::Tokenizer> tokenizer;
  if (std::filesystem::exists(std::filesystem::path(a.model) / "tokenizer.json") ||
      std::filesystem::exists(std::filesystem::path(a.model) / "tiktoken.model"))
    tokenizer = tok::Tokenizer::load(a.model);
  KILN_CHECK(a.prompt.empty() || tokenizer, "--prompt: {} has no tokenizer.json or tiktoken.model; use --prompt-ids",
             a.model);
  Request req;
  if (a.prompt.empty()) {
    req.prompt = parse_ids(a.prompt_ids, "--prompt-ids");
  } else {
    for (uint32_t id : tokenizer->encode(a.prompt, /*add_special_tokens=*/true))
      req.prompt.push_back(static_cast<int32_t>(id));
    KILN_CHECK(!req.prompt.empty(), "--prompt: the text encodes to no tokens");
  }
  req.sampling = a.sampling;
  req.sampling.max_tokens = a.max_tokens;
  req.sampling.seed = a.seed;
  req.sampling.logprobs = true;
  if (!a.stop_token_ids.empty()) req.sampling.stop_token_ids = parse_ids(a.stop_token_ids, "--stop-token-ids");
  req.sampling.validate(INT32_MAX);  // flag errors before the model loads; the vocabulary is checked later
  check_speculative_flags(a.speculative);
  LoadedModel m = load_model(a.model, a.device, a.precision, "auto", a.parallel);

  EngineConfig cfg;
  cfg.block_size = a.block_size;
  cfg.scheduler.max_num_seqs = 1;
  cfg.cuda_graphs = !a.enforce_eager;
  cfg.overlap_schedule = !a.no_overlap;
  if (!a.kv_cache_memory.empty())
    cfg.kv.memory_bytes = kv::parse_memory_size(a.kv_cache_memory, "--kv-cache-memory");
  else  // one request: the blocks it can use (submit() refuses one past the model's positions)
    cfg.kv.num_blocks = kv::blocks_for(
        std::min(static_cast<int64_t>(req.prompt.size()) + a.max_tokens, m.model->config().max_position_embeddings),
        a.block_size);
  cfg.spec_policy = spec_policy_config(a.speculative);
  cfg.speculator = make_speculator(a.speculative, a.model, *m.model);
  Engine engine(*m.model, cfg);
  const std::vector<int32_t> prompt = req.prompt;
  RequestStream stream = engine.submit(std::move(req));
  OutputChunk all;
  while (auto chunk = stream.next()) all.merge(std::move(*chunk));
  KILN_CHECK(all.error.empty(), "generation failed: {}", all.error);

  std::string text = all.text;
  if (tokenizer && text.empty() && !all.token_ids.empty()) {
    std::vector<uint32_t> ids(all.token_ids.begin(), all.token_ids.end());
    text = tokenizer->decode(ids, /*skip_special_tokens=*/true);
  }
  if (a.json) {
    nlohmann::json j = {{"prompt_ids", prompt},
                        {"output_ids", all.token_ids},
                        {"logprobs", all.logprobs},
                        {"text", text},
                        {"finish_reason", finish_reason_name(*all.finish)}};
    std::printf("%s\n", j.dump().c_str());
  } else if (tokenizer) {
    std::printf("%s%s\n", a.prompt.c_str(), text.c_str());
  } else {
    for (size_t i = 0; i < all.token_ids.size(); ++i) std::printf("%s%d", i ? "," : "", all.token_ids[i]);
    std::printf("\n");
  }
  return 0;
}

KILN_COMMAND("generate", "Generate a continuation of a prompt", [](CLI::App& sub) {
  auto a = std::make_shared<GenerateArgs>();
  SamplingParams& s = a->sampling;
  sub.add_option("--model", a->model, "checkpoint directory")->required();
  sub.add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  add_precision_options(sub, a->precision);
  add_parallel_options(sub, a->parallel);
  sub.add_option("--prompt", a->prompt, "prompt text");
  sub.add_option("--prompt-ids", a->prompt_ids, "prompt as comma-separated token ids");
  sub.add_option("--max-tokens", a->max_tokens, "tokens to generate")->capture_default_str();
  sub.add_option("--temperature", s.temperature, "0 for greedy")->capture_default_str();
  sub.add_option("--top-k", s.top_k, "keep the k most likely tokens (0: off)");
  sub.add_option("--top-p", s.top_p, "keep the smallest set with this mass (1: off)");
  sub.add_option("--min-p", s.min_p, "drop tokens below this share of the top probability (0: off)");
  sub.add_option("--repetition-penalty", s.repetition_penalty, "penalise tokens already seen (1: off)");
  sub.add_option("--presence-penalty", s.presence_penalty, "OpenAI presence penalty");
  sub.add_option("--frequency-penalty", s.frequency_penalty, "OpenAI frequency penalty");
  sub.add_option("--stop-token-ids", a->stop_token_ids, "extra comma-separated ids that end generation");
  sub.add_option("--seed", a->seed, "sampling seed")->capture_default_str();
  sub.add_flag("--ignore-eos", s.ignore_eos, "do not stop at the end-of-sequence token");
  sub.add_option("--kv-cache-memory", a->kv_cache_memory, "KV cache size, e.g. 2GiB (default: what the request needs)");
  sub.add_option("--block-size", a->block_size, "tokens per KV block")->capture_default_str();
  sub.add_flag("--json", a->json, "print JSON");
  sub.add_flag("--enforce-eager", a->enforce_eager, "run decode steps op by op (no CUDA graphs)");
  sub.add_flag("--disable-overlap-schedule", a->no_overlap,
               "read each step's tokens before scheduling the next (default: the next step is queued first)");
  add_speculative_options(sub, a->speculative);
  return [a] { return run_generate(*a); };
});

}  // namespace
}  // namespace kiln::cli
