// response_format json_object / json_schema: parsing, the grammar's plain-JSON form under random
// logits (every output one object that follows the schema), and `kiln serve` on the bundled
// model answering 100 seeded json_schema requests with objects that validate.
#include <gtest/gtest.h>

#include <random>

#include "serve_fixture.h"
#include "server/protocol.h"
#include "server/tool_constraint.h"

namespace kiln::server::test {
namespace {

using nlohmann::json;

const json kSchema = json::parse(R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":8},"age":{"type":"integer"},"ok":{"type":"boolean"}},
  "required":["name","age","ok"]})");

TEST(ResponseFormat, Parsing) {
  const auto chat = [](const json& rf) {
    return json{{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"response_format", rf}};
  };
  EXPECT_EQ(parse_chat_request(chat({{"type", "text"}}), {}).response_format, "text");
  EXPECT_EQ(parse_chat_request(chat({{"type", "json_object"}}), {}).response_format, "json_object");
  const ParsedRequest r =
      parse_chat_request(chat({{"type", "json_schema"}, {"json_schema", {{"schema", kSchema}}}}), {});
  EXPECT_EQ(r.response_format, "json_schema");
  EXPECT_EQ(r.response_schema, kSchema);
  for (const json& bad : {json{{"type", "json_schema"}}, json{{"type", "yaml"}}, json{{"type", 3}},
                          json{{"type", "json_schema"}, {"json_schema", {{"schema", "x"}}}}}) {
    try {
      parse_chat_request(chat(bad), {});
      ADD_FAILURE() << bad.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, "response_format") << bad.dump();
    }
  }
  json forced = chat({{"type", "json_object"}});
  forced["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  forced["tool_choice"] = "required";
  EXPECT_THROW(parse_chat_request(forced, {}), ApiError);
  json comp = {{"prompt", "hi"}, {"response_format", {{"type", "json_object"}}}};
  EXPECT_EQ(parse_completion_request(comp, {}).response_format, "json_object");
}

// Random logits through the plain-JSON grammar until it ends: one object that follows the schema.
TEST(ResponseFormat, RandomWalksGiveSchemaValidObjects) {
  std::vector<std::string> bytes;
  std::vector<uint8_t> unit;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b)), unit.push_back(0);
  for (const char* w : {"{\"", "\":", " \"", "\",", "name", "age", "ok", "true", "false", "}", " 12", "ab"})
    bytes.emplace_back(w), unit.push_back(0);
  bytes.emplace_back("<eos>"), unit.push_back(1);
  auto vocab = std::make_shared<TokenVocab>(std::move(bytes), std::move(unit));
  const int32_t eos = static_cast<int32_t>(vocab->size()) - 1;
  auto g = std::make_shared<ToolCallGrammar>(vocab, ToolCallStyle::PlainJson, std::vector<ToolSpec>{{"", kSchema}},
                                             std::vector<int32_t>{eos});
  for (uint32_t seed = 0; seed < 100; ++seed) {
    SCOPED_TRACE(seed);
    ToolCallConstraint c(g);
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    std::string text;
    bool ended = false;
    for (int step = 0; step < 4000 && !ended; ++step) {
      std::vector<float> logits(vocab->size());
      for (auto& x : logits) x = nd(rng);
      c.mask(logits);
      const auto best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      c.advance(best);
      ASSERT_FALSE(c.state().failed);
      if (best == eos)
        ended = true;
      else
        text += vocab->bytes(best);
    }
    ASSERT_TRUE(ended) << text;
    const json j = json::parse(text, nullptr, false);
    ASSERT_TRUE(j.is_object()) << text;
    ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << text;
    size_t chars = 0;  // maxLength counts characters, not bytes
    for (unsigned char ch : j["name"].get<std::string>()) chars += (ch & 0xC0) != 0x80;
    EXPECT_LE(chars, 8u) << text;
    ASSERT_TRUE(j.contains("age") && j["age"].is_number_integer()) << text;
    ASSERT_TRUE(j.contains("ok") && j["ok"].is_boolean()) << text;
    EXPECT_EQ(j.size(), 3u) << text;
  }
}

// The bundled model under json_schema: 100 seeded requests, each answer an object that validates
// (tests/server/e2e.mjs "format").
TEST(ResponseFormat, ServerAnswersValidateAgainstTheSchema) {
  if (!have_tiny_weights()) GTEST_SKIP() << "needs the weights of models/kiln-tiny";
  if (!have_node_openai()) GTEST_SKIP() << "needs node and tests/npm";
  ServeProcess s({"--max-model-len", "2048"});
  ASSERT_TRUE(s.wait_ready()) << s.log();
  const CmdResult r = s.node("format", "--count 100", 480);
  EXPECT_EQ(r.code, 0) << r.out << "\n--- server log ---\n" << s.log();
}

}  // namespace
}  // namespace kiln::server::test
