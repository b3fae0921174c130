// What a front end hands the engine (Request) and what it gets back (OutputChunk), DESIGN.md §1.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/constraint.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"

namespace kiln {

enum class FinishReason { Stop, Length, Abort };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort" (the OpenAI spelling)

// Turns one sequence's generated ids into text, incrementally. The engine owns no tokenizer:
// a front end that wants text or stop strings passes one per request (the server wraps
// tok::IncrementalDetokenizer in a few lines). Called on the engine thread only.
class Detokenizer {
 public:
  virtual ~Detokenizer() = default;
  // The text that became final with this id (often empty, e.g. half a UTF-8 character).
  virtual std::string step(int32_t id) = 0;
  // Whatever is still held at the end of the sequence.
  virtual std::string finish() = 0;
};

struct Request {
  std::vector<int32_t> prompt;  // token ids
  SamplingParams sampling;
  // Optional; required for sampling.stop (stop strings are matched on decoded text). With one,
  // chunks carry text; stop-token text is never emitted, stop strings are cut off.
  std::unique_ptr<Detokenizer> detokenizer;
  // Optional: the output must follow it (its rows are sampled on the host, after masking).
  std::shared_ptr<TokenConstraint> constraint;
  // >= 0: report the log-probability of every prompt token after the first (echo with
  // logprobs), with this many most likely alternatives each. Such a request does not use the
  // prefix cache (cached positions have no logits). With sampling.max_tokens 0 the request only
  // scores its prompt: the prefill runs and it finishes (length) without output tokens.
  int64_t prompt_logprobs = -1;
  // May use the engine's speculative decoding (EngineConfig::speculator). Requests whose sampling
  // needs the host's view of every step (logprobs, penalties, constraints, prompt logprobs)
  // decode plainly whatever this says.
  bool speculate = true;
};

// New output since the previous chunk; the last chunk of a request has `finish` set.
struct OutputChunk {
  std::vector<int32_t> token_ids;              // [n] new tokens (a stop token id is included)
  std::vector<float> logprobs;                 // [n] when sampling.logprobs or top_logprobs
  std::vector<std::vector<TokenLogprob>> top;  // [n][top_logprobs] when asked
  // Prompt tokens 1.. (token 0 has no context): [m] log-probabilities and [m][prompt_logprobs]
  // alternatives, appended as prefill chunks compute them (all before the first output token).
  std::vector<float> prompt_logprobs;
  std::vector<std::vector<TokenLogprob>> prompt_top;
  std::string text;                              // new final text (only with a detokenizer)
  std::optional<FinishReason> finish;            // set on the last chunk
  std::optional<int32_t> stop_token;             // the stop / end-of-sequence id that finished it
  std::string stop_string;                       // the stop string that finished it
  std::string error;                             // why the engine aborted it, if it did
  int64_t prompt_tokens = 0, output_tokens = 0;  // usage, on the last chunk
  int64_t cached_prompt_tokens = 0;              // prompt tokens served from the prefix cache

  // Appends a later chunk (a slow reader gets everything pending in one piece).
  void merge(OutputChunk&& later);
};

}  // namespace kiln
