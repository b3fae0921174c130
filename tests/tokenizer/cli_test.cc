// The CLI contract (DESIGN.md §8): kiln tokenize / detokenize / chat-template.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>

#include "test_util.h"

namespace kiln {
namespace {

struct Result {
  int rc;
  std::string out;
};

Result run(const std::string& args) {
  std::string cmd = std::string(KILN_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  return {WEXITSTATUS(status), out};
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(test::deepseek_dir() / "tokenizer.json")) GTEST_SKIP() << "run `npm ci` in tests/npm";
    dir_ = test::deepseek_dir().string();
  }
  std::string dir_;
};

TEST_F(Cli, Tokenize) {
  Result r = run("tokenize --tokenizer " + dir_ + " --text 'Hello world' --json");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, "{\"ids\":[0,19923,2058]}\n");
  r = run("tokenize --tokenizer " + dir_ + " --text 'Hello world' --no-special-tokens");
  EXPECT_EQ(r.out, "19923,2058\n");
  std::filesystem::path f = std::filesystem::temp_directory_path() / "kiln_cli_text.txt";
  std::ofstream(f, std::ios::binary) << "Hello world";
  r = run("tokenize --tokenizer " + dir_ + " --text-file " + f.string() + " --json");
  EXPECT_EQ(r.out, "{\"ids\":[0,19923,2058]}\n");
  // A folder opens as a stream that reads nothing: once an empty result and exit 0.
  r = run("tokenize --tokenizer " + dir_ + " --text-file " + std::filesystem::temp_directory_path().string());
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("a folder, not a file"), std::string::npos) << r.out;
}

TEST_F(Cli, Detokenize) {
  Result r = run("detokenize --tokenizer " + dir_ + " --ids 0,19923,2058");
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out,
            "<\xEF\xBD\x9C"
            "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>Hello world");
  r = run("detokenize --tokenizer " + dir_ + " --ids 0,19923,2058 --skip-special-tokens");
  EXPECT_EQ(r.out, "Hello world");
}

TEST_F(Cli, ChatTemplate) {
  std::filesystem::path m = std::filesystem::temp_directory_path() / "kiln_cli_messages.json";
  std::ofstream(m) << R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])";
  Result r = run("chat-template --tokenizer " + dir_ + " --messages " + m.string() + " --add-generation-prompt");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out,
            "<\xEF\xBD\x9C"
            "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>Be brief.<\xEF\xBD\x9CUser\xEF\xBD\x9C>Hi"
            "<\xEF\xBD\x9C"
            "Assistant\xEF\xBD\x9C>");
}

TEST_F(Cli, ErrorsNameTheThingAtFault) {
  Result r = run("detokenize --tokenizer " + dir_ + " --ids 1,x");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("\"x\""), std::string::npos) << r.out;
  r = run("detokenize --tokenizer " + dir_ + " --ids 999999999");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("999999999"), std::string::npos) << r.out;
  r = run("tokenize --tokenizer /nonexistent/dir --text hi");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("/nonexistent/dir"), std::string::npos) << r.out;
  r = run("chat-template --tokenizer " + dir_ + " --messages /nonexistent.json");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("/nonexistent.json"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kiln
