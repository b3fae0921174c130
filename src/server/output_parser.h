// Splits generated text into what the OpenAI API returns separately: reasoning between think tags
// (`reasoning_content`), tool calls in the model's own markup (`tool_calls`) and the remaining
// content. Works incrementally so streams can use it: text that may be the start of a marker is
// held back until it is known not to be one, and a tool call is emitted once its closing marker
// arrives (its arguments in one piece).
//
// Tool-call formats:
//   DeepSeek-V3   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```
//                 <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>  (V3.1 drops "function" and the fence:
//                 <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>)
//   Kimi K2       <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
//                 <|tool_call_argument_begin|>ARGS<|tool_call_end|>...<|tool_calls_section_end|>
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::server {

enum class ToolFormat { None, DeepSeekV3, KimiK2 };
// "none", "deepseek_v3", "kimi_k2"; nullopt for anything else.
std::optional<ToolFormat> parse_tool_format(const std::string& name);

// The markup of a format (DeepSeek's and Kimi's special-token spellings), also what tool-call
// constraints force.
struct ToolMarkers {
  std::string_view section_begin, section_end, call_begin, call_end, sep;
};
const ToolMarkers& tool_markers(ToolFormat f);

struct ParsedToolCall {
  std::string id, name, arguments;  // arguments: the JSON text the model wrote
};

struct ParsedDelta {
  std::string content, reasoning;
  std::vector<ParsedToolCall> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
  void append(ParsedDelta&& d);
};

class OutputParser {
 public:
  // `reasoning`: split out <think>...</think>. `in_reasoning`: the prompt already opened the think
  // block (DeepSeek-R1 templates end the generation prompt with "<think>\n").
  OutputParser(ToolFormat tools, bool reasoning, bool in_reasoning);
  ParsedDelta feed(std::string_view text);
  ParsedDelta finish();  // whatever is held back; an unterminated tool call becomes content

 private:
  enum class State { Content, Reasoning, Tools };
  void run(bool final, ParsedDelta& out);
  bool parse_call(std::string_view call, ParsedToolCall& out);
  ToolFormat fmt_;
  bool reasoning_;
  State state_;
  std::string buf_;
  int calls_ = 0;
};

// The OpenAI id for a call: Kimi's own "functions.NAME:IDX", else "call_" + 24 random hex digits.
std::string make_tool_call_id();

}  // namespace kiln::server
