#include "server/protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln::server {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& msg) {
  throw ApiError(400, msg, param);
}

bool present(const json& b, const char* k) {
  return b.contains(k) && !b[k].is_null();
}

double get_number(const json& b, const char* k, double lo, double hi, double def) {
  if (!present(b, k)) return def;
  const json& v = b[k];
  if (!v.is_number()) bad(k, fmt::format("'{}' must be a number, got {}", k, v.type_name()));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    bad(k, fmt::format("'{}' must be between {} and {}, got {}", k, lo, hi, x));
  return x;
}

int64_t get_int(const json& b, const char* k, int64_t lo, int64_t hi, int64_t def) {
  if (!present(b, k)) return def;
  const json& v = b[k];
  if (!v.is_number_integer()) bad(k, fmt::format("'{}' must be an integer, got {}", k, v.dump()));
  // Unsigned values above INT64_MAX read as negative; compare as unsigned first.
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
    bad(k, fmt::format("'{}' must be between {} and {}, got {}", k, lo, hi, v.dump()));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad(k, fmt::format("'{}' must be between {} and {}, got {}", k, lo, hi, x));
  return x;
}

bool get_bool(const json& b, const char* k, bool def) {
  if (!present(b, k)) return def;
  if (!b[k].is_boolean()) bad(k, fmt::format("'{}' must be a boolean, got {}", k, b[k].type_name()));
  return b[k].get<bool>();
}

std::vector<int32_t> token_ids(const json& v, const std::string& param, int64_t vocab) {
  std::vector<int32_t> ids;
  for (const json& t : v) {
    if (!t.is_number_integer()) bad(param, fmt::format("'{}' must hold integer token ids, got {}", param, t.dump()));
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= vocab || (t.is_number_unsigned() && t.get<uint64_t>() >= static_cast<uint64_t>(vocab)))
      bad(param, fmt::format("token id {} in '{}' is outside the vocabulary [0, {})", t.dump(), param, vocab));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// OpenAI's {"token id": bias, ...}: ids as decimal strings inside the vocabulary, biases in
// [-100, 100], at most lim.max_logit_bias entries; returned ids ascending.
std::vector<std::pair<int32_t, float>> parse_logit_bias(const json& v, const ProtocolLimits& lim) {
  if (!v.is_object()) bad("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
  if (static_cast<int64_t>(v.size()) > lim.max_logit_bias)
    bad("logit_bias", fmt::format("'logit_bias' holds at most {} entries, got {}", lim.max_logit_bias, v.size()));
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, val] : v.items()) {
    // Digits only (no sign, space or exponent); more than 10 digits cannot be an int32 id.
    const bool digits = !key.empty() && key.size() <= 10 && key.find_first_not_of("0123456789") == std::string::npos;
    const int64_t id = digits ? std::stoll(key) : -1;
    if (!digits) bad("logit_bias", fmt::format("'logit_bias' keys must be token ids, got \"{}\"", key));
    if (id >= lim.vocab_size)
      bad("logit_bias",
          fmt::format("token id {} in 'logit_bias' is outside the vocabulary [0, {})", id, lim.vocab_size));
    if (!val.is_number())
      bad("logit_bias", fmt::format("'logit_bias' values must be numbers, got {} for {}", val.type_name(), key));
    const double x = val.get<double>();
    if (!std::isfinite(x) || x < -100 || x > 100)
      bad("logit_bias", fmt::format("'logit_bias' values must be between -100 and 100, got {} for {}", x, key));
    out.emplace_back(static_cast<int32_t>(id), static_cast<float>(x));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  // "5" and "05" name the same token: which bias was meant is unclear.
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i].first == out[i - 1].first)
      bad("logit_bias", fmt::format("token id {} appears more than once in 'logit_bias'", out[i].first));
  return out;
}

// Fields both endpoints share: model, sampling, stop, n, stream.
void parse_common(const json& b, const ProtocolLimits& lim, ParsedRequest& r) {
  if (!b.is_object()) throw ApiError(400, "the request body must be a JSON object", "", "", "invalid_json");
  if (present(b, "model")) {
    if (!b["model"].is_string()) bad("model", "'model' must be a string");
    r.model = b["model"].get<std::string>();
  }
  SamplingParams& s = r.sampling;
  s.temperature = static_cast<float>(get_number(b, "temperature", 0.0, 2.0, 1.0));
  s.top_p = static_cast<float>(get_number(b, "top_p", 0.0, 1.0, 1.0));
  if (present(b, "top_p") && s.top_p <= 0.0f) bad("top_p", "'top_p' must be in (0, 1]");
  s.top_k = get_int(b, "top_k", -1, lim.vocab_size > 0 ? lim.vocab_size : INT32_MAX, 0);
  if (s.top_k < 0) s.top_k = 0;
  s.min_p = static_cast<float>(get_number(b, "min_p", 0.0, 1.0, 0.0));
  s.presence_penalty = static_cast<float>(get_number(b, "presence_penalty", -2.0, 2.0, 0.0));
  s.frequency_penalty = static_cast<float>(get_number(b, "frequency_penalty", -2.0, 2.0, 0.0));
  s.repetition_penalty = static_cast<float>(get_number(b, "repetition_penalty", 0.0, 100.0, 1.0));
  if (present(b, "repetition_penalty") && s.repetition_penalty <= 0.0f)
    bad("repetition_penalty", "'repetition_penalty' must be > 0");
  if (present(b, "seed")) {
    const json& v = b["seed"];
    if (!v.is_number_integer()) bad("seed", fmt::format("'seed' must be an integer, got {}", v.dump()));
    s.seed = v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
  }
  // max_completion_tokens is the newer chat spelling; when both are given it wins, as in OpenAI.
  // max_tokens 0 is for /v1/completions only (with echo: score the prompt), so chat's range starts
  // at 1, unless max_completion_tokens overrides it.
  const int64_t mct = get_int(b, "max_completion_tokens", 1, INT32_MAX, -1);
  const int64_t mt = get_int(b, "max_tokens", r.chat && mct < 0 ? 1 : 0, INT32_MAX, -1);
  s.max_tokens = mct > 0 ? mct : mt;
  s.ignore_eos = get_bool(b, "ignore_eos", false);
  r.skip_special_tokens = get_bool(b, "skip_special_tokens", true);
  if (present(b, "stop")) {
    const json& v = b["stop"];
    if (v.is_string()) {
      s.stop.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      if (static_cast<int64_t>(v.size()) > lim.max_stop)
        bad("stop", fmt::format("'stop' holds at most {} strings, got {}", lim.max_stop, v.size()));
      for (const json& x : v) {
        if (!x.is_string()) bad("stop", "'stop' must be a string or an array of strings");
        s.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or an array of strings");
    }
    for (const auto& x : s.stop)
      if (x.empty()) bad("stop", "'stop' strings must not be empty");
  }
  if (present(b, "stop_token_ids")) {
    if (!b["stop_token_ids"].is_array()) bad("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    s.stop_token_ids = token_ids(b["stop_token_ids"], "stop_token_ids", lim.vocab_size);
  }
  r.n = get_int(b, "n", 1, lim.max_n, 1);
  if (present(b, "best_of") && get_int(b, "best_of", 1, lim.max_n, 1) != r.n)
    bad("best_of", "'best_of' other than n is not supported");
  if (present(b, "logit_bias")) s.logit_bias = parse_logit_bias(b["logit_bias"], lim);
  r.stream = get_bool(b, "stream", false);
  if (present(b, "stream_options")) {
    const json& so = b["stream_options"];
    if (!so.is_object()) bad("stream_options", "'stream_options' must be an object");
    if (!r.stream) bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (present(so, "include_usage")) {
      if (!so["include_usage"].is_boolean()) bad("stream_options.include_usage", "'include_usage' must be a boolean");
      r.include_usage = so["include_usage"].get<bool>();
    }
  }
  if (present(b, "response_format")) {
    const json& rf = b["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
      bad("response_format", "'response_format' must be an object with a 'type'");
    const std::string type = rf["type"].get<std::string>();
    if (type == "json_schema") {
      // OpenAI's shape: {"type":"json_schema","json_schema":{"name":...,"schema":{...},"strict":...}}.
      if (!rf.contains("json_schema") || !rf["json_schema"].is_object() || !rf["json_schema"].contains("schema") ||
          !rf["json_schema"]["schema"].is_object())
        bad("response_format", "response_format 'json_schema' needs 'json_schema.schema', an object");
      r.response_schema = rf["json_schema"]["schema"];
    } else if (type != "text" && type != "json_object") {
      bad("response_format", "response_format 'type' must be text, json_object or json_schema");
    }
    r.response_format = type;
  }
}

// Message content: a string, null, or an array of text parts (joined, as vLLM does for text).
nlohmann::ordered_json flatten_content(const json& c, size_t i) {
  const std::string param = fmt::format("messages[{}].content", i);
  if (c.is_null() || c.is_string()) return c;
  if (!c.is_array()) bad(param, fmt::format("'{}' must be a string or an array of content parts", param));
  std::string text;
  for (const json& part : c) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string())
      bad(param, fmt::format("'{}' parts must be {{\"type\":\"text\",\"text\":...}} (only text is supported)", param));
    text += part["text"].get<std::string>();
  }
  return text;
}

void parse_messages(const json& b, ParsedRequest& r) {
  if (!present(b, "messages")) bad("messages", "'messages' is required");
  const json& ms = b["messages"];
  if (!ms.is_array()) bad("messages", "'messages' must be an array");
  if (ms.empty()) bad("messages", "'messages' must not be empty");
  for (size_t i = 0; i < ms.size(); ++i) {
    const json& m = ms[i];
    const std::string p = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(p, fmt::format("'{}' must be an object", p));
    if (!m.contains("role") || !m["role"].is_string()) bad(p + ".role", fmt::format("'{}.role' must be a string", p));
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool" &&
        role != "function")
      bad(p + ".role", fmt::format("'{}.role' must be system, developer, user, assistant or tool; got '{}'", p, role));
    // Keep every field (tool_calls, tool_call_id, name, ...) in the client's order for the template.
    nlohmann::ordered_json out = nlohmann::ordered_json::parse(m.dump());
    if (m.contains("content")) {
      out["content"] = flatten_content(m["content"], i);
    } else if (role != "assistant") {
      bad(p + ".content", fmt::format("'{}.content' is required", p));
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null() && !m["tool_calls"].is_array())
      bad(p + ".tool_calls", fmt::format("'{}.tool_calls' must be an array", p));
    if (role == "assistant" && !out.contains("content")) out["content"] = nullptr;
    r.messages.push_back(std::move(out));
  }
}

void parse_tools(const json& b, ParsedRequest& r) {
  std::vector<std::string> names;
  if (present(b, "tools")) {
    const json& ts = b["tools"];
    if (!ts.is_array()) bad("tools", "'tools' must be an array");
    for (size_t i = 0; i < ts.size(); ++i) {
      const json& t = ts[i];
      const std::string p = fmt::format("tools[{}]", i);
      if (!t.is_object() || !t.contains("type") || t["type"] != "function")
        bad(p + ".type", fmt::format("'{}.type' must be \"function\"", p));
      if (!t.contains("function") || !t["function"].is_object())
        bad(p + ".function", fmt::format("'{}.function' must be an object", p));
      const json& f = t["function"];
      if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
        bad(p + ".function.name", fmt::format("'{}.function.name' must be a non-empty string", p));
      if (f.contains("parameters") && !f["parameters"].is_object() && !f["parameters"].is_null())
        bad(p + ".function.parameters", fmt::format("'{}.function.parameters' must be an object", p));
      names.push_back(f["name"].get<std::string>());
    }
    if (!ts.empty()) r.tools = nlohmann::ordered_json::parse(ts.dump());
  }
  if (present(b, "tool_choice")) {
    const json& tc = b["tool_choice"];
    if (tc.is_string()) {
      const std::string c = tc.get<std::string>();
      if (c != "none" && c != "auto" && c != "required")
        bad("tool_choice", "'tool_choice' must be none, auto, required or a named function");
      if (c == "none") r.tools = nullptr;  // the model is not told about tools it may not call
      if (c == "required" && names.empty()) bad("tool_choice", "tool_choice 'required' needs 'tools'");
      r.tool_choice = c;
    } else if (tc.is_object()) {
      if (!tc.contains("function") || !tc["function"].is_object() || !tc["function"].contains("name") ||
          !tc["function"]["name"].is_string())
        bad("tool_choice", "'tool_choice' must name a function: {\"type\":\"function\",\"function\":{\"name\":...}}");
      const std::string name = tc["function"]["name"].get<std::string>();
      if (tc.contains("type") && tc["type"] != "function")
        bad("tool_choice", "'tool_choice.type' must be \"function\"");
      if (std::find(names.begin(), names.end(), name) == names.end())
        bad("tool_choice", fmt::format("tool_choice names '{}', which is not in 'tools'", name));
      r.tool_choice = "function";
      r.tool_choice_name = name;
    } else {
      bad("tool_choice", "'tool_choice' must be a string or an object");
    }
  }
}

}  // namespace

json parse_json_body(std::string_view body) {
  // nlohmann parses any depth without recursion, but printing a value back (error messages, the
  // tools and messages handed on) recurses: 60,000 nested arrays in a 120 KB body once overflowed a
  // worker thread's stack and took the whole server down.
  static constexpr int kMaxDepth = 128;
  const auto depth_limit = [](int depth, json::parse_event_t event, json&) {
    // depth counts the containers around this one: the 128th level nested is at 127.
    if (depth >= kMaxDepth && (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start))
      throw ApiError(400, fmt::format("the request body nests deeper than {} levels", kMaxDepth), "", "",
                     "invalid_json");
    return true;
  };
  json j = json::parse(body, depth_limit, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError(400, "the request body is not valid JSON", "", "", "invalid_json");
  return j;
}

ParsedRequest parse_chat_request(const json& b, const ProtocolLimits& lim) {
  ParsedRequest r;
  r.chat = true;
  parse_common(b, lim, r);
  parse_messages(b, r);
  parse_tools(b, r);
  if (r.response_format != "text" && (r.tool_choice == "required" || r.tool_choice == "function"))
    bad("response_format", "a JSON response_format and a forced tool call cannot both constrain the output");
  r.logprobs = get_bool(b, "logprobs", false);
  r.top_logprobs = get_int(b, "top_logprobs", 0, lim.max_logprobs, 0);
  if (present(b, "top_logprobs") && !r.logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
  r.add_generation_prompt = get_bool(b, "add_generation_prompt", true);
  r.continue_final_message = get_bool(b, "continue_final_message", false);
  if (r.add_generation_prompt && r.continue_final_message)
    bad("continue_final_message", "'continue_final_message' and 'add_generation_prompt' cannot both be true");
  if (present(b, "chat_template_kwargs")) {
    if (!b["chat_template_kwargs"].is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    r.chat_template_kwargs = nlohmann::ordered_json::parse(b["chat_template_kwargs"].dump());
  }
  if (present(b, "echo")) bad("echo", "'echo' is a /v1/completions parameter");
  return r;
}

ParsedRequest parse_completion_request(const json& b, const ProtocolLimits& lim) {
  ParsedRequest r;
  parse_common(b, lim, r);
  if (!present(b, "prompt")) bad("prompt", "'prompt' is required");
  const json& p = b["prompt"];
  // The four OpenAI shapes: "text", ["text", ...], [1, 2, 3], [[1, 2], [3]].
  if (p.is_string()) {
    r.prompt_texts.push_back(p.get<std::string>());
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    r.prompt_ids.push_back(token_ids(p, "prompt", lim.vocab_size));
  } else if (p.is_array() && !p.empty()) {
    if (static_cast<int64_t>(p.size()) > lim.max_prompts)
      bad("prompt", fmt::format("'prompt' holds at most {} prompts", lim.max_prompts));
    for (const json& x : p) {
      if (x.is_string() && p[0].is_string())
        r.prompt_texts.push_back(x.get<std::string>());
      else if (x.is_array() && p[0].is_array())
        r.prompt_ids.push_back(token_ids(x, "prompt", lim.vocab_size));
      else
        bad("prompt", "'prompt' must be a string, an array of strings, token ids, or arrays of token ids");
    }
  } else {
    bad("prompt", "'prompt' must be a non-empty string, an array of strings, token ids, or arrays of token ids");
  }
  for (const auto& ids : r.prompt_ids)
    if (ids.empty()) bad("prompt", "a token-id prompt must not be empty");
  r.echo = get_bool(b, "echo", false);
  if (present(b, "logprobs")) {
    r.top_logprobs = get_int(b, "logprobs", 0, lim.max_logprobs, 0);
    r.logprobs = true;
  }
  if (present(b, "suffix")) bad("suffix", "'suffix' is not supported");
  return r;
}

}  // namespace kiln::server
