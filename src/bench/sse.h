// Server-sent events from an OpenAI-compatible streaming endpoint: an incremental parser for the
// event framing (any split of the bytes gives the same events) and the reading of each event as an
// OpenAI completion or chat-completion chunk.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::bench {

// SSE framing (WHATWG): lines end in \n, \r\n or \r; "data:" lines of one event are joined with \n;
// a blank line ends the event; comments (":") and other fields are ignored.
class SseParser {
 public:
  // Consumes `bytes`, appending the data of every event they complete to `events`.
  void feed(std::string_view bytes, std::vector<std::string>& events);

 private:
  void line(std::string_view l, std::vector<std::string>& events);
  std::string partial_;  // an unfinished line
  std::string data_;     // the data of the event being read
  bool has_data_ = false;
  bool skip_lf_ = false;  // the previous chunk ended in \r: a leading \n belongs to it
};

// What the stream of one request said, event by event.
struct StreamState {
  std::vector<double> event_ms;          // arrival of each token-carrying chunk, ms since the request was sent
  std::string text;                      // the generated text, concatenated
  int64_t usage_prompt_tokens = -1;      // usage.prompt_tokens when sent (-1: never)
  int64_t usage_completion_tokens = -1;  // usage.completion_tokens when sent (-1: never)
  std::string finish_reason;
  bool done = false;  // "[DONE]" seen
  std::string error;  // the server's error event, or a malformed event; empty when fine
};

// Applies one event's data, received `now_ms` after the request was sent.
//
// A chunk counts as a token event (TTFT at the first, ITL between them) when its first choice has
// text (`text`, `delta.content`, `delta.reasoning_content`), or has no text but is neither a
// role-only opening delta nor a closing chunk with only a finish_reason: an empty-text chunk in the
// middle of a stream is a token that decodes to nothing (vLLM counts those too). Usage-only chunks
// (`choices: []`) carry the counts and are not token events.
void apply_event(std::string_view data, double now_ms, StreamState& s);

}  // namespace kiln::bench
