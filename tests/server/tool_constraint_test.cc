// Constrained decoding for tool calls: the JSON-schema matcher byte by byte, and the token-level
// constraint driving random logits to a call the output parser reads back, in every format.
#include "server/tool_constraint.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>

#include "server/output_parser.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server {
namespace {

using nlohmann::json;

// Feeds `text`; returns how many bytes were accepted and whether the object was complete.
std::pair<size_t, bool> match(const JsonSchemaGrammar& g, std::string_view text) {
  JsonState s = g.start();
  for (size_t i = 0; i < text.size(); ++i)
    if (!g.feed(s, static_cast<uint8_t>(text[i]))) return {i, false};
  return {text.size(), s.done};
}
bool accepts(const JsonSchemaGrammar& g, std::string_view text) {
  auto [n, done] = match(g, text);
  return n == text.size() && done;
}

const json kWeather = json::parse(R"({"type":"object","properties":{
  "city":{"type":"string","maxLength":8},"days":{"type":"integer"},"unit":{"enum":["c","f"]},
  "hourly":{"type":"boolean"},"tags":{"type":"array","items":{"type":"string","maxLength":3}}},"required":["city"]})");

TEST(JsonGrammar, FollowsTheSchema) {
  const JsonSchemaGrammar g(kWeather);
  EXPECT_TRUE(accepts(g, R"({"city": "Paris", "days": 3})"));
  EXPECT_TRUE(
      accepts(g, "{\n  \"unit\": \"f\",\n  \"city\": \"Nice\", \"tags\": [\"a\", \"b\"], \"hourly\": false\n}"));
  EXPECT_TRUE(accepts(g, R"({"city":"\u00e9t\"e"})"));
  EXPECT_FALSE(accepts(g, R"({"days": 3})"));                 // city is required
  EXPECT_FALSE(accepts(g, R"({"town": "x", "city": "a"})"));  // undeclared key
  EXPECT_FALSE(accepts(g, R"({"city": "Parisienne"})"));      // maxLength 8
  EXPECT_FALSE(accepts(g, R"({"city": 5})"));
  EXPECT_FALSE(accepts(g, R"({"city": "a", "days": 3.5})"));
  EXPECT_FALSE(accepts(g, R"({"city": "a", "unit": "k"})"));
  EXPECT_FALSE(accepts(g, R"({"city": "a",})"));
  EXPECT_FALSE(accepts(g, R"({"city": "a", "city": "b"})"));
  EXPECT_FALSE(accepts(g, R"({"city": "a"} )"));  // nothing after the object
  EXPECT_FALSE(accepts(g, "{\"city\": \"a\x01\"}"));
  EXPECT_FALSE(accepts(g, "{" + std::string(40, ' ') + "\"city\": \"a\"}"));  // whitespace is bounded
  // Where the schema says so, a comma is refused once no key is left.
  const JsonSchemaGrammar one(json::parse(R"({"type":"object","properties":{"a":{"type":"null"}}})"));
  EXPECT_TRUE(accepts(one, R"({"a": null})"));
  EXPECT_EQ(match(one, R"({"a": null,)").first, 10u);
}

TEST(JsonGrammar, AnyJsonWithoutASchema) {
  const JsonSchemaGrammar g(nullptr);
  EXPECT_TRUE(accepts(g, R"({"a": [1, -0.5, 2e10, true, null, {"b": "x\n"}], "": {}})"));
  EXPECT_TRUE(accepts(g, "{}"));
  EXPECT_FALSE(accepts(g, "[1]"));  // arguments are an object
  EXPECT_FALSE(accepts(g, "{a: 1}"));
  EXPECT_FALSE(accepts(g, R"({"a": 01})"));
  EXPECT_FALSE(accepts(g, R"({"a": tru})"));
  EXPECT_FALSE(accepts(g, R"({"a": 1)"));                               // incomplete: accepted so far, not done
  EXPECT_FALSE(accepts(g, "{\"a\": \"\xC3\"}"));                        // a cut UTF-8 character
  EXPECT_FALSE(accepts(g, R"({"a": 12345678901234567890123456789})"));  // numbers are bounded
  EXPECT_FALSE(accepts(g, R"({"a": 1e400})"));                          // and stay finite doubles
  EXPECT_TRUE(accepts(g, R"({"a": -1.5E+12})"));
  std::string deep = "{\"a\":";
  for (int i = 0; i < 30; ++i) deep += "[";
  EXPECT_LT(match(g, deep).first, deep.size());  // nesting is bounded
}

// A toy vocabulary: every byte, some words, and units (markers, end of sequence).
std::shared_ptr<const TokenVocab> toy_vocab(bool marker_units, std::vector<std::string>& units) {
  std::vector<std::string> bytes;
  std::vector<uint8_t> unit;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b)), unit.push_back(0);
  for (const char* w :
       {"{\"", "\":", " \"",         "\",",      "city",       "days",    "unit",  "Paris", "true", "false", "},",
        "\"}", "get", "get_weather", "function", "functions.", "```json", "\n```", ":0",    " 12",  "ab"})
    bytes.emplace_back(w), unit.push_back(0);
  units = {"<eos>"};
  if (marker_units)
    for (ToolFormat f : {ToolFormat::DeepSeekV3, ToolFormat::KimiK2}) {
      const ToolMarkers& m = tool_markers(f);
      for (std::string_view s : {m.section_begin, m.section_end, m.call_begin, m.call_end, m.sep})
        units.emplace_back(s);
    }
  for (const auto& u : units) bytes.push_back(u), unit.push_back(1);
  return std::make_shared<TokenVocab>(std::move(bytes), std::move(unit));
}

// Random logits through the constraint until it ends; the text must parse as one call.
void random_walks(ToolCallStyle style, bool marker_units) {
  std::vector<std::string> units;
  auto vocab = toy_vocab(marker_units, units);
  const int32_t eos = static_cast<int32_t>(vocab->size()) - static_cast<int32_t>(units.size());
  std::vector<ToolSpec> tools = {{"get", json::parse(R"({"type":"object","properties":{"x":{"type":"integer"}},
                                   "required":["x"]})")},
                                 {"get_weather", kWeather}};
  auto g = std::make_shared<ToolCallGrammar>(vocab, style, tools, std::vector<int32_t>{eos});
  const ToolFormat fmt = style == ToolCallStyle::KimiK2 ? ToolFormat::KimiK2 : ToolFormat::DeepSeekV3;
  for (uint32_t seed = 0; seed < 40; ++seed) {
    SCOPED_TRACE(seed);
    ToolCallConstraint c(g);
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    std::string text;
    bool ended = false;
    int used_units = 0;
    for (int step = 0; step < 4000 && !ended; ++step) {
      std::vector<float> logits(vocab->size());
      for (auto& x : logits) x = nd(rng);
      c.mask(logits);
      const auto best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ASSERT_TRUE(std::isfinite(logits[static_cast<size_t>(best)]));
      c.advance(best);
      ASSERT_FALSE(c.state().failed);
      if (best == eos) {
        ended = true;
      } else {
        text += vocab->bytes(best);
      }
      used_units += vocab->is_unit(best) && best != eos;
    }
    ASSERT_TRUE(ended) << text;
    if (marker_units) {
      EXPECT_GE(used_units, 4) << text;  // markers written as their tokens
    }
    OutputParser p(fmt, false, false);
    ParsedDelta d = p.feed(text);
    d.append(p.finish());
    ASSERT_EQ(d.tool_calls.size(), 1u) << text;
    EXPECT_EQ(d.content, "") << text;
    const auto& call = d.tool_calls[0];
    ASSERT_TRUE(call.name == "get" || call.name == "get_weather") << text;
    const json args = json::parse(call.arguments, nullptr, false);
    ASSERT_TRUE(args.is_object()) << call.arguments;
    EXPECT_TRUE(args.contains(call.name == "get" ? "x" : "city")) << call.arguments;
  }
}

TEST(ToolConstraint, DeepSeekV3CallsParseBack) {
  random_walks(ToolCallStyle::DeepSeekV3, false);
  random_walks(ToolCallStyle::DeepSeekV3, true);
}
TEST(ToolConstraint, DeepSeekV31CallsParseBack) {
  random_walks(ToolCallStyle::DeepSeekV31, false);
  random_walks(ToolCallStyle::DeepSeekV31, true);
}
TEST(ToolConstraint, KimiK2CallsParseBack) {
  random_walks(ToolCallStyle::KimiK2, false);
  random_walks(ToolCallStyle::KimiK2, true);
}

// The bytes of the bundled tokenizer's tokens concatenate to the text they encode.
TEST(ToolConstraint, TokenBytesOfARealTokenizer) {
  const auto dir = std::filesystem::path(KILN_TEST_DATA).parent_path().parent_path() / "models" / "kiln-tiny";
  if (!std::filesystem::exists(dir / "tokenizer.json")) GTEST_SKIP() << "needs models/kiln-tiny";
  const tok::Tokenizer t = tok::Tokenizer::load(dir.string());
  const auto eos = static_cast<int32_t>(*t.eos_id());
  auto v = token_vocab(t, {eos});
  EXPECT_TRUE(v->is_unit(eos));
  const std::string text = "Hello, w\xC3\xB6rld! {\"city\": \"Paris\"}\n```json\n\xE2\x96\x81";
  std::string joined;
  for (uint32_t id : t.encode(text, false)) joined += v->bytes(static_cast<int32_t>(id));
  EXPECT_EQ(joined, text);

  // A mask over the real vocabulary in the freest state (inside a JSON string): how long it takes.
  auto g = std::make_shared<ToolCallGrammar>(v, ToolCallStyle::DeepSeekV3,
                                             std::vector<ToolSpec>{{"f", json::parse(R"({"type":"object"})")}},
                                             std::vector<int32_t>{eos});
  ToolCallConstraint c(g);
  for (uint32_t id : t.encode("<\xEF\xBD\x9Ctool\xE2\x96\x81"
                              "calls\xE2\x96\x81"
                              "begin\xEF\xBD\x9C><\xEF\xBD\x9Ctool\xE2\x96\x81"
                              "call\xE2\x96\x81"
                              "begin\xEF\xBD\x9C>function<\xEF\xBD\x9Ctool\xE2\x96\x81"
                              "sep\xEF\xBD\x9C>f\n```json\n{\"k\": \"some",
                              false))
    c.advance(static_cast<int32_t>(id));
  ASSERT_FALSE(c.state().failed);
  std::vector<float> logits(v->size(), 0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  c.mask(logits);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  size_t allowed = 0;
  for (float x : logits) allowed += std::isfinite(x);
  std::printf("mask over %zu tokens inside a string: %zu allowed, %.2f ms\n", v->size(), allowed, ms);
  EXPECT_GT(allowed, v->size() / 2);
  EXPECT_FALSE(std::isfinite(logits[static_cast<size_t>(eos)]));
}

}  // namespace
}  // namespace kiln::server
