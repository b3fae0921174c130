// PCRE2 (UTF + UCP, JIT) behind a small interface. Patterns arrive in the dialects of Oniguruma
// (tokenizer.json), Rust fancy-regex (tiktoken) and JavaScript (js-tiktoken); translate_pattern
// rewrites the few constructs PCRE2 reads differently (see regex.cc).
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace kiln::tok {

class Regex {
 public:
  // Throws kiln::Error naming the pattern and PCRE2's message when it does not compile.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Finds the first match at or after `start` in `subject` (valid UTF-8). Returns false when
  // none; otherwise [begin, end) in bytes.
  bool search(std::string_view subject, size_t start, size_t& begin, size_t& end) const;
  const std::string& pattern() const { return source_; }

 private:
  std::string source_;
  void* code_ = nullptr;  // pcre2_code_8*
};

// Rewrites a pattern for PCRE2: `\s`/`\S` become the Unicode White_Space set (Oniguruma's and
// Rust's meaning; PCRE2's UCP \s also admits U+180E), and class intersections `[A&&[B]]` (Rust
// regex, used by Kimi's pattern) become lookahead-guarded classes.
std::string translate_pattern(std::string_view pattern);

// Escapes every regex metacharacter so that `text` matches literally.
std::string regex_escape(std::string_view text);

}  // namespace kiln::tok
