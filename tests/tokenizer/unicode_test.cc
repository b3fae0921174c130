#include <gtest/gtest.h>

#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {
namespace {

const std::string R = "\xEF\xBF\xBD";  // U+FFFD

TEST(Unicode, SanitizeMatchesPythonReplace) {
  // Expected values from Python: bytes.fromhex(h).decode("utf-8", "replace").
  EXPECT_EQ(sanitize_utf8("\x80"), R);
  EXPECT_EQ(sanitize_utf8("\xE2\x82"), R);
  EXPECT_EQ(sanitize_utf8("\xE0\x80\xAF"), R + R + R);
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), R + R + R);
  EXPECT_EQ(sanitize_utf8("\xF0\x9F\x98"), R);
  EXPECT_EQ(sanitize_utf8("a\xFF"
                          "b"),
            "a" + R + "b");
  EXPECT_EQ(sanitize_utf8("\xC3\x28"), R + "(");
  EXPECT_EQ(sanitize_utf8("\xF4\x90\x80\x80"), R + R + R + R);
  EXPECT_EQ(sanitize_utf8("\xF0\x28\x8C\xBC"), R + "(" + R + R);
  EXPECT_EQ(sanitize_utf8("\xE2\x28\xA1"), R + "(" + R);
  EXPECT_EQ(sanitize_utf8("\xC0\xAF"), R + R);
  EXPECT_EQ(sanitize_utf8("ok \xE2\x82\xAC"), "ok \xE2\x82\xAC");
  EXPECT_TRUE(is_valid_utf8("\xF0\x9F\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xF0\x9F\x98"));
}

TEST(Unicode, CompletePrefixHoldsUnfinishedCharacters) {
  EXPECT_EQ(complete_utf8_prefix("ab\xE2\x82"), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab\xE2\x82\xAC"), 5u);
  EXPECT_EQ(complete_utf8_prefix("a\xFF"), 2u);  // invalid is not "unfinished"
  EXPECT_EQ(complete_utf8_prefix("\xF0\x9F\x98"), 0u);
}

TEST(Unicode, ByteLevelAlphabet) {
  EXPECT_EQ(bytes_to_byte_level(" "), "\xC4\xA0");   // Ġ
  EXPECT_EQ(bytes_to_byte_level("\n"), "\xC4\x8A");  // Ċ
  EXPECT_EQ(bytes_to_byte_level("a!"), "a!");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string back;
  ASSERT_TRUE(byte_level_to_bytes(bytes_to_byte_level(all), back));
  EXPECT_EQ(back, all);
  EXPECT_FALSE(byte_level_to_bytes("\xE4\xB8\xAD", back));  // 中 is not in the alphabet
}

TEST(Unicode, NormalForms) {
  EXPECT_EQ(normalize("e\xCC\x81", NormalForm::NFC), "\xC3\xA9");
  EXPECT_EQ(normalize("\xC3\xA9", NormalForm::NFD), "e\xCC\x81");
  EXPECT_EQ(normalize("\xEF\xBC\xA1", NormalForm::NFKC), "A");   // fullwidth A
  EXPECT_EQ(normalize("\xEF\xAC\x81", NormalForm::NFKD), "fi");  // ligature
}

TEST(Unicode, WhitespaceSets) {
  EXPECT_TRUE(is_unicode_whitespace(0x85));
  EXPECT_TRUE(is_unicode_whitespace(0x3000));
  EXPECT_FALSE(is_unicode_whitespace(0x180E));
  EXPECT_FALSE(is_unicode_whitespace(0xFEFF));
  EXPECT_FALSE(is_unicode_whitespace(0x1C));
  EXPECT_TRUE(is_python_space(0x1C));
}

std::vector<std::string> find_all(const Regex& re, const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0, b, e;
  while (pos < s.size() && re.search(s, pos, b, e)) {
    out.push_back(s.substr(b, e - b));
    pos = e > b ? e : e + 1;
  }
  return out;
}

TEST(Regex, WhitespaceIsUnicodeWhiteSpace) {
  Regex re(R"(\s+|\S+)");
  // U+180E is whitespace to PCRE2's UCP \s but not to Oniguruma or Rust: Kiln follows the latter.
  EXPECT_EQ(find_all(re,
                     "a\xE1\xA0\x8E"
                     "b c"),
            (std::vector<std::string>{"a\xE1\xA0\x8E"
                                      "b",
                                      " ", "c"}));
  EXPECT_EQ(find_all(re, "x\xC2\x85y"), (std::vector<std::string>{"x", "\xC2\x85", "y"}));
}

TEST(Regex, ClassIntersectionFromRustSyntax) {
  EXPECT_EQ(translate_pattern(R"([\p{L}&&[^\p{Han}]]+)"), R"((?:(?=[^\p{Han}])[\p{L}])+)");
  Regex re(R"([\p{Han}]+|[\p{L}&&[^\p{Han}]]+)");
  EXPECT_EQ(find_all(re, "中文English混合"), (std::vector<std::string>{"中文", "English", "混合"}));
}

TEST(Regex, BadPatternNamesItself) {
  try {
    Regex re("(unclosed");
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("(unclosed"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln::tok
