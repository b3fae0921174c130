// One generation request being answered (generate.cc starts it, response.cc answers it), and the
// OpenAI response pieces both need. Private to src/server.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "server/server.h"

namespace kiln::server {

using Clock = std::chrono::steady_clock;

struct Server::Job {
  struct Choice {
    explicit Choice(RequestStream s, OutputParser p) : stream(std::move(s)), parser(std::move(p)) {}
    RequestStream stream;
    OutputParser parser;
    uint64_t engine_id = 0;
    size_t prompt = 0;  // index into prompts
    bool done = false;
    std::optional<FinishReason> finish;
    std::string error;
    int tool_calls = 0;
    int64_t output_tokens = 0;
    size_t text_offset = 0;     // completions streaming: bytes of text sent so far (logprobs text_offset)
    bool echo_pending = false;  // streaming echo with logprobs: waits for the prompt's logprobs
    OutputChunk all;            // non-streaming: everything merged (streaming: the prompt logprobs)
  };
  Server* srv = nullptr;
  bool chat = false, stream = false, include_usage = false, logprobs = false, echo = false;
  int64_t top_logprobs = 0;
  std::string id, model;
  int64_t created = 0;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;  // for echo
  std::vector<int64_t> cached;            // per prompt, from its first choice
  std::vector<Choice> choices;
  Clock::time_point start = Clock::now(), last;
  bool first_seen = false;
  ~Job() {
    if (!srv) return;  // refused before it took a slot
    int64_t prompt_tokens = 0, gen = 0;
    for (auto& p : prompts) prompt_tokens += static_cast<int64_t>(p.size());
    for (auto& c : choices) gen += c.output_tokens;
    srv->metrics_.tokens(prompt_tokens, gen);
    if (first_seen) srv->metrics_.e2e.observe(std::chrono::duration<double>(Clock::now() - start).count());
    srv->job_finished();
  }
  // Records TTFT / inter-token latency for a chunk that carries tokens.
  void saw_tokens() {
    const auto now = Clock::now();
    if (!first_seen)
      srv->metrics_.ttft.observe(std::chrono::duration<double>(now - start).count());
    else
      srv->metrics_.itl.observe(std::chrono::duration<double>(now - last).count());
    first_seen = true;
    last = now;
  }
  nlohmann::json usage() const {
    int64_t p = 0, c = 0, cached_sum = 0;
    for (size_t i = 0; i < prompts.size(); ++i) p += static_cast<int64_t>(prompts[i].size()), cached_sum += cached[i];
    for (const auto& ch : choices) c += ch.output_tokens;
    return {{"prompt_tokens", p},
            {"completion_tokens", c},
            {"total_tokens", p + c},
            {"prompt_tokens_details", {{"cached_tokens", cached_sum}}}};
  }
};

namespace response {

// What logprobs report of a token: its text decoded alone ("token"; U+FFFD where it holds part of
// a character) and the bytes it stands for (chat "bytes", and the legacy text_offset, which counts
// them, so that a character split over tokens is counted once).
struct TokenText {
  const tok::Tokenizer& tok;
  const TokenVocab& vocab;
  std::string text(int32_t id) const { return tok.decode(std::vector<uint32_t>{static_cast<uint32_t>(id)}); }
  const std::string& bytes(int32_t id) const {
    static const std::string none;
    return id >= 0 && static_cast<size_t>(id) < vocab.size() ? vocab.bytes(id) : none;
  }
};

std::string dump(const nlohmann::json& j);
nlohmann::json chat_logprobs(const TokenText& t, const OutputChunk& c);
// The legacy completions arrays for the generated tokens, text_offset counting from `offset`, which
// is advanced past their bytes (where the next chunk's tokens start).
nlohmann::json completion_logprobs(const TokenText& t, const OutputChunk& c, size_t& offset);
// echo + logprobs: the prompt's tokens from offset 0 (the first with null), then those of `c`.
nlohmann::json echo_logprobs(const TokenText& t, const std::vector<int32_t>& prompt, const OutputChunk& p,
                             bool alternatives, const OutputChunk* c, size_t completion_offset);
const char* finish_name(const std::optional<FinishReason>& f, int tool_calls);
nlohmann::json tool_call_json(const ParsedToolCall& c, int index);

}  // namespace response
}  // namespace kiln::server
