// Request validation: accepted shapes map to the right SamplingParams; rejected ones name the
// parameter at fault.
#include <gtest/gtest.h>

#include "server/protocol.h"

namespace kiln::server {
namespace {

using nlohmann::json;

ProtocolLimits limits() {
  ProtocolLimits l;
  l.vocab_size = 1000;
  return l;
}

json chat(json extra = json::object()) {
  json b = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  b.update(extra);
  return b;
}

std::string rejected_param(const json& body, bool is_chat = true) {
  try {
    is_chat ? parse_chat_request(body, limits()) : parse_completion_request(body, limits());
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << e.what();
    return e.param;
  }
  return "<accepted>";
}

TEST(Protocol, ChatMapsSampling) {
  const ParsedRequest r = parse_chat_request(chat({{"temperature", 0.5},
                                                   {"top_p", 0.9},
                                                   {"top_k", 40},
                                                   {"min_p", 0.05},
                                                   {"presence_penalty", 1},
                                                   {"frequency_penalty", -1},
                                                   {"seed", 42},
                                                   {"stop", "END"},
                                                   {"max_completion_tokens", 7},
                                                   {"n", 2},
                                                   {"logprobs", true},
                                                   {"top_logprobs", 3},
                                                   {"stream", true},
                                                   {"stream_options", {{"include_usage", true}}}}),
                                             limits());
  EXPECT_TRUE(r.chat);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_EQ(r.sampling.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.sampling.max_tokens, 7);
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_TRUE(r.stream && r.include_usage);
}

TEST(Protocol, ContentPartsAreJoinedAndToolsKept) {
  const ParsedRequest r = parse_chat_request(
      chat({{"messages",
             {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}},
              {{"role", "assistant"}, {"tool_calls", json::array()}}}},
            {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}}),
      limits());
  EXPECT_EQ(r.messages[0]["content"], "ab");
  EXPECT_TRUE(r.messages[1]["content"].is_null());
  ASSERT_TRUE(r.tools.is_array());
  EXPECT_EQ(r.tools[0]["function"]["name"], "f");
  // tool_choice "none" hides the tools from the template.
  const ParsedRequest none = parse_chat_request(
      chat({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}, {"tool_choice", "none"}}), limits());
  EXPECT_TRUE(none.tools.is_null());
  EXPECT_EQ(none.tool_choice, "none");
  // "required" and a named function are kept for the constraint.
  const json tools = {{{"type", "function"}, {"function", {{"name", "f"}}}}};
  EXPECT_EQ(parse_chat_request(chat({{"tools", tools}, {"tool_choice", "required"}}), limits()).tool_choice,
            "required");
  const ParsedRequest named = parse_chat_request(
      chat({{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}}), limits());
  EXPECT_EQ(named.tool_choice, "function");
  EXPECT_EQ(named.tool_choice_name, "f");
}

TEST(Protocol, CompletionPromptShapes) {
  auto comp = [](json p) {
    return parse_completion_request({{"prompt", p}, {"logprobs", 2}, {"echo", true}}, limits());
  };
  EXPECT_EQ(comp("text").prompt_texts.size(), 1u);
  EXPECT_EQ(comp(json::array({"a", "b"})).prompt_texts.size(), 2u);
  EXPECT_EQ(comp(json::array({1, 2, 3})).prompt_ids[0], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(comp(json::array({json::array({1}), json::array({2, 3})})).prompt_ids.size(), 2u);
  const ParsedRequest r = comp("x");
  EXPECT_TRUE(r.logprobs && r.echo);
  EXPECT_EQ(r.top_logprobs, 2);
  // max_tokens 0 scores the prompt (completions only).
  EXPECT_EQ(
      parse_completion_request({{"prompt", "x"}, {"max_tokens", 0}, {"echo", true}}, limits()).sampling.max_tokens, 0);
}

TEST(Protocol, RejectionsNameTheParameter) {
  EXPECT_EQ(rejected_param(chat({{"temperature", 2.5}})), "temperature");
  EXPECT_EQ(rejected_param(chat({{"top_p", 0}})), "top_p");
  EXPECT_EQ(rejected_param(chat({{"top_k", 1.5}})), "top_k");
  EXPECT_EQ(rejected_param(chat({{"seed", 1.5}})), "seed");
  EXPECT_EQ(rejected_param(chat({{"max_tokens", 0}})), "max_tokens");
  EXPECT_EQ(rejected_param(chat({{"n", 17}})), "n");
  EXPECT_EQ(rejected_param(chat({{"stop", {1}}})), "stop");
  EXPECT_EQ(rejected_param(chat({{"stream_options", json::object()}})), "stream_options");
  EXPECT_EQ(rejected_param(chat({{"top_logprobs", 1}})), "top_logprobs");
  EXPECT_EQ(rejected_param(chat({{"messages", {{{"role", "x"}, {"content", "y"}}}}})), "messages[0].role");
  EXPECT_EQ(rejected_param(chat({{"max_tokens", 18446744073709551615ull}})), "max_tokens");
  EXPECT_EQ(rejected_param({{"prompt", {5000}}}, false), "prompt");
  EXPECT_EQ(rejected_param({{"prompt", json::array()}}, false), "prompt");
  EXPECT_EQ(rejected_param({{"prompt", "x"}, {"logprobs", 21}}, false), "logprobs");
}

// logit_bias: {"id": bias} with ids in the vocabulary and biases in [-100, 100], at most 300 entries;
// accepted ones arrive ascending; two spellings of one id are refused.
TEST(Protocol, LogitBias) {
  const ParsedRequest r = parse_chat_request(chat({{"logit_bias", {{"7", -100}, {"3", 2.5}, {"0", 0}}}}), limits());
  using E = std::pair<int32_t, float>;
  EXPECT_EQ(r.sampling.logit_bias, (std::vector<E>{{0, 0.0f}, {3, 2.5f}, {7, -100.0f}}));
  EXPECT_TRUE(parse_completion_request({{"prompt", "x"}, {"logit_bias", json::object()}}, limits())
                  .sampling.logit_bias.empty());
  for (const json& bad : {json{{"1000", 1}}, json{{"-1", 1}}, json{{"x", 1}}, json{{"1e2", 1}}, json{{"", 1}},
                          json{{"99999999999", 1}}, json{{"5", 100.5}}, json{{"5", -101}}, json{{"5", "1"}},
                          json{{"5", nullptr}}, json::array({5}), json{{"7", 1}, {"007", 2}}}) {
    EXPECT_EQ(rejected_param(chat({{"logit_bias", bad}})), "logit_bias") << bad.dump();
    EXPECT_EQ(rejected_param({{"prompt", "x"}, {"logit_bias", bad}}, false), "logit_bias") << bad.dump();
  }
  json many = json::object();
  for (int i = 0; i < 300; ++i) many[std::to_string(i)] = 1;
  EXPECT_EQ(parse_chat_request(chat({{"logit_bias", many}}), limits()).sampling.logit_bias.size(), 300u);
  many["300"] = 1;
  EXPECT_EQ(rejected_param(chat({{"logit_bias", many}})), "logit_bias");
}

// The message states the range each endpoint accepts: chat rejects 0, completions take it (echo).
TEST(Protocol, MaxTokensErrorStatesTheAcceptedRange) {
  auto message = [](const json& body, bool is_chat) -> std::string {
    try {
      is_chat ? parse_chat_request(body, limits()) : parse_completion_request(body, limits());
    } catch (const ApiError& e) {
      return e.what();
    }
    return "<accepted>";
  };
  for (int bad : {-1, 0})
    EXPECT_NE(message(chat({{"max_tokens", bad}}), true).find("'max_tokens' must be between 1 and 2147483647"),
              std::string::npos)
        << bad;
  EXPECT_NE(message({{"prompt", "x"}, {"max_tokens", -1}}, false).find("'max_tokens' must be between 0 and"),
            std::string::npos);
  // max_completion_tokens wins over max_tokens, and is checked first.
  EXPECT_EQ(parse_chat_request(chat({{"max_tokens", 0}, {"max_completion_tokens", 5}}), limits()).sampling.max_tokens,
            5);
  EXPECT_EQ(rejected_param(chat({{"max_tokens", 0}, {"max_completion_tokens", 0}})), "max_completion_tokens");
}

TEST(Protocol, MalformedJsonIs400) {
  for (const char* s : {"", "{", "nul", "{\"a\":}", "\xff\xfe"}) {
    try {
      parse_json_body(s);
      ADD_FAILURE() << "accepted " << s;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.code, "invalid_json");
    }
  }
  const json body = error_body(ApiError(400, "bad", "temperature"));
  EXPECT_EQ(body["error"]["param"], "temperature");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(body["error"]["code"].is_null());
}

}  // namespace
}  // namespace kiln::server
