// Answering a generation request: the OpenAI response bodies, as one JSON document or as
// server-sent events.
#include <fmt/format.h>

#include <algorithm>

#include "core/log.h"
#include "server/job.h"

namespace kiln::server {
namespace response {

using nlohmann::json;

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

// One token's logprob entry in the chat format.
json chat_logprob(const TokenText& t, int32_t id, float lp, const std::vector<TokenLogprob>* top) {
  auto entry = [&](int32_t tid, float l) {
    json bytes = json::array();
    for (unsigned char ch : t.bytes(tid)) bytes.push_back(static_cast<int>(ch));
    return json{{"token", t.text(tid)}, {"logprob", l}, {"bytes", bytes}};
  };
  json e = entry(id, lp);
  e["top_logprobs"] = json::array();
  if (top)
    for (const auto& x : *top) e["top_logprobs"].push_back(entry(x.token, x.logprob));
  return e;
}

// The legacy completions format: parallel arrays; text_offset counts bytes from `offset`.
struct LegacyLogprobs {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  size_t offset = 0;
  // `lp` null: the first prompt token (nothing predicts it). `top` null: no alternatives asked.
  void add(const TokenText& t, int32_t id, json lp, const std::vector<TokenLogprob>* top) {
    tokens.push_back(t.text(id));
    lps.push_back(std::move(lp));
    offs.push_back(offset);
    offset += t.bytes(id).size();
    json alts = json::object();
    if (top)
      for (const auto& x : *top) alts[t.text(x.token)] = x.logprob;
    tops.push_back(top ? alts : json(nullptr));
  }
  json to_json() const {
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
  }
};

}  // namespace

json chat_logprobs(const TokenText& t, const OutputChunk& c) {
  json content = json::array();
  for (size_t i = 0; i < c.logprobs.size() && i < c.token_ids.size(); ++i)
    content.push_back(chat_logprob(t, c.token_ids[i], c.logprobs[i], i < c.top.size() ? &c.top[i] : nullptr));
  return {{"content", content}};
}

json completion_logprobs(const TokenText& t, const OutputChunk& c, size_t& offset) {
  LegacyLogprobs out;
  out.offset = offset;
  for (size_t i = 0; i < c.logprobs.size() && i < c.token_ids.size(); ++i)
    out.add(t, c.token_ids[i], c.logprobs[i], c.top.empty() ? nullptr : &c.top[i]);
  offset = out.offset;
  return out.to_json();
}

// The first prompt token has a null logprob, as OpenAI and vLLM report it.
json echo_logprobs(const TokenText& t, const std::vector<int32_t>& prompt, const OutputChunk& p, bool alternatives,
                   const OutputChunk* c, size_t completion_offset) {
  LegacyLogprobs out;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (i == 0) {
      out.add(t, prompt[i], nullptr, nullptr);
    } else if (i - 1 < p.prompt_logprobs.size()) {
      const bool top = alternatives && i - 1 < p.prompt_top.size();
      out.add(t, prompt[i], p.prompt_logprobs[i - 1], top ? &p.prompt_top[i - 1] : nullptr);
    } else {  // the engine stopped before scoring it (aborted)
      out.add(t, prompt[i], nullptr, nullptr);
    }
  }
  if (c) {
    out.offset = completion_offset;
    for (size_t i = 0; i < c->logprobs.size() && i < c->token_ids.size(); ++i)
      out.add(t, c->token_ids[i], c->logprobs[i], c->top.empty() ? nullptr : &c->top[i]);
  }
  return out.to_json();
}

// A request cut short (the shutdown deadline cancelled it) reports "length": the output ended before
// its own end, and OpenAI clients know no "abort".
const char* finish_name(const std::optional<FinishReason>& f, int tool_calls) {
  if (!f || *f == FinishReason::Abort) return "length";
  if (*f == FinishReason::Stop && tool_calls > 0) return "tool_calls";
  return finish_reason_name(*f);
}

json tool_call_json(const ParsedToolCall& c, int index) {
  return {{"index", index},
          {"id", c.id},
          {"type", "function"},
          {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

}  // namespace response

using namespace response;

json Server::json_body(Job& job) {
  json choices = json::array();
  for (size_t k = 0; k < job.choices.size(); ++k) {
    auto& c = job.choices[k];
    if (!c.all.error.empty())
      return error_body(ApiError(500, fmt::format("generation failed: {}", c.all.error), "", "server_error"));
    c.output_tokens = c.all.output_tokens;
    if (c.prompt < job.cached.size() && k % (job.choices.size() / job.prompts.size()) == 0)
      job.cached[c.prompt] = c.all.cached_prompt_tokens;
    ParsedDelta d = c.parser.feed(c.all.text);
    d.append(c.parser.finish());
    c.tool_calls = static_cast<int>(d.tool_calls.size());
    json choice = {{"index", k}, {"finish_reason", finish_name(c.all.finish, c.tool_calls)}};
    if (job.chat) {
      json msg = {{"role", "assistant"}, {"content", d.content}};
      if (!d.reasoning.empty()) msg["reasoning_content"] = d.reasoning;
      if (!d.tool_calls.empty()) {
        msg["tool_calls"] = json::array();
        for (size_t i = 0; i < d.tool_calls.size(); ++i) {
          json tc = tool_call_json(d.tool_calls[i], static_cast<int>(i));
          tc.erase("index");
          msg["tool_calls"].push_back(tc);
        }
        if (d.content.empty()) msg["content"] = nullptr;
      }
      choice["message"] = msg;
      choice["logprobs"] = job.logprobs ? chat_logprobs(TokenText{tok_, vocab()}, c.all) : json(nullptr);
    } else {
      const std::string prefix = job.echo ? job.prompt_texts[c.prompt] : "";
      choice["text"] = prefix + d.content;
      if (!job.logprobs)
        choice["logprobs"] = nullptr;
      else if (job.echo)
        choice["logprobs"] = echo_logprobs(TokenText{tok_, vocab()}, job.prompts[c.prompt], c.all, job.top_logprobs > 0,
                                           &c.all, prefix.size());
      else {
        size_t offset = 0;
        choice["logprobs"] = completion_logprobs(TokenText{tok_, vocab()}, c.all, offset);
      }
    }
    choices.push_back(choice);
  }
  return {{"id", job.id},           {"object", job.chat ? "chat.completion" : "text_completion"},
          {"created", job.created}, {"model", job.model},
          {"choices", choices},     {"usage", job.usage()}};
}

// The body goes out as a chunked response from the start, so that a client that went away while
// the engine works is noticed: while waiting it writes a space now and then (JSON allows leading
// whitespace); the write after a client closes fails, and dropping the answer cancels the job,
// freeing its KV blocks. The status line (200) is committed with the first byte, so a failure found
// later (the engine aborted the request) can only be told in the body: an OpenAI error object,
// with 500 in the metrics. The provider is pulled when the job's streams have output
// (subscribe) and once a second, never waiting.
void Server::respond_json(const std::shared_ptr<Job>& job, http::Response& res) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.content_type = "application/json; charset=utf-8";
  auto last_write = std::make_shared<Clock::time_point>(Clock::now());
  http::Response* resp = &res;  // the provider is owned by `res`, so it never outlives it
  res.subscribe = [job](http::Wake wake) {
    for (auto& c : job->choices) c.stream.on_output(wake);
  };
  res.provider = [this, job, last_write, resp](http::DataSink& sink) {
    bool all_done = true;
    for (auto& c : job->choices) {
      if (c.done) continue;
      auto chunk = c.stream.next_for(std::chrono::milliseconds(0));
      if (chunk) {
        if (!chunk->token_ids.empty()) job->saw_tokens();
        c.all.merge(std::move(*chunk));
      }
      c.done = c.stream.done();
      all_done = all_done && c.done;
    }
    if (all_done) {
      const json body = json_body(*job);
      if (body.contains("error")) resp->status = 500;  // for the metrics: the client already has 200
      const std::string s = dump(body) + "\n";
      if (!sink.write(s.data(), s.size())) return false;
      sink.done();
      return true;
    }
    if (Clock::now() - *last_write > std::chrono::milliseconds(500)) {
      *last_write = Clock::now();
      if (!sink.write(" ", 1)) {
        cancel_job(*job);
        return false;
      }
    }
    return true;
  };
}

void Server::respond_stream(const std::shared_ptr<Job>& job, http::Response& res) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  struct State {
    bool started = false;
    Clock::time_point last_write = Clock::now();
  };
  auto st = std::make_shared<State>();
  const size_t per_prompt = job->choices.size() / job->prompts.size();
  res.content_type = "text/event-stream";
  res.subscribe = [job](http::Wake wake) {
    for (auto& c : job->choices) c.stream.on_output(wake);
  };
  res.provider = [this, job, st, per_prompt](http::DataSink& sink) {
    auto event = [&](const json& j) {
      const std::string s = "data: " + dump(j) + "\n\n";
      st->last_write = Clock::now();
      return sink.write(s.data(), s.size());
    };
    auto chunk_json = [&](json choice) {
      json j = {{"id", job->id},
                {"object", job->chat ? "chat.completion.chunk" : "text_completion"},
                {"created", job->created},
                {"model", job->model},
                {"choices", json::array({std::move(choice)})}};
      if (job->include_usage) j["usage"] = nullptr;
      return j;
    };
    if (!st->started) {
      st->started = true;
      for (size_t k = 0; k < job->choices.size(); ++k) {
        json first;
        if (job->chat)
          first = {{"index", k},
                   {"delta", {{"role", "assistant"}, {"content", ""}}},
                   {"logprobs", nullptr},
                   {"finish_reason", nullptr}};
        else if (job->echo && job->logprobs) {
          job->choices[k].echo_pending = true;  // sent with the prompt's logprobs, once computed
        } else if (job->echo) {
          first = {{"index", k},
                   {"text", job->prompt_texts[job->choices[k].prompt]},
                   {"logprobs", nullptr},
                   {"finish_reason", nullptr}};
          job->choices[k].text_offset = job->prompt_texts[job->choices[k].prompt].size();
        }
        if (!first.is_null() && !event(chunk_json(first))) return false;
      }
    }
    for (size_t k = 0; k < job->choices.size(); ++k) {
      auto& c = job->choices[k];
      if (c.done) continue;
      // Takes what is there: the connection pulls again when a stream signals output.
      auto chunk = c.stream.next_for(std::chrono::milliseconds(0));
      if (!chunk) {
        if (c.stream.done()) c.done = true;
        continue;
      }
      if (!chunk->token_ids.empty()) job->saw_tokens();
      if (c.echo_pending) {
        // The prompt's logprobs arrive before its first token; the echo waits for all of them.
        const std::vector<int32_t>& prompt = job->prompts[c.prompt];
        c.all.prompt_logprobs.insert(c.all.prompt_logprobs.end(), chunk->prompt_logprobs.begin(),
                                     chunk->prompt_logprobs.end());
        for (auto& t : chunk->prompt_top) c.all.prompt_top.push_back(std::move(t));
        if (c.all.prompt_logprobs.size() + 1 >= prompt.size() || chunk->finish) {
          c.echo_pending = false;
          const std::string& text = job->prompt_texts[c.prompt];
          json lp = echo_logprobs(TokenText{tok_, vocab()}, prompt, c.all, job->top_logprobs > 0, nullptr, 0);
          c.text_offset = text.size();
          if (!event(chunk_json({{"index", k}, {"text", text}, {"logprobs", lp}, {"finish_reason", nullptr}})))
            return false;
        }
      }
      c.output_tokens += static_cast<int64_t>(chunk->token_ids.size());
      if (chunk->finish) {
        c.output_tokens = chunk->output_tokens;
        if (k % per_prompt == 0) job->cached[c.prompt] = chunk->cached_prompt_tokens;
      }
      ParsedDelta d = c.parser.feed(chunk->text);
      if (chunk->finish) d.append(c.parser.finish());
      json lp = job->logprobs && !chunk->logprobs.empty()
                    ? (job->chat ? chat_logprobs(TokenText{tok_, vocab()}, *chunk)
                                 : completion_logprobs(TokenText{tok_, vocab()}, *chunk, c.text_offset))
                    : json(nullptr);
      if (job->chat) {
        if (!d.content.empty() || !d.reasoning.empty() || !lp.is_null()) {
          json delta = {{"content", d.content}};
          if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
          if (!event(chunk_json({{"index", k}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", nullptr}})))
            return false;
        }
        if (!d.tool_calls.empty()) {
          // OpenAI's form: a call's first delta has its id, type and name, later ones more arguments.
          json calls = json::array();
          for (auto& tc : d.tool_calls) {
            if (tc.id.empty()) {
              calls.push_back({{"index", tc.index}, {"function", {{"arguments", tc.arguments}}}});
            } else {
              calls.push_back(tool_call_json(tc, tc.index));
              ++c.tool_calls;
            }
          }
          if (!event(chunk_json({{"index", k},
                                 {"delta", {{"tool_calls", calls}}},
                                 {"logprobs", nullptr},
                                 {"finish_reason", nullptr}})))
            return false;
        }
      } else if (!d.content.empty() || !lp.is_null()) {
        if (!event(chunk_json({{"index", k}, {"text", d.content}, {"logprobs", lp}, {"finish_reason", nullptr}})))
          return false;
      }
      if (chunk->finish) {
        c.done = true;
        if (!chunk->error.empty()) {
          json err = error_body(500, fmt::format("generation failed: {}", chunk->error));
          if (!event(err)) return false;
        }
        json fin = {{"index", k}, {"logprobs", nullptr}, {"finish_reason", finish_name(chunk->finish, c.tool_calls)}};
        if (job->chat)
          fin["delta"] = json::object();
        else
          fin["text"] = "";
        if (!event(chunk_json(fin))) return false;
      }
    }
    // Decided after the pass: the pull that takes a stream's final chunk also ends the response
    // (the stream signals nothing more, so waiting for another pull would wait for the ticker).
    const bool all_done = std::all_of(job->choices.begin(), job->choices.end(), [](const auto& c) { return c.done; });
    if (all_done) {
      if (job->include_usage) {
        json u = {{"id", job->id},
                  {"object", job->chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", job->created},
                  {"model", job->model},
                  {"choices", json::array()},
                  {"usage", job->usage()}};
        if (!event(u)) return false;
      }
      static const std::string done = "data: [DONE]\n\n";
      if (!sink.write(done.data(), done.size())) return false;
      sink.done();
      return true;
    }
    // Nothing to say for a while (queued, or a long prefill): an SSE comment keeps proxies from
    // timing out and is how a client that went away is noticed (the write fails).
    if (Clock::now() - st->last_write > std::chrono::seconds(1)) {
      static const std::string ping = ": keep-alive\n\n";
      st->last_write = Clock::now();
      if (!sink.write(ping.data(), ping.size())) return false;
    }
    return true;
  };
}

}  // namespace kiln::server
