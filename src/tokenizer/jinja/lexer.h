// Jinja lexer with the settings transformers renders chat templates with: trim_blocks and
// lstrip_blocks on, keep_trailing_newline off. Whitespace control (`{%-`, `-%}`, `{%+`, `+%}`),
// comments and `{% raw %}` are resolved here, so the parser sees only text and tag contents.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kiln::jinja {

enum class TokType { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  TokType type;
  std::string value;  // text, name, decoded string literal, number spelling or operator
  int line;
};

// Throws kiln::Error ("chat template line N: ...") on malformed input.
std::vector<Token> lex(std::string_view source);

// Python's unicode_escape decoding of a string literal body (what Jinja applies to literals).
std::string unescape_literal(std::string_view body, int line);

}  // namespace kiln::jinja
