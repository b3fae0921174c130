#include "engine/sequence.h"

#include <algorithm>

#include "core/error.h"

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
  tokens.push_back(kPendingToken);
  resolve(len() - 1, r, max_len);
}

void Sequence::resolve(int64_t pos, const SampleResult& r, int64_t max_len) {
  const SamplingParams& p = sampler.params();
  KILN_CHECK(pos < len() && tokens[static_cast<size_t>(pos)] == kPendingToken,
             "internal: request {} has no pending token at position {}", id, pos);
  tokens[static_cast<size_t>(pos)] = r.token;
  // Places pending after this one are dropped if this token ends the sequence.
  auto end = [&](FinishReason reason) {
    tokens.resize(static_cast<size_t>(pos + 1));
    finish(reason);
  };
  if (constraint) constraint->advance(r.token);
  pending.token_ids.push_back(r.token);
  if (p.logprobs || p.top_logprobs > 0) pending.logprobs.push_back(r.logprob);
  if (p.top_logprobs > 0) pending.top.push_back(r.top);
  if (std::find(stop_ids.begin(), stop_ids.end(), r.token) != stop_ids.end()) {
    pending.stop_token = r.token;
    end(FinishReason::Stop);  // the stop token's own text is not output
    return;
  }
  if (detokenizer) {
    pending.text += stop_strings.feed(detokenizer->step(r.token));
    if (stop_strings.matched()) {
      pending.stop_string = stop_strings.matched_string();
      end(FinishReason::Stop);
      return;
    }
  }
  if (pos + 1 - num_prompt >= max_tokens || pos + 1 >= max_len) end(FinishReason::Length);
}

void Sequence::finish(FinishReason reason, std::string error) {
  if (finished()) return;
  while (!tokens.empty() && tokens.back() == kPendingToken) tokens.pop_back();  // never to be filled
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
