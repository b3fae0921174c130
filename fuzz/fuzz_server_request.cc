// libFuzzer target for the server's request parsing: arbitrary bytes as a request body through
// JSON parsing and both endpoints' validation, and as model output through the tool-call and
// reasoning parser (whole and split at a fuzzer-chosen point, which must agree). Anything but an
// ApiError (or a clean parse) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

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
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  parse_request(in);
  if (size > 0) {
    const size_t split = data[0] % (size + 1);
    const ToolFormat f = data[0] & 1 ? ToolFormat::KimiK2 : ToolFormat::DeepSeekV3;
    parse_output(in, split > size ? size : split, f, data[0] & 2);
  }
  return 0;
}
