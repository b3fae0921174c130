// libFuzzer target for the server's request parsing: arbitrary bytes as a request body through
// JSON parsing and both endpoints' validation, and as model output through the tool-call and
// reasoning parser (whole and split at a fuzzer-chosen point, which must agree), and through the
// tool-call argument grammar (json_grammar.h) under the schema the input carries as
// "parameters", if any: text the grammar accepts as a complete object must be valid JSON.
// Anything but an ApiError (or a clean parse) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "server/json_grammar.h"
#include "server/output_parser.h"
#include "server/protocol.h"

using namespace kiln::server;

namespace {

void parse_request(std::string_view body) {
  ProtocolLimits lim;
  lim.vocab_size = 8192;
  try {
    const nlohmann::json j = parse_json_body(body);
    try {
      parse_chat_request(j, lim);
    } catch (const ApiError&) {
    }
    try {
      parse_completion_request(j, lim);
    } catch (const ApiError&) {
    }
  } catch (const ApiError&) {
  }
}

void parse_output(std::string_view text, size_t split, ToolFormat f, bool reasoning) {
  OutputParser whole(f, reasoning, false), parts(f, reasoning, false);
  ParsedDelta a = whole.feed(text);
  a.append(whole.finish());
  ParsedDelta b = parts.feed(text.substr(0, split));
  b.append(parts.feed(text.substr(split)));
  b.append(parts.finish());
  if (a.content != b.content || a.reasoning != b.reasoning || a.tool_calls.size() != b.tool_calls.size())
    __builtin_trap();
  // Streamed argument pieces add up to the whole call's arguments.
  for (size_t i = 0; i < a.tool_calls.size(); ++i)
    if (a.tool_calls[i].name != b.tool_calls[i].name || a.tool_calls[i].arguments != b.tool_calls[i].arguments ||
        a.tool_calls[i].index != b.tool_calls[i].index)
      __builtin_trap();
}

void match_arguments(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  const JsonSchemaGrammar g(j.is_object() && j.contains("parameters") ? j["parameters"] : nlohmann::json());
  JsonState s = g.start();
  for (char c : text)
    if (!g.feed(s, static_cast<uint8_t>(c))) return;
  if (s.done && !nlohmann::json::accept(text)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  parse_request(in);
  match_arguments(in);
  if (size > 0) {
    const size_t split = data[0] % (size + 1);
    const ToolFormat f = data[0] & 1 ? ToolFormat::KimiK2 : ToolFormat::DeepSeekV3;
    parse_output(in, split > size ? size : split, f, data[0] & 2);
  }
  return 0;
}
