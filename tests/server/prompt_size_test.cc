// A prompt's size judged before work (issue 38): bytes that cannot fit the context are refused
// before templating and tokenization, and tokenization stops once it passes the context.
#include <gtest/gtest.h>

#include <future>

#include "serve_fixture.h"
#include "server/prompt_budget.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server::test {
namespace {

TEST(PromptBudget, BytesPastFourLongestTokensPerPositionCannotFit) {
  const PromptBudget b{100, 8};
  EXPECT_EQ(b.max_prompt_bytes(), 3200u);
  EXPECT_TRUE(b.fits(3200));
  EXPECT_FALSE(b.fits(3201));
  EXPECT_TRUE((PromptBudget{int64_t{1} << 62, 64}.fits(SIZE_MAX)));  // no overflow
}

TEST(PromptBudget, CountsContentEveryTemplateRenders) {
  const auto m = nlohmann::ordered_json::parse(R"([
    {"role":"system","content":"abc"},
    {"role":"user","content":"defg"},
    {"role":"assistant","content":"not counted: reasoning templates drop earlier turns"},
    {"role":"assistant","content":null},
    {"role":"tool","content":"hi"}])");
  EXPECT_EQ(rendered_content_bytes(m), 9u);
}

TEST(PromptBudget, TokenizationStopsPastTheLimit) {
  if (!std::filesystem::exists(tiny_model() / "tokenizer.json")) GTEST_SKIP() << "needs models/kiln-tiny";
  const tok::Tokenizer t = tok::Tokenizer::load(tiny_model().string());
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "word" + std::to_string(i) + " ";
  const auto all = t.encode(text, true);
  ASSERT_GT(all.size(), 20000u);
  const auto capped = t.encode(text, true, false, 100);
  EXPECT_GT(capped.size(), 100u);
  EXPECT_LT(capped.size(), 100u + 64u);  // at most one pre-token's ids past the limit
  EXPECT_TRUE(std::equal(capped.begin(), capped.begin() + 100, all.begin()));
  EXPECT_EQ(t.encode("hello world", true, false, 100), t.encode("hello world", true));
  EXPECT_GE(t.max_token_bytes(), 1u);
}

// Sends one POST with a JSON body on loopback and returns the whole response ("" on failure).
std::string post(int port, const std::string& path, const std::string& body) {
  return http_exchange(port,
                       "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
                           "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                           "\r\n\r\n" + body,
                       120);
}

// 7.5 MB prompts (under the 8 MiB body limit) on a 2,048-token context: each is refused by its
// bytes (the message names them), never tokenized (today's server tokenized each into ~2 M
// tokens, ~150 MB apiece). The peak-memory bound is functional, not a timing: eight such bodies
// held at once cost well under it, eight tokenizations well over.
TEST(PromptSize, OversizedPromptsRefusedBeforeTokenizing) {
  if (!have_tiny_weights()) GTEST_SKIP() << "needs the weights of models/kiln-tiny";
  ServeProcess s({"--max-model-len", "2048"});
  ASSERT_TRUE(s.wait_ready()) << s.log();
  const long before = proc_status(s.pid(), "VmHWM");
  std::string words;
  words.reserve(7'500'000);
  while (words.size() < 7'500'000) words += "lorem ipsum ";
  const std::string completion = R"({"prompt":")" + words + R"(","max_tokens":4})";
  const std::string chat = R"({"messages":[{"role":"user","content":")" + words + R"("}],"max_tokens":4})";
  std::vector<std::future<std::string>> answers;
  for (int i = 0; i < 8; ++i)
    answers.push_back(std::async(std::launch::async, [&, i] {
      return i % 2 ? post(s.port(), "/v1/chat/completions", chat) : post(s.port(), "/v1/completions", completion);
    }));
  for (auto& a : answers) {
    const std::string r = a.get();
    EXPECT_EQ(r.rfind("HTTP/1.1 400", 0), 0u) << r.substr(0, 300);
    EXPECT_NE(r.find("context_length_exceeded"), std::string::npos) << r.substr(0, 600);
    EXPECT_NE(r.find("bytes, more than"), std::string::npos) << r.substr(0, 600);
  }
#ifndef __SANITIZE_ADDRESS__  // ASan's quarantine and redzones keep freed bodies resident: no bound there
  EXPECT_LT(proc_status(s.pid(), "VmHWM") - before, 600L * 1024) << "peak RSS grew past 600 MB";
#else
  (void)before;
#endif
  EXPECT_EQ(http_status(s.port(), "/health"), 200);
}

}  // namespace
}  // namespace kiln::server::test
