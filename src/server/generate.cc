// POST /v1/chat/completions and /v1/completions: validate, tokenize (and build tool-call
// constraints), submit one engine request per (prompt, choice); response.cc answers.
#include <fmt/format.h>

#include <random>

#include "core/error.h"
#include "core/log.h"
#include "server/job.h"
#include "server/prompt_budget.h"

namespace kiln::server {
namespace {

using nlohmann::json;

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

void Server::cancel_job(Job& job) {
  for (auto& c : job.choices) engine_.cancel(c.engine_id);
}

std::shared_ptr<const ToolCallGrammar> Server::tool_grammar(const ParsedRequest& p) {
  if (p.tool_choice != "required" && p.tool_choice != "function") return nullptr;
  if (cfg_.tool_format == ToolFormat::None)
    throw ApiError(400,
                   fmt::format("tool_choice '{}' needs the model's tool-call format, and this server has none "
                               "(start it with --tool-call-parser deepseek_v3, deepseek_v31 or kimi_k2)",
                               p.tool_choice == "function" ? p.tool_choice_name : p.tool_choice),
                   "tool_choice");
  vocab();
  std::vector<ToolSpec> tools;
  for (const auto& t : p.tools) {
    const auto& f = t["function"];
    ToolSpec spec{f["name"].get<std::string>(), nullptr};
    if (p.tool_choice == "function" && spec.name != p.tool_choice_name) continue;
    if (f.contains("parameters")) spec.parameters = nlohmann::json::parse(f["parameters"].dump());
    tools.push_back(std::move(spec));
  }
  // V3 writes "function" <sep> NAME + "\n```json\n" + ARGS; V3.1 NAME <sep> ARGS (the server's flag or
  // the model's config says which, cli/cmd_serve.cc).
  const ToolCallStyle style = cfg_.tool_format == ToolFormat::KimiK2        ? ToolCallStyle::KimiK2
                              : cfg_.tool_format == ToolFormat::DeepSeekV31 ? ToolCallStyle::DeepSeekV31
                                                                            : ToolCallStyle::DeepSeekV3;
  return std::make_shared<ToolCallGrammar>(vocab_, style, tools, end_ids());
}

// response_format json_object / json_schema: one JSON object (under the schema), then the end.
std::shared_ptr<const ToolCallGrammar> Server::json_grammar(const ParsedRequest& p) {
  vocab();
  ToolSpec spec{"", p.response_format == "json_schema" ? p.response_schema : nlohmann::json(nullptr)};
  return std::make_shared<ToolCallGrammar>(vocab_, ToolCallStyle::PlainJson, std::vector<ToolSpec>{spec}, end_ids());
}

std::vector<int32_t> Server::end_ids() const {
  std::vector<int32_t> ends = engine_.eos_ids();
  if (auto e = tok_.eos_id()) ends.push_back(static_cast<int32_t>(*e));
  return ends;
}

const TokenVocab& Server::vocab() {
  std::call_once(vocab_once_, [&] { vocab_ = token_vocab(tok_, end_ids()); });
  return *vocab_;
}

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
  job->top_logprobs = p.top_logprobs;
  job->model = cfg_.model_name;
  job->id = random_id(p.chat ? "chatcmpl-" : "cmpl-");
  job->created = static_cast<int64_t>(std::time(nullptr));
  const bool tools = p.tools.is_array() && cfg_.tool_format != ToolFormat::None;
  const std::shared_ptr<const ToolCallGrammar> grammar =
      p.response_format != "text" ? json_grammar(p) : (p.chat ? tool_grammar(p) : nullptr);
  bool in_reasoning = false;
  const int64_t limit = engine_.max_model_len();
  const char* prompt_param = p.chat ? "messages" : "prompt";
  const PromptBudget budget{limit, max_token_bytes_};
  // Refused before any template or tokenizer work when the bytes alone cannot fit the context.
  auto check_bytes = [&](size_t bytes) {
    if (!budget.fits(bytes))
      throw ApiError(400,
                     fmt::format("the prompt is {} bytes, more than this model's context limit of {} tokens can hold",
                                 bytes, limit),
                     prompt_param, "", "context_length_exceeded");
  };
  // One id past the limit is enough to refuse the prompt, so tokenizing stops there.
  const auto max_ids = static_cast<size_t>(limit);
  // Tokenize first: template and tokenizer errors are the client's, before anything is queued.
  if (p.chat) {
    if (!template_) throw ApiError(400, "this model has no chat template; use /v1/completions", "messages");
    tok::ChatRequest cr;
    cr.messages = p.messages;
    cr.tools = p.tools;
    cr.add_generation_prompt = p.add_generation_prompt;
    cr.continue_final_message = p.continue_final_message;
    cr.kwargs = p.chat_template_kwargs;
    check_bytes(rendered_content_bytes(cr.messages));
    std::string text;
    try {
      text = template_->render(cr);
    } catch (const Error& e) {
      // Clients send an assistant tool-call message back with content null, which templates that
      // concatenate content (kiln-tiny's) cannot render; such a template gets "" instead.
      const ApiError failed(400, fmt::format("the chat template failed on these messages: {}", e.message()),
                            "messages");
      bool nulls = false;
      for (auto& m : cr.messages)
        if (m.contains("content") && m["content"].is_null()) m["content"] = "", nulls = true;
      if (!nulls) throw failed;
      try {
        text = template_->render(cr);
      } catch (const Error&) {
        throw failed;
      }
    }
    const auto end = text.find_last_not_of(" \t\r\n");
    in_reasoning = end != std::string::npos && end >= 6 && text.compare(end - 6, 7, "<think>") == 0;
    check_bytes(text.size());
    auto ids = tok_.encode(text, /*add_special_tokens=*/false, /*split_special_tokens=*/false, max_ids);
    job->prompts.emplace_back(ids.begin(), ids.end());
    job->prompt_texts.push_back(std::move(text));
  } else {
    for (const auto& t : p.prompt_texts) check_bytes(t.size());
    for (const auto& t : p.prompt_texts) {
      auto ids = tok_.encode(t, /*add_special_tokens=*/true, /*split_special_tokens=*/false, max_ids);
      job->prompts.emplace_back(ids.begin(), ids.end());
      job->prompt_texts.push_back(t);
    }
    for (const auto& ids : p.prompt_ids) {
      job->prompts.push_back(ids);
      job->prompt_texts.push_back(p.echo ? tok_.decode(std::vector<uint32_t>(ids.begin(), ids.end())) : "");
    }
  }
  for (const auto& ids : job->prompts) {
    const auto n = static_cast<int64_t>(ids.size());
    if (n == 0) throw ApiError(400, "the prompt is empty", prompt_param);
    if (n >= limit)
      throw ApiError(400,
                     fmt::format("the prompt has {}{} tokens; this model's context limit is {}",
                                 n > limit ? "more than " : "", std::min(n, limit), limit),
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
    throw ApiError(400, e.message());
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
      // echo + logprobs reports the prompt's tokens too (computed during the prefill).
      if (!p.chat && p.echo && p.logprobs) r.prompt_logprobs = p.top_logprobs;
      r.detokenizer = std::make_unique<Detok>(tok_, p.skip_special_tokens && !tools);
      if (grammar) r.constraint = std::make_shared<ToolCallConstraint>(grammar);
      try {
        RequestStream s = engine_.submit(std::move(r));
        const uint64_t id = s.id();
        job->choices.emplace_back(std::move(s),
                                  OutputParser(tools ? cfg_.tool_format : ToolFormat::None,
                                               cfg_.reasoning && p.chat && p.response_format == "text", in_reasoning));
        job->choices.back().engine_id = id;
        job->choices.back().prompt = i;
      } catch (const Error& e) {
        throw ApiError(draining_ ? 503 : 400, e.message());
      }
    }
  }
  return job;
}

void Server::handle_generate(const http::Request& req, http::Response& res, bool chat) {
  const auto fail = [&](const ApiError& e) {
    res = http::Response{};
    res.status = e.status;
    if (e.status == 503 || e.status == 429) res.set_header("Retry-After", "1");
    res.set_content(dump(error_body(e)) + "\n", "application/json");
  };
  try {
    // The key was checked from the head (Server::screen), before the body was read.
    const std::string& ct = req.header("Content-Type");
    if (ct.find("application/json") == std::string::npos || ct.find("multipart/form-data") != std::string::npos)
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
    fail(ApiError(400, e.message()));
  } catch (const json::exception& e) {
    fail(ApiError(400, fmt::format("invalid request: {}", e.what())));
  }
}

}  // namespace kiln::server
