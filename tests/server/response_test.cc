// The logprobs of a response: "bytes" (chat) and text_offset (completions) are the bytes each token
// stands for, so that a character split over byte-level tokens is spelled once, not once per piece
// as U+FFFD.
#include <gtest/gtest.h>

#include <filesystem>

#include "server/job.h"
#include "test_util.h"

namespace kiln::server {
namespace {

using nlohmann::json;

TEST(ResponseLogprobs, BytesAndOffsetsSpellSplitCharacters) {
  const auto dir = kiln::test::repo_root() / "models" / "kiln-tiny";
  if (!std::filesystem::exists(dir / "tokenizer.json")) GTEST_SKIP() << "needs models/kiln-tiny";
  const tok::Tokenizer t = tok::Tokenizer::load(dir.string());
  const auto vocab = token_vocab(t, {});
  const response::TokenText text_of{t, *vocab};
  const std::string text = "h\xC3\xA9llo \xF0\x9F\x98\x80 w\xC3\xB6rld";  // "héllo 😀 wörld"
  OutputChunk c;
  for (uint32_t id : t.encode(text, false)) {
    c.token_ids.push_back(static_cast<int32_t>(id));
    c.logprobs.push_back(-1.0f);
  }

  const json chat = response::chat_logprobs(text_of, c);
  std::string spelled;
  bool split = false;
  for (const json& e : chat["content"]) {
    for (int b : e["bytes"]) spelled += static_cast<char>(b);
    split |= e["token"].get<std::string>().find("\xEF\xBF\xBD") != std::string::npos;
  }
  EXPECT_EQ(spelled, text);
  EXPECT_TRUE(split) << "no token split a character: the check above proves less";

  const size_t from = 7;  // offsets count from the text before (a prompt, an earlier chunk)
  size_t offset = from;   // advanced past the chunk
  const json legacy = response::completion_logprobs(text_of, c, offset);
  const json& off = legacy["text_offset"];
  ASSERT_EQ(off.size(), c.token_ids.size());
  size_t at = from;
  for (size_t i = 0; i < off.size(); ++i) {
    EXPECT_EQ(off[i].get<size_t>(), at) << "token " << i;
    at += vocab->bytes(c.token_ids[i]).size();
  }
  EXPECT_EQ(at, from + text.size());
}

// OpenAI clients know stop, length, tool_calls and content_filter: a request the shutdown deadline
// cut short is reported as "length" (it ended before its own end), never "abort".
TEST(ResponseFinish, CutShortIsLengthNeverAbort) {
  using response::finish_name;
  EXPECT_STREQ(finish_name(FinishReason::Abort, 0), "length");
  EXPECT_STREQ(finish_name(std::nullopt, 0), "length");
  EXPECT_STREQ(finish_name(FinishReason::Stop, 0), "stop");
  EXPECT_STREQ(finish_name(FinishReason::Stop, 1), "tool_calls");
  EXPECT_STREQ(finish_name(FinishReason::Length, 0), "length");
}

}  // namespace
}  // namespace kiln::server
