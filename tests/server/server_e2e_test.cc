// `kiln serve` end to end on the CPU: the official openai npm client (tests/server/e2e.mjs), the
// bad-input suite, auth, client disconnects and graceful SIGTERM.
#include <gtest/gtest.h>

#include "serve_fixture.h"

namespace kiln::server::test {
namespace {

#define NEEDS_TINY_AND_NODE()                                                                        \
  do {                                                                                               \
    if (!have_tiny_weights()) GTEST_SKIP() << "needs the weights of models/kiln-tiny";               \
    if (!have_node_openai()) GTEST_SKIP() << "needs node and tests/npm (npm ci --prefix tests/npm)"; \
  } while (0)

// One server for the suites that need no special flags (starting one costs a model load).
class ServeE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!have_tiny_weights() || !have_node_openai()) return;
    // kiln-tiny has no tool markup of its own: calls are written (and forced) in DeepSeek-V3's.
    server_ = new ServeProcess({"--max-model-len", "2048", "--tool-call-parser", "deepseek_v3"});
    ready_ = server_->wait_ready();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    NEEDS_TINY_AND_NODE();
    ASSERT_TRUE(ready_) << server_->log();
  }
  static ServeProcess* server_;
  static bool ready_;
};
ServeProcess* ServeE2E::server_ = nullptr;
bool ServeE2E::ready_ = false;

TEST_F(ServeE2E, OpenAIClient) {
  const CmdResult r = server_->node("e2e");
  EXPECT_EQ(r.code, 0) << r.out << "\n--- server log ---\n" << server_->log();
}

TEST_F(ServeE2E, BadInputs) {
  const CmdResult r = server_->node("bad");
  EXPECT_EQ(r.code, 0) << r.out << "\n--- server log ---\n" << server_->log();
}

TEST_F(ServeE2E, DisconnectsFreeKvBlocks) {
  const CmdResult r = server_->node("disconnect", "--count 100");
  EXPECT_EQ(r.code, 0) << r.out << "\n--- server log ---\n" << server_->log();
}

TEST_F(ServeE2E, NonStreamingDisconnectsFreeKvBlocks) {
  const CmdResult r = server_->node("disconnect", "--count 100 --mode json");
  EXPECT_EQ(r.code, 0) << r.out << "\n--- server log ---\n" << server_->log();
}

// The same tool-call checks with the calls in Kimi K2's markup.
TEST(ServeTools, KimiK2Format) {
  NEEDS_TINY_AND_NODE();
  ServeProcess s({"--tool-call-parser", "kimi_k2"});
  ASSERT_TRUE(s.wait_ready()) << s.log();
  const CmdResult r = s.node("tools");
  EXPECT_EQ(r.code, 0) << r.out << "\n--- server log ---\n" << s.log();
}

// And in DeepSeek-V3.1's (NAME<sep>ARGS, no fence), chosen by the flag.
TEST(ServeTools, DeepSeekV31Format) {
  NEEDS_TINY_AND_NODE();
  ServeProcess s({"--tool-call-parser", "deepseek_v31"});
  ASSERT_TRUE(s.wait_ready()) << s.log();
  const CmdResult r = s.node("tools");
  EXPECT_EQ(r.code, 0) << r.out << "\n--- server log ---\n" << s.log();
}

TEST(ServeAuth, KeyRequiredExceptHealth) {
  NEEDS_TINY_AND_NODE();
  ServeProcess s({"--api-key", "sekrit-test-key"});
  ASSERT_TRUE(s.wait_ready()) << s.log();
  const CmdResult r = s.node("auth", "--api-key sekrit-test-key");
  EXPECT_EQ(r.code, 0) << r.out << "\n--- server log ---\n" << s.log();
  EXPECT_EQ(s.stop(SIGTERM, 30), 0) << s.log();
}

// SIGTERM while a stream runs: the stream finishes ([DONE]), then the process exits 0.
TEST(ServeShutdown, SigtermDrainsInFlightRequests) {
  NEEDS_TINY_AND_NODE();
  ServeProcess s({"--shutdown-timeout", "60"});
  ASSERT_TRUE(s.wait_ready()) << s.log();
  const std::string body = R"({"prompt":"a long story","max_tokens":200,"ignore_eos":true,"stream":true})";
  const std::string out = (fs::temp_directory_path() / ("kiln_sigterm_" + std::to_string(getpid()))).string();
  // The client runs in the background; the signal arrives once its first event was written.
  sh("(timeout 60 /usr/bin/node -e \"fetch('" + s.url() +
     "/v1/completions',{method:'POST',headers:{'Content-Type':'application/json'},body:process.argv[1]})"
     ".then(r=>r.text()).then(t=>require('fs').writeFileSync('" +
     out + "',t)).catch(e=>require('fs').writeFileSync('" + out + "','ERR '+e))\" '" + body + "' >/dev/null 2>&1 &)");
  bool streaming = false;
  for (int i = 0; i < 600 && !streaming; ++i) {
    streaming = http_get(s.port(), "/metrics").find("\nkiln_http_requests_inflight 1\n") != std::string::npos;
    if (!streaming) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(streaming) << s.log();
  const int code = s.stop(SIGTERM, 90);
  EXPECT_EQ(code, 0) << s.log();
  for (int i = 0; i < 100 && !fs::exists(out); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string text = slurp(out);
  EXPECT_NE(text.find("data: [DONE]"), std::string::npos) << text.substr(0, 500) << "\n" << s.log();
  std::error_code ec;
  fs::remove(out, ec);
}

}  // namespace
}  // namespace kiln::server::test
