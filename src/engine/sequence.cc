#include "engine/sequence.h"

#include <algorithm>

namespace kiln {

Sequence::Sequence(uint64_t request_id, Request req, int64_t max_new, std::vector<int32_t> stops,
                   std::shared_ptr<StreamState> s)
    : id(request_id),
      tokens(std::move(req.prompt)),
      num_prompt(static_cast<int64_t>(tokens.size())),
      max_tokens(max_new),
      sampler(req.sampling),
      constraint(std::move(req.constraint)),
      prompt_logprobs(req.prompt_logprobs),
      detokenizer(std::move(req.detokenizer)),
      stop_strings(req.sampling.stop),
      stop_ids(std::move(stops)),
      stream(std::move(s)) {}

void Sequence::append(const SampleResult& r, int64_t max_len) {
  const SamplingParams& p = sampler.params();
  tokens.push_back(r.token);
  if (constraint) constraint->advance(r.token);
  pending.token_ids.push_back(r.token);
  if (p.logprobs || p.top_logprobs > 0) pending.logprobs.push_back(r.logprob);
  if (p.top_logprobs > 0) pending.top.push_back(r.top);
  if (std::find(stop_ids.begin(), stop_ids.end(), r.token) != stop_ids.end()) {
    pending.stop_token = r.token;
    finish(FinishReason::Stop);  // the stop token's own text is not output
    return;
  }
  if (detokenizer) {
    pending.text += stop_strings.feed(detokenizer->step(r.token));
    if (stop_strings.matched()) {
      pending.stop_string = stop_strings.matched_string();
      finish(FinishReason::Stop);
      return;
    }
  }
  if (num_output() >= max_tokens || len() >= max_len) finish(FinishReason::Length);
}

void Sequence::finish(FinishReason reason, std::string error) {
  if (finished()) return;
  if (detokenizer && reason != FinishReason::Abort && !stop_strings.matched()) {
    // Text still held (half a character, a possible stop-string start) is output after all,
    // unless the tail completes a stop string.
    pending.text += stop_strings.feed(detokenizer->finish());
    if (stop_strings.matched()) {
      pending.stop_string = stop_strings.matched_string();
      reason = FinishReason::Stop;
    } else {
      pending.text += stop_strings.flush();
    }
  }
  finish_reason = reason;
  pending.finish = reason;
  pending.error = std::move(error);
  pending.prompt_tokens = num_prompt;
  pending.output_tokens = num_output();
  pending.cached_prompt_tokens = cached_prompt_tokens;
}

}  // namespace kiln
