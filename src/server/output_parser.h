// Splits generated text into what the OpenAI API returns separately: reasoning between think tags
// (`reasoning_content`), tool calls in the model's own markup (`tool_calls`) and the remaining
// content. Works incrementally so streams can use it: text that may be the start of a marker is
// held back until it is known not to be one. A tool call is emitted as soon as its name is known
// (id and name, empty arguments), then its arguments as they are written, in OpenAI's streaming
// form; what a format may still strip (surrounding whitespace, V3's closing fence, the start of
// the end marker) is held back, so the pieces always add up to the arguments of the whole call.
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

// DeepSeekV31 differs from V3 in how calls are written (no "function" head, no JSON fence), which
// the parser reads either way; it matters to what tool-call constraints force.
enum class ToolFormat { None, DeepSeekV3, DeepSeekV31, KimiK2 };
// "none", "deepseek_v3", "deepseek_v31", "kimi_k2" (vLLM's spellings); nullopt for anything else.
std::optional<ToolFormat> parse_tool_format(const std::string& name);

// The markup of a format (DeepSeek's and Kimi's special-token spellings), also what tool-call
// constraints force.
struct ToolMarkers {
  std::string_view section_begin, section_end, call_begin, call_end, sep;
};
const ToolMarkers& tool_markers(ToolFormat f);

const char* tool_format_name(ToolFormat f);

// A tool call, or a piece of one: the first piece of call `index` carries its id and name, later
// pieces (empty id and name) more of its arguments. Whole-text parsing gives one entry per call.
struct ParsedToolCall {
  std::string id, name, arguments;  // arguments: the JSON text the model wrote
  int index = 0;                    // the call's position in the output (0, 1, ...)
};

struct ParsedDelta {
  std::string content, reasoning;
  std::vector<ParsedToolCall> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
  // Appends `d`, joining a continuation piece to the call it continues.
  void append(ParsedDelta&& d);
  void add_call(ParsedToolCall&& c);
};

class OutputParser {
 public:
  // `reasoning`: split out <think>...</think>. `in_reasoning`: the prompt already opened the think
  // block (DeepSeek-R1 templates end the generation prompt with "<think>\n").
  OutputParser(ToolFormat tools, bool reasoning, bool in_reasoning);
  ParsedDelta feed(std::string_view text);
  // Whatever is held back: a call cut off after its name keeps the arguments written so far, one
  // cut off before becomes content.
  ParsedDelta finish();

 private:
  enum class State { Content, Reasoning, Tools };
  void run(bool final, ParsedDelta& out);
  // Tools state, no call open: opens one once its head (through the name) is whole. false: wait.
  bool open_call(ParsedDelta& out);
  // The open call's arguments (buf_ from their start): the part that can no longer change is
  // emitted; at `end` (the end marker's offset, or npos) the call closes.
  void feed_arguments(size_t end, bool final, ParsedDelta& out);
  ToolFormat fmt_;
  bool reasoning_;
  State state_;
  std::string buf_;
  int calls_ = 0;
  bool open_ = false;    // a call's arguments are being read
  bool fenced_ = false;  // ...in V3's "```json ... ```" fence
  size_t sent_ = 0;      // bytes of its arguments already emitted
};

// The OpenAI id for a call: Kimi's own "functions.NAME:IDX", else "call_" + 24 random hex digits.
std::string make_tool_call_id();

}  // namespace kiln::server
