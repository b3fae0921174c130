// What a request asks of sampling and stopping (the OpenAI / vLLM parameter set).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy (argmax after penalties)
  int64_t top_k = 0;         // keep the k most likely tokens (0 or -1: off)
  float top_p = 1.0f;        // keep the smallest set reaching this mass (1: off)
  float min_p = 0.0f;        // drop tokens below min_p x the top probability (0: off)
  // Penalties act on the logits before temperature. repetition (HF/vLLM): tokens seen in the
  // prompt or output have positive logits divided, negative ones multiplied. presence / frequency
  // (OpenAI): subtract once / per occurrence for tokens in the output.
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // OpenAI logit_bias: (token id, bias in [-100, 100]) added to the raw logits before penalties and
  // the draw, ids ascending and distinct. logprobs still report the unbiased model (as OpenAI and
  // vLLM do). Rows with a bias are sampled on the host (engine/model_runner.cc).
  std::vector<std::pair<int32_t, float>> logit_bias;
  // The request's own generator: the same seed gives the same tokens whatever else is batched.
  std::optional<uint64_t> seed;

  int64_t max_tokens = -1;  // -1: until the context limit
  bool ignore_eos = false;  // do not stop at the model's end-of-sequence ids
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;  // stop strings: matched on the decoded text, not emitted

  bool logprobs = false;     // report the chosen token's log-probability
  int64_t top_logprobs = 0;  // and this many most likely alternatives

  // Throws kiln::Error naming the first bad field.
  void validate(int64_t vocab_size) const;
};

}  // namespace kiln
