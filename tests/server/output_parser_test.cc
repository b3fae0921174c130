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
  const ParsedDelta d = whole(ToolFormat::DeepSeekV3, false, false, text);
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
  // An unterminated call is returned as text rather than lost.
  const std::string cut = "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{";
  const ParsedDelta d = whole(ToolFormat::KimiK2, false, false, cut);
  EXPECT_TRUE(d.tool_calls.empty());
  EXPECT_FALSE(d.content.empty());
}

}  // namespace
}  // namespace kiln::server
