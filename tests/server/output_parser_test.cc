// Tool-call and reasoning parsing, whole and streamed one byte at a time (the streamed pieces
// must add up to the same result).
#include <gtest/gtest.h>

#include "server/output_parser.h"

namespace kiln::server {
namespace {

const std::string kDsBegin =
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "calls\xE2\x96\x81"
    "begin\xEF\xBD\x9C>";
const std::string kDsEnd =
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "calls\xE2\x96\x81"
    "end\xEF\xBD\x9C>";
const std::string kDsCall =
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "call\xE2\x96\x81"
    "begin\xEF\xBD\x9C>";
const std::string kDsCallEnd =
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "call\xE2\x96\x81"
    "end\xEF\xBD\x9C>";
const std::string kDsSep =
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "sep\xEF\xBD\x9C>";

ParsedDelta whole(ToolFormat f, bool reasoning, bool in_reasoning, const std::string& text) {
  OutputParser p(f, reasoning, in_reasoning);
  ParsedDelta d = p.feed(text);
  d.append(p.finish());
  return d;
}

ParsedDelta bytewise(ToolFormat f, bool reasoning, bool in_reasoning, const std::string& text) {
  OutputParser p(f, reasoning, in_reasoning);
  ParsedDelta d;
  for (char c : text) d.append(p.feed(std::string(1, c)));
  d.append(p.finish());
  return d;
}

void expect_same(const ParsedDelta& a, const ParsedDelta& b) {
  EXPECT_EQ(a.content, b.content);
  EXPECT_EQ(a.reasoning, b.reasoning);
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size());
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name);
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments);
  }
}

TEST(OutputParser, DeepSeekV3ToolCalls) {
  const std::string text = "Let me check." + kDsBegin + kDsCall + "function" + kDsSep + "get_weather\n```json\n" +
                           R"({"city": "Paris"})" + "\n```" + kDsCallEnd + kDsCall + "function" + kDsSep +
                           "get_time\n```json\n{}\n```" + kDsCallEnd + kDsEnd;
  const ParsedDelta d = whole(ToolFormat::DeepSeekV3, false, false, text);
  EXPECT_EQ(d.content, "Let me check.");
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(d.tool_calls[1].name, "get_time");
  EXPECT_EQ(d.tool_calls[1].arguments, "{}");
  EXPECT_EQ(d.tool_calls[0].id.rfind("call_", 0), 0u);
  expect_same(d, bytewise(ToolFormat::DeepSeekV3, false, false, text));
}

TEST(OutputParser, DeepSeekV31ToolCall) {
  const std::string text = kDsBegin + kDsCall + "search" + kDsSep + R"({"q":"x"})" + kDsCallEnd + kDsEnd;
  const ParsedDelta d = whole(ToolFormat::DeepSeekV31, false, false, text);
  expect_same(d, whole(ToolFormat::DeepSeekV3, false, false, text));  // the parser reads either spelling
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "search");
  EXPECT_EQ(d.tool_calls[0].arguments, R"({"q":"x"})");
  EXPECT_EQ(d.content, "");
}

TEST(OutputParser, KimiK2ToolCalls) {
  const std::string text =
      "ok <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
      R"({"city":"Beijing"})"
      "<|tool_call_end|><|tool_call_begin|>functions.lookup:1<|tool_call_argument_begin|>{}<|tool_call_end|>"
      "<|tool_calls_section_end|>";
  const ParsedDelta d = whole(ToolFormat::KimiK2, false, false, text);
  EXPECT_EQ(d.content, "ok ");
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(d.tool_calls[0].id, "functions.get_weather:0");
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].arguments, R"({"city":"Beijing"})");
  EXPECT_EQ(d.tool_calls[1].name, "lookup");
  expect_same(d, bytewise(ToolFormat::KimiK2, false, false, text));
}

TEST(OutputParser, ReasoningSplit) {
  const std::string text = "<think>step 1, step 2</think>The answer is 4.";
  const ParsedDelta d = whole(ToolFormat::None, true, false, text);
  EXPECT_EQ(d.reasoning, "step 1, step 2");
  EXPECT_EQ(d.content, "The answer is 4.");
  expect_same(d, bytewise(ToolFormat::None, true, false, text));
  // The prompt opened the block (DeepSeek-R1 templates): no opening tag in the output.
  const ParsedDelta r1 = bytewise(ToolFormat::None, true, true, "hmm</think>4");
  EXPECT_EQ(r1.reasoning, "hmm");
  EXPECT_EQ(r1.content, "4");
}

TEST(OutputParser, PlainTextAndPartialMarkersPassThrough) {
  const std::string text = "a < b and <|tool is not a marker; <thin";
  expect_same(whole(ToolFormat::KimiK2, true, false, text), {text, "", {}});
  expect_same(bytewise(ToolFormat::KimiK2, true, false, text), {text, "", {}});
  // A call cut off before its name is whole is returned as text rather than lost; one cut off
  // after keeps what its arguments got (a stream has sent them already).
  const std::string head = "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0";
  const ParsedDelta d = whole(ToolFormat::KimiK2, false, false, head);
  EXPECT_TRUE(d.tool_calls.empty());
  EXPECT_EQ(d.content, "<|tool_call_begin|>functions.f:0");
  const std::string cut = head + "<|tool_call_argument_begin|>{\"a\": 1 ";
  const ParsedDelta c = whole(ToolFormat::KimiK2, false, false, cut);
  ASSERT_EQ(c.tool_calls.size(), 1u);
  EXPECT_EQ(c.tool_calls[0].arguments, "{\"a\": 1");
  EXPECT_EQ(c.content, "");
  expect_same(c, bytewise(ToolFormat::KimiK2, false, false, cut));
}

// Arguments stream as they are written: fed a byte at a time, a call's first piece has its id and
// name and no arguments, and its arguments come in many pieces, most of them before the end marker,
// adding up to the whole call's arguments; nothing the format strips is ever sent.
void expect_streamed(ToolFormat f, const std::string& text, const std::string& end_marker, size_t calls) {
  SCOPED_TRACE(text);
  const ParsedDelta w = whole(f, false, false, text);
  ASSERT_EQ(w.tool_calls.size(), calls);
  OutputParser p(f, false, false);
  std::vector<std::string> args(calls);
  std::vector<int> pieces(calls, 0), before_end(calls, 0);
  std::string fed;
  for (size_t i = 0; i <= text.size(); ++i) {
    ParsedDelta d = i < text.size() ? p.feed(text.substr(i, 1)) : p.finish();
    if (i < text.size()) fed += text[i];
    for (const ParsedToolCall& c : d.tool_calls) {
      ASSERT_LT(static_cast<size_t>(c.index), calls);
      const auto k = static_cast<size_t>(c.index);
      if (!c.id.empty()) {
        EXPECT_EQ(pieces[k], 0) << "the head comes first, once";
        EXPECT_EQ(c.name, w.tool_calls[k].name);
        EXPECT_EQ(c.arguments, "");
      } else {
        EXPECT_FALSE(c.arguments.empty());
        args[k] += c.arguments;
        // Every prefix sent is a prefix of the final arguments.
        EXPECT_EQ(w.tool_calls[k].arguments.compare(0, args[k].size(), args[k]), 0) << args[k];
        // Sent before this call's end marker was complete.
        size_t ends = 0;
        for (size_t at = fed.find(end_marker); at != std::string::npos; at = fed.find(end_marker, at + 1)) ++ends;
        if (ends <= k) ++before_end[k];
      }
      ++pieces[k];
    }
  }
  for (size_t k = 0; k < calls; ++k) {
    EXPECT_EQ(args[k], w.tool_calls[k].arguments);
    if (w.tool_calls[k].arguments.size() > 4) {
      EXPECT_GE(before_end[k], 4) << "call " << k << " streamed";
    }
  }
}

TEST(OutputParser, ArgumentsStreamAsWritten) {
  expect_streamed(ToolFormat::DeepSeekV3,
                  "Sure." + kDsBegin + kDsCall + "function" + kDsSep + "get_weather\n```json\n" +
                      R"({"city": "Paris", "note": "a ``` b"})" + "\n```" + kDsCallEnd + kDsCall + "function" + kDsSep +
                      "get_time\n```json\n{\"zone\": \"UTC\"}  \n```\n" + kDsCallEnd + kDsEnd,
                  kDsCallEnd, 2);
  expect_streamed(ToolFormat::DeepSeekV31,
                  kDsBegin + kDsCall + "search" + kDsSep + " {\"q\": \"tail spaces \"} \n" + kDsCallEnd + kDsEnd,
                  kDsCallEnd, 1);
  expect_streamed(ToolFormat::KimiK2,
                  "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
                  "{\"city\":\"Beijing <|tool\"}<|tool_call_end|><|tool_call_begin|>functions.f:1"
                  "<|tool_call_argument_begin|>{\"x\": [1, 2]}<|tool_call_end|><|tool_calls_section_end|>",
                  "<|tool_call_end|>", 2);
}

}  // namespace
}  // namespace kiln::server
