// One request as the benchmark measured it: the unit every metric is computed from, and what the
// JSON output keeps for every request. Times are milliseconds since the request was sent unless
// the name says otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::bench {

// Where a request's output token count came from, best first.
enum class TokenSource { kUsage, kTokenizer, kEvents };
const char* token_source_name(TokenSource s);

struct RequestRecord {
  int64_t index = 0;                   // position in the sweep point's prompt list
  int64_t group = -1;                  // shared-prefix group, -1 otherwise
  int64_t max_tokens = 0;              // output tokens asked for
  int64_t prompt_tokens = 0;           // input tokens: usage.prompt_tokens when the server sent it, else the workload's
  int64_t workload_prompt_tokens = 0;  // input tokens as the workload meant them (the PromptTokenizer's count)
  int64_t output_tokens = 0;           // output tokens: usage.completion_tokens, else counted (see output_source)
  TokenSource output_source = TokenSource::kEvents;
  int64_t usage_prompt_tokens = -1;      // as the server reported them; -1: no usage
  int64_t usage_completion_tokens = -1;  // as the server reported them; -1: no usage
  bool success = false;
  std::string error_kind;        // empty on success; http_<status>, timeout, connect, transfer, error_event,
                                 // malformed_event, no_tokens, interrupted
  std::string error;             // the detail (HTTP body excerpt, libcurl message)
  int http_status = 0;           // 0 when no response came
  double start_s = 0;            // send time, seconds since the point started
  double ttft_ms = 0;            // first token event
  double e2e_ms = 0;             // the whole response received
  std::vector<double> event_ms;  // every token event
  std::string finish_reason;
  std::string text;  // the generated text (kept for counting; not written to the JSON)
};

}  // namespace kiln::bench
