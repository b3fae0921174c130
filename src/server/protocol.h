// The OpenAI request bodies, validated: JSON in, a ParsedRequest out, or an ApiError naming the
// parameter at fault. Pure functions (no engine, no tokenizer), so the fuzz target can drive them
// with arbitrary bytes.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampling_params.h"
#include "server/api_error.h"

namespace kiln::server {

struct ProtocolLimits {
  int64_t vocab_size = 0;        // token ids in prompts and stop_token_ids must be below this
  int64_t max_n = 16;            // choices per request
  int64_t max_stop = 16;         // stop strings
  int64_t max_logprobs = 20;     // top_logprobs (chat) / logprobs (completions)
  int64_t max_prompts = 64;      // prompts in one /v1/completions request
  int64_t max_logit_bias = 300;  // logit_bias entries (OpenAI's limit)
};

struct ParsedRequest {
  bool chat = false;
  std::string model;  // empty: the served model

  // /v1/chat/completions: messages with content flattened to strings, for the chat template.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null: none (or tool_choice "none")
  // "auto" (the model decides), "none", "required" (some call of `tools`) or "function" (a call
  // of tool_choice_name). The last two are enforced by constrained decoding.
  std::string tool_choice = "auto";
  std::string tool_choice_name;
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  bool add_generation_prompt = true, continue_final_message = false;

  // /v1/completions: one or more prompts, each text or token ids.
  std::vector<std::string> prompt_texts;
  std::vector<std::vector<int32_t>> prompt_ids;
  bool echo = false;

  // response_format: "text", or "json_object" / "json_schema" (constrained decoding: the output is
  // one JSON object, following `response_schema` for json_schema).
  std::string response_format = "text";
  nlohmann::json response_schema;

  SamplingParams sampling;  // max_tokens -1 when the client gave none
  int64_t n = 1;
  bool stream = false, include_usage = false;
  bool skip_special_tokens = true;
  bool logprobs = false;
  int64_t top_logprobs = 0;
};

// Parses `body` as JSON; malformed JSON is a 400 with code "invalid_json".
nlohmann::json parse_json_body(std::string_view body);

ParsedRequest parse_chat_request(const nlohmann::json& body, const ProtocolLimits& lim);
ParsedRequest parse_completion_request(const nlohmann::json& body, const ProtocolLimits& lim);

}  // namespace kiln::server
