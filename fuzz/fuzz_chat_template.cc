// Chat templates can come with a checkpoint or a request: parsing and rendering any input must
// either produce text or throw kiln::Error, within the engine's step and size limits. Input is a
// template, optionally followed by "\0" and a JSON list of messages.
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  kiln::tok::ChatRequest req;
  size_t zero = in.find('\0');
  std::string_view tmpl = in.substr(0, zero);
  req.messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "Hi \u00e9 \ud83d\ude00", "name": "u"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "r"}]},
    {"role": "assistant", "content": "ok", "reasoning_content": "think"}])");
  req.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "default": 1.5}}}}}])");
  if (zero != std::string_view::npos) {
    auto m = nlohmann::ordered_json::parse(in.substr(zero + 1), nullptr, false);
    if (!m.is_discarded() && m.is_array()) req.messages = m;
  }
  req.add_generation_prompt = size % 2 == 0;
  try {
    kiln::tok::ChatTemplate t{std::string(tmpl), nlohmann::ordered_json{{"bos_token", "<s>"}, {"eos_token", "</s>"}}};
    t.render(req);
  } catch (const kiln::Error&) {
  }
  return 0;
}
