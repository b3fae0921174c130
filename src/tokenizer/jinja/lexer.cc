#include "tokenizer/jinja/lexer.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace kiln::jinja {

namespace {

using tok::is_python_space;
using tok::next_code_point;

// Python's str.rstrip() / re "\s": Unicode whitespace plus U+001C..U+001F.
size_t rstrip_len(std::string_view s) {
  size_t e = s.size();
  while (e > 0) {
    size_t p = e - 1;
    while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
    size_t q = p;
    if (!is_python_space(next_code_point(s, q))) break;
    e = p;
  }
  return e;
}

size_t skip_spaces(std::string_view s, size_t i) {
  while (i < s.size()) {
    size_t q = i;
    if (!is_python_space(next_code_point(s, q))) break;
    i = q;
  }
  return i;
}

bool all_spaces(std::string_view s) {
  return !s.empty() && skip_spaces(s, 0) == s.size();
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t t = find_tag(pos_);
      if (t == std::string::npos) {
        text(std::string_view(src_).substr(pos_));
        advance_to(src_.size());
        break;
      }
      char kind = src_[t + 1];
      char sign = t + 2 < src_.size() && (src_[t + 2] == '-' || src_[t + 2] == '+') ? src_[t + 2] : 0;
      std::string_view before = std::string_view(src_).substr(pos_, t - pos_);
      size_t after_open = t + 2 + (sign ? 1 : 0);
      bool raw = kind == '%' && is_raw_begin(after_open);
      text(strip_before(before, sign, kind != '{'));
      advance_to(after_open);
      if (kind == '#') {
        comment();
      } else if (raw) {
        raw_block();
      } else {
        tag(kind == '{');
      }
    }
    tokens_.push_back({TokType::Eof, "", line_});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(const std::string& msg) const { fail("chat template line {}: {}", line_, msg); }

  size_t find_tag(size_t from) const {
    size_t best = std::string::npos;
    for (const char* open : {"{{", "{%", "{#"}) best = std::min(best, src_.find(open, from));
    return best;
  }

  void advance_to(size_t p) {
    line_ += static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(pos_),
                                         src_.begin() + static_cast<std::ptrdiff_t>(p), '\n'));
    pos_ = p;
  }

  // Text before a tag: `-` strips all trailing whitespace; otherwise lstrip_blocks removes the
  // spaces between the last line start and a block or comment tag.
  std::string_view strip_before(std::string_view text, char sign, bool lstrip_applies) const {
    if (sign == '-') return text.substr(0, rstrip_len(text));
    if (sign == '+' || !lstrip_applies) return text;
    size_t nl = text.rfind('\n');
    size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
    if ((l_pos > 0 || line_starting_) && all_spaces(text.substr(l_pos))) return text.substr(0, l_pos);
    return text;
  }

  void text(std::string_view t) {
    if (!t.empty()) tokens_.push_back({TokType::Text, std::string(t), line_});
  }

  // Consumes an end marker that may start at `p` ("-%}", "+%}", "%}" with the trim_blocks
  // newline, and the same for "}}" and "#}"). Returns false when there is none.
  bool end_marker(size_t p, char close, bool trim_newline) {
    std::string_view s(src_);
    std::string end = std::string(1, close) + "}";
    size_t q;
    if (s.compare(p, 1 + end.size(), "-" + end) == 0) {
      q = skip_spaces(s, p + 1 + end.size());
    } else if (close != '}' && s.compare(p, 1 + end.size(), "+" + end) == 0) {
      q = p + 1 + end.size();
    } else if (s.compare(p, end.size(), end) == 0) {
      q = p + end.size();
      if (trim_newline && q < s.size() && s[q] == '\n') ++q;
    } else {
      return false;
    }
    line_starting_ = q > 0 && s[q - 1] == '\n';
    advance_to(q);
    return true;
  }

  void comment() {
    size_t e = src_.find("#}", pos_);
    if (e == std::string::npos) error("unterminated comment");
    size_t start = e > pos_ && (src_[e - 1] == '-' || src_[e - 1] == '+') ? e - 1 : e;
    advance_to(start);
    end_marker(start, '#', true);
  }

  bool is_raw_begin(size_t p) const {
    std::string_view s(src_);
    p = skip_spaces(s, p);
    if (s.compare(p, 3, "raw") != 0) return false;
    p = skip_spaces(s, p + 3);
    return s.compare(p, 2, "%}") == 0 || s.compare(p, 3, "-%}") == 0;
  }

  void raw_block() {
    std::string_view s(src_);
    size_t p = skip_spaces(s, skip_spaces(s, pos_) + 3);
    if (s[p] == '-') {
      advance_to(skip_spaces(s, p + 3));
    } else {
      advance_to(p + 2);  // Jinja applies no trim_blocks after {% raw %}
    }
    for (size_t from = pos_;;) {
      size_t t = s.find("{%", from);
      if (t == std::string::npos) error("missing {% endraw %}");
      size_t q = t + 2;
      char sign = q < s.size() && (s[q] == '-' || s[q] == '+') ? s[q] : 0;
      if (sign) ++q;
      q = skip_spaces(s, q);
      if (s.compare(q, 6, "endraw") == 0) {
        size_t r = skip_spaces(s, q + 6);
        text(strip_before(s.substr(pos_, t - pos_), sign, true));
        advance_to(r);
        if (!end_marker(r, '%', true)) error("malformed {% endraw %}");
        return;
      }
      from = t + 2;
    }
  }

  void tag(bool variable) {
    tokens_.push_back({variable ? TokType::VarBegin : TokType::BlockBegin, "", line_});
    std::vector<char> balance;
    std::string_view s(src_);
    for (;;) {
      advance_to(skip_spaces(s, pos_));
      if (pos_ >= s.size()) error(variable ? "unterminated {{ ... }}" : "unterminated {% ... %}");
      if (balance.empty() && end_marker(pos_, variable ? '}' : '%', !variable)) {
        tokens_.push_back({variable ? TokType::VarEnd : TokType::BlockEnd, "", line_});
        return;
      }
      expression_token(balance);
    }
  }

  void expression_token(std::vector<char>& balance) {
    std::string_view s(src_);
    char c = s[pos_];
    if (std::isdigit(static_cast<unsigned char>(c))) return number();
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = pos_;
      while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      tokens_.push_back({TokType::Name, std::string(s.substr(pos_, e - pos_)), line_});
      advance_to(e);
      return;
    }
    if (c == '\'' || c == '"') return string_literal(c);
    static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*", "%", "~", "[",
                                "]",  "(",  ")",  "{",  "}",  "<",  ">", "=", ".", ":", "|", ",", ";"};
    for (const char* op : ops) {
      std::string_view o(op);
      if (s.compare(pos_, o.size(), o) != 0) continue;
      if (o == "(" || o == "[" || o == "{") balance.push_back(o[0]);
      if (o == ")" || o == "]" || o == "}") {
        char want = o == ")" ? '(' : o == "]" ? '[' : '{';
        if (balance.empty() || balance.back() != want) error("unexpected '" + std::string(o) + "'");
        balance.pop_back();
      }
      tokens_.push_back({TokType::Op, std::string(o), line_});
      advance_to(pos_ + o.size());
      return;
    }
    error("unexpected character '" + std::string(1, c) + "'");
  }

  void number() {
    std::string_view s(src_);
    size_t e = pos_;
    auto digits = [&] {
      while (e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
    };
    digits();
    bool is_float = false;
    if (e + 1 < s.size() && s[e] == '.' && std::isdigit(static_cast<unsigned char>(s[e + 1]))) {
      ++e;
      digits();
      is_float = true;
    }
    if (e < s.size() && (s[e] == 'e' || s[e] == 'E')) {
      size_t k = e + 1;
      if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
      if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
        e = k;
        digits();
        is_float = true;
      }
    }
    std::string num;
    for (char ch : s.substr(pos_, e - pos_))
      if (ch != '_') num += ch;
    tokens_.push_back({is_float ? TokType::Float : TokType::Int, num, line_});
    advance_to(e);
  }

  void string_literal(char quote) {
    std::string_view s(src_);
    size_t e = pos_ + 1;
    while (e < s.size() && s[e] != quote) e += s[e] == '\\' ? 2 : 1;
    if (e >= s.size()) error("unterminated string literal");
    tokens_.push_back({TokType::String, unescape_literal(s.substr(pos_ + 1, e - pos_ - 1), line_), line_});
    advance_to(e + 1);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string unescape_literal(std::string_view b, int line) {
  std::string out;
  for (size_t i = 0; i < b.size(); ++i) {
    if (b[i] != '\\' || i + 1 >= b.size()) {
      out += b[i];
      continue;
    }
    char c = b[++i];
    switch (c) {
      case '\n': break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x':
      case 'u':
      case 'U': {
        size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        char32_t cp = 0;
        for (size_t k = 1; k <= n; ++k) {
          int h = i + k < b.size() ? hexval(b[i + k]) : -1;
          if (h < 0) fail("chat template line {}: truncated \\{} escape in a string literal", line, c);
          cp = cp * 16 + static_cast<char32_t>(h);
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
          fail("chat template line {}: escape \\{} gives an invalid code point", line, c);
        tok::append_utf8(out, cp);
        i += n;
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          char32_t cp = 0;
          size_t k = 0;
          while (k < 3 && i + k < b.size() && b[i + k] >= '0' && b[i + k] <= '7')
            cp = cp * 8 + static_cast<char32_t>(b[i + k++] - '0');
          tok::append_utf8(out, cp);
          i += k - 1;
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

std::vector<Token> lex(std::string_view source) {
  // Jinja first normalises newlines and drops one trailing newline (keep_trailing_newline=False).
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src)).run();
}

}  // namespace kiln::jinja
