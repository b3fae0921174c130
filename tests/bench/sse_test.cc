// bench/sse.h: SSE framing under every split of the bytes, and which chunks are token events.
#include <gtest/gtest.h>

#include "bench/sse.h"

namespace kiln::bench {
namespace {

std::vector<std::string> parse_all(const std::vector<std::string>& pieces) {
  SseParser p;
  std::vector<std::string> ev;
  for (const auto& s : pieces) p.feed(s, ev);
  return ev;
}

TEST(BenchSse, EveryByteSplitGivesTheSameEvents) {
  const std::string stream =
      ": keep-alive comment\n\n"
      "data: {\"a\":1}\n\n"
      "event: message\r\ndata: {\"b\":2}\r\n\r\n"
      "data:no-space\rdata: second line\r\r"
      "id: 7\ndata: [DONE]\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", "{\"b\":2}", "no-space\nsecond line", "[DONE]"};
  EXPECT_EQ(parse_all({stream}), want);
  for (size_t i = 0; i <= stream.size(); ++i)
    for (size_t j = i; j <= stream.size(); j += 7) {
      SCOPED_TRACE(testing::Message() << "split at " << i << ", " << j);
      EXPECT_EQ(parse_all({stream.substr(0, i), stream.substr(i, j - i), stream.substr(j)}), want);
    }
  // One byte at a time.
  std::vector<std::string> bytes;
  for (char c : stream) bytes.emplace_back(1, c);
  EXPECT_EQ(parse_all(bytes), want);
  // An unfinished event is not delivered.
  EXPECT_TRUE(parse_all({"data: {\"a\":1}\n"}).empty());
}

TEST(BenchSse, CompletionChunksAreTokenEvents) {
  StreamState s;
  apply_event(R"({"choices":[{"index":0,"text":"Hello","finish_reason":null}]})", 10, s);
  apply_event(R"({"choices":[{"index":0,"text":"","finish_reason":null}]})", 20, s);  // a token decoding to ""
  apply_event(R"({"choices":[{"index":0,"text":" world","finish_reason":"length"}]})", 30, s);
  apply_event(R"({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}})", 31, s);
  apply_event("[DONE]", 32, s);
  EXPECT_EQ(s.event_ms, (std::vector<double>{10, 20, 30}));
  EXPECT_EQ(s.text, "Hello world");
  EXPECT_EQ(s.usage_prompt_tokens, 5);
  EXPECT_EQ(s.usage_completion_tokens, 3);
  EXPECT_EQ(s.finish_reason, "length");
  EXPECT_TRUE(s.done);
  EXPECT_TRUE(s.error.empty());
}

TEST(BenchSse, ChatRoleOnlyAndClosingChunksAreNotTokens) {
  StreamState s;
  apply_event(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})", 5, s);
  apply_event(R"({"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]})", 6, s);
  apply_event(R"({"choices":[{"index":0,"delta":{"reasoning_content":"hmm"},"finish_reason":null}]})", 7, s);
  apply_event(R"({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})", 8, s);
  EXPECT_EQ(s.event_ms, (std::vector<double>{6, 7}));
  EXPECT_EQ(s.text, "Hihmm");
  EXPECT_EQ(s.finish_reason, "stop");
  EXPECT_EQ(s.usage_completion_tokens, -1);
}

TEST(BenchSse, ErrorsAreKept) {
  StreamState s;
  apply_event(R"({"error":{"message":"overloaded","code":503}})", 1, s);
  EXPECT_NE(s.error.find("overloaded"), std::string::npos);
  StreamState m;
  apply_event("{not json", 1, m);
  EXPECT_EQ(m.error.rfind("malformed", 0), 0u);
  StreamState n;
  apply_event(R"({"error":null,"choices":[{"text":"x"}]})", 1, n);  // a null error is no error
  EXPECT_TRUE(n.error.empty());
  EXPECT_EQ(n.event_ms.size(), 1u);
}

}  // namespace
}  // namespace kiln::bench
