// POST /v1/chat/completions and /v1/completions: validate, tokenize, submit one engine request per
// (prompt, choice), then answer as one JSON body or as server-sent events.
#include <httplib.h>

#include <fmt/format.h>

#include <random>

#include "core/error.h"
#include "core/log.h"
#include "server/server.h"

namespace kiln::server {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// The engine owns no tokenizer: this adapter gives it the streaming detokenizer (engine thread).
class Detok : public Detokenizer {
 public:
  Detok(const tok::Tokenizer& t, bool skip_special) : d_(t, skip_special) {}
  std::string step(int32_t id) override { return d_.step(static_cast<uint32_t>(id)); }
  std::string finish() override { return d_.finish(); }

 private:
  tok::IncrementalDetokenizer d_;
};

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}", prefix, rng());
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

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
    size_t text_offset = 0;  // completions streaming: bytes of text sent so far (logprobs text_offset)
    OutputChunk all;         // non-streaming: everything merged
  };
  Server* srv = nullptr;
  bool chat = false, stream = false, include_usage = false, logprobs = false, echo = false;
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
  json usage() const {
    int64_t p = 0, c = 0, cached_sum = 0;
    for (size_t i = 0; i < prompts.size(); ++i) p += static_cast<int64_t>(prompts[i].size()), cached_sum += cached[i];
    for (const auto& ch : choices) c += ch.output_tokens;
    return {{"prompt_tokens", p},
            {"completion_tokens", c},
            {"total_tokens", p + c},
            {"prompt_tokens_details", {{"cached_tokens", cached_sum}}}};
  }
};

void Server::cancel_job(Job& job) {
  for (auto& c : job.choices) engine_.cancel(c.engine_id);
}

namespace {

// One token's logprob entry in the chat format.
json chat_logprob(const tok::Tokenizer& t, int32_t id, float lp, const std::vector<TokenLogprob>* top) {
  auto entry = [&](int32_t tid, float l) {
    const std::string s = t.decode(std::vector<uint32_t>{static_cast<uint32_t>(tid)});
    json bytes = json::array();
    for (unsigned char ch : s) bytes.push_back(static_cast<int>(ch));
    return json{{"token", s}, {"logprob", l}, {"bytes", bytes}};
  };
  json e = entry(id, lp);
  e["top_logprobs"] = json::array();
  if (top)
    for (const auto& x : *top) e["top_logprobs"].push_back(entry(x.token, x.logprob));
  return e;
}

json chat_logprobs(const tok::Tokenizer& t, const OutputChunk& c) {
  json content = json::array();
  for (size_t i = 0; i < c.logprobs.size() && i < c.token_ids.size(); ++i)
    content.push_back(chat_logprob(t, c.token_ids[i], c.logprobs[i], i < c.top.size() ? &c.top[i] : nullptr));
  return {{"content", content}};
}

// The legacy completions format: parallel arrays; text_offset counts bytes from `offset`.
json completion_logprobs(const tok::Tokenizer& t, const OutputChunk& c, size_t offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (size_t i = 0; i < c.logprobs.size() && i < c.token_ids.size(); ++i) {
    const std::string s = t.decode(std::vector<uint32_t>{static_cast<uint32_t>(c.token_ids[i])});
    tokens.push_back(s);
    lps.push_back(c.logprobs[i]);
    offs.push_back(offset);
    offset += s.size();
    json top = json::object();
    if (i < c.top.size())
      for (const auto& x : c.top[i]) top[t.decode(std::vector<uint32_t>{static_cast<uint32_t>(x.token)})] = x.logprob;
    tops.push_back(c.top.empty() ? json(nullptr) : top);
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

const char* finish_name(const std::optional<FinishReason>& f, int tool_calls) {
  if (!f) return "abort";
  if (*f == FinishReason::Stop && tool_calls > 0) return "tool_calls";
  return finish_reason_name(*f);
}

json tool_call_json(const ParsedToolCall& c, int index) {
  return {{"index", index},
          {"id", c.id},
          {"type", "function"},
          {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

}  // namespace

std::shared_ptr<Server::Job> Server::start_job(const ParsedRequest& p) {
  if (!p.model.empty() && p.model != cfg_.model_name &&
      std::find(cfg_.model_aliases.begin(), cfg_.model_aliases.end(), p.model) == cfg_.model_aliases.end())
    throw ApiError(404, fmt::format("the model '{}' does not exist; this server serves '{}'", p.model, cfg_.model_name),
                   "model", "", "model_not_found");
  auto job = std::make_shared<Job>();
  job->chat = p.chat;
  job->stream = p.stream;
  job->include_usage = p.include_usage;
  job->logprobs = p.logprobs;
  job->echo = p.echo;
  job->model = cfg_.model_name;
  job->id = random_id(p.chat ? "chatcmpl-" : "cmpl-");
  job->created = static_cast<int64_t>(std::time(nullptr));
  const bool tools = p.tools.is_array() && cfg_.tool_format != ToolFormat::None;
  bool in_reasoning = false;
  // Tokenize first: template and tokenizer errors are the client's, before anything is queued.
  if (p.chat) {
    if (!template_) throw ApiError(400, "this model has no chat template; use /v1/completions", "messages");
    tok::ChatRequest cr;
    cr.messages = p.messages;
    cr.tools = p.tools;
    cr.add_generation_prompt = p.add_generation_prompt;
    cr.continue_final_message = p.continue_final_message;
    cr.kwargs = p.chat_template_kwargs;
    std::string text;
    try {
      text = template_->render(cr);
    } catch (const Error& e) {
      throw ApiError(400, fmt::format("the chat template failed on these messages: {}", e.what()), "messages");
    }
    const auto end = text.find_last_not_of(" \t\r\n");
    in_reasoning = end != std::string::npos && end >= 6 && text.compare(end - 6, 7, "<think>") == 0;
    auto ids = tok_.encode(text, /*add_special_tokens=*/false);
    job->prompts.emplace_back(ids.begin(), ids.end());
    job->prompt_texts.push_back(std::move(text));
  } else {
    for (const auto& t : p.prompt_texts) {
      auto ids = tok_.encode(t, /*add_special_tokens=*/true);
      job->prompts.emplace_back(ids.begin(), ids.end());
      job->prompt_texts.push_back(t);
    }
    for (const auto& ids : p.prompt_ids) {
      job->prompts.push_back(ids);
      job->prompt_texts.push_back(p.echo ? tok_.decode(std::vector<uint32_t>(ids.begin(), ids.end())) : "");
    }
  }
  const int64_t limit = engine_.max_model_len();
  const char* prompt_param = p.chat ? "messages" : "prompt";
  for (const auto& ids : job->prompts) {
    const auto n = static_cast<int64_t>(ids.size());
    if (n == 0) throw ApiError(400, "the prompt is empty", prompt_param);
    if (n >= limit)
      throw ApiError(400, fmt::format("the prompt has {} tokens; this model's context limit is {}", n, limit),
                     prompt_param, "", "context_length_exceeded");
    if (p.sampling.max_tokens > 0 && n + p.sampling.max_tokens > limit)
      throw ApiError(400,
                     fmt::format("the prompt ({} tokens) plus max_tokens ({}) exceed this model's context limit of {}",
                                 n, p.sampling.max_tokens, limit),
                     "max_tokens", "", "context_length_exceeded");
  }
  try {
    p.sampling.validate(cfg_.limits.vocab_size);
  } catch (const Error& e) {
    throw ApiError(400, e.what());
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (draining_) throw ApiError(503, "the server is shutting down", "", "", "server_shutting_down");
    if (jobs_ >= cfg_.max_pending_requests)
      throw ApiError(503,
                     fmt::format("the server is at its limit of {} requests; retry later", cfg_.max_pending_requests),
                     "", "", "server_overloaded");
    ++jobs_;
    metrics_.inflight = jobs_;
    live_.push_back(job);
  }
  job->srv = this;  // from here the Job's destructor releases the slot
  job->cached.assign(job->prompts.size(), 0);
  for (size_t i = 0; i < job->prompts.size(); ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      Request r;
      r.prompt = job->prompts[i];
      r.sampling = p.sampling;
      // n > 1 with a seed: distinct but reproducible choices.
      if (r.sampling.seed && j > 0) r.sampling.seed = *r.sampling.seed + static_cast<uint64_t>(j);
      r.sampling.logprobs = p.logprobs;
      r.sampling.top_logprobs = p.top_logprobs;
      r.detokenizer = std::make_unique<Detok>(tok_, p.skip_special_tokens && !tools);
      try {
        RequestStream s = engine_.submit(std::move(r));
        const uint64_t id = s.id();
        job->choices.emplace_back(std::move(s), OutputParser(tools ? cfg_.tool_format : ToolFormat::None,
                                                             cfg_.reasoning && p.chat, in_reasoning));
        job->choices.back().engine_id = id;
        job->choices.back().prompt = i;
      } catch (const Error& e) {
        throw ApiError(draining_ ? 503 : 400, e.what());
      }
    }
  }
  return job;
}

void Server::handle_generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  const auto fail = [&](const ApiError& e) {
    res.status = e.status;
    res.set_content(dump(error_body(e)) + "\n", "application/json");
  };
  try {
    if (!authorized(req, res)) return;
    const std::string ct = req.get_header_value("Content-Type");
    if (ct.find("application/json") == std::string::npos)
      throw ApiError(415, fmt::format("Content-Type must be application/json, got '{}'", ct), "", "",
                     "unsupported_media_type");
    const json body = parse_json_body(req.body);
    const ParsedRequest p = chat ? parse_chat_request(body, cfg_.limits) : parse_completion_request(body, cfg_.limits);
    auto job = start_job(p);
    if (p.stream)
      respond_stream(job, res);
    else
      respond_json(job, res);
  } catch (const ApiError& e) {
    fail(e);
  } catch (const Error& e) {
    fail(ApiError(400, e.what()));
  } catch (const json::exception& e) {
    fail(ApiError(400, fmt::format("invalid request: {}", e.what())));
  }
}

void Server::respond_json(const std::shared_ptr<Job>& job, httplib::Response& res) {
  json choices = json::array();
  for (size_t k = 0; k < job->choices.size(); ++k) {
    auto& c = job->choices[k];
    while (auto chunk = c.stream.next()) {
      if (!chunk->token_ids.empty()) job->saw_tokens();
      c.all.merge(std::move(*chunk));
    }
    if (!c.all.error.empty()) throw ApiError(500, fmt::format("generation failed: {}", c.all.error));
    c.output_tokens = c.all.output_tokens;
    if (c.prompt < job->cached.size() && k % (job->choices.size() / job->prompts.size()) == 0)
      job->cached[c.prompt] = c.all.cached_prompt_tokens;
    ParsedDelta d = c.parser.feed(c.all.text);
    d.append(c.parser.finish());
    c.tool_calls = static_cast<int>(d.tool_calls.size());
    json choice = {{"index", k}, {"finish_reason", finish_name(c.all.finish, c.tool_calls)}};
    if (job->chat) {
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
      choice["logprobs"] = job->logprobs ? chat_logprobs(tok_, c.all) : json(nullptr);
    } else {
      const std::string prefix = job->echo ? job->prompt_texts[c.prompt] : "";
      choice["text"] = prefix + d.content;
      choice["logprobs"] = job->logprobs ? completion_logprobs(tok_, c.all, prefix.size()) : json(nullptr);
    }
    choices.push_back(choice);
  }
  json out = {{"id", job->id},           {"object", job->chat ? "chat.completion" : "text_completion"},
              {"created", job->created}, {"model", job->model},
              {"choices", choices},      {"usage", job->usage()}};
  res.status = 200;
  res.set_content(dump(out) + "\n", "application/json");
}

void Server::respond_stream(const std::shared_ptr<Job>& job, httplib::Response& res) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  struct State {
    bool started = false;
    Clock::time_point last_write = Clock::now();
  };
  auto st = std::make_shared<State>();
  const size_t per_prompt = job->choices.size() / job->prompts.size();
  res.set_chunked_content_provider("text/event-stream", [this, job, st, per_prompt](size_t, httplib::DataSink& sink) {
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
        else if (job->echo) {
          first = {{"index", k},
                   {"text", job->prompt_texts[job->choices[k].prompt]},
                   {"logprobs", nullptr},
                   {"finish_reason", nullptr}};
          job->choices[k].text_offset = job->prompt_texts[job->choices[k].prompt].size();
        }
        if (!first.is_null() && !event(chunk_json(first))) return false;
      }
    }
    bool all_done = true;
    for (size_t k = 0; k < job->choices.size(); ++k) {
      auto& c = job->choices[k];
      if (c.done) continue;
      all_done = false;
      // Waits on one choice at a time; with n = 1 (the usual case) this is a plain blocking wait.
      auto chunk = c.stream.next_for(std::chrono::milliseconds(job->choices.size() == 1 ? 200 : 20));
      if (!chunk) {
        if (c.stream.done()) c.done = true;
        continue;
      }
      if (!chunk->token_ids.empty()) job->saw_tokens();
      c.output_tokens += static_cast<int64_t>(chunk->token_ids.size());
      if (chunk->finish) {
        c.output_tokens = chunk->output_tokens;
        if (k % per_prompt == 0) job->cached[c.prompt] = chunk->cached_prompt_tokens;
      }
      ParsedDelta d = c.parser.feed(chunk->text);
      if (chunk->finish) d.append(c.parser.finish());
      json lp = job->logprobs && !chunk->logprobs.empty()
                    ? (job->chat ? chat_logprobs(tok_, *chunk) : completion_logprobs(tok_, *chunk, c.text_offset))
                    : json(nullptr);
      if (!job->chat && lp.is_object())
        for (const auto& t : lp["tokens"]) c.text_offset += t.get<std::string>().size();
      if (job->chat) {
        if (!d.content.empty() || !d.reasoning.empty() || !lp.is_null()) {
          json delta = {{"content", d.content}};
          if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
          if (!event(chunk_json({{"index", k}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", nullptr}})))
            return false;
        }
        if (!d.tool_calls.empty()) {
          json calls = json::array();
          for (auto& tc : d.tool_calls) calls.push_back(tool_call_json(tc, c.tool_calls++));
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
  });
}

}  // namespace kiln::server
