#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <vector>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {

namespace {

constexpr const char* kSpaceSet =
    "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

// Per-thread match data and JIT stack: a Regex is shared between threads, its scratch is not.
struct Scratch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  Scratch() {
    md = pcre2_match_data_create(4, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    // Lookaheads over long whitespace runs need more than the 32 KiB default.
    stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(mctx, nullptr, stack);
    // Bound backtracking so that a hostile pattern (from an untrusted tokenizer.json) fails with an
    // error instead of running for hours; real tokenizer patterns stay far below this.
    pcre2_set_match_limit(mctx, 50'000'000);
    pcre2_set_depth_limit(mctx, 1'000'000);
  }
  ~Scratch() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mctx);
    pcre2_jit_stack_free(stack);
  }
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// Reads one bracket class starting at p[i] == '[' and returns the index just past its ']'.
size_t class_end(std::string_view p, size_t i) {
  size_t j = i + 1;
  if (j < p.size() && p[j] == '^') ++j;
  if (j < p.size() && p[j] == ']') ++j;  // a leading ']' is literal
  while (j < p.size()) {
    char c = p[j];
    if (c == '\\') {
      j += 2;
    } else if (c == '[' && j + 1 < p.size() && p[j + 1] == ':') {
      size_t e = p.find(":]", j + 2);
      j = e == std::string_view::npos ? j + 1 : e + 2;
    } else if (c == '[') {
      j = class_end(p, j);
    } else if (c == ']') {
      return j + 1;
    } else {
      ++j;
    }
  }
  fail("regex pattern has an unterminated character class: {}", std::string(p));
}

// Translates the body of one class (between the brackets), replacing \s by the explicit set.
std::string class_body(std::string_view body) {
  std::string out;
  for (size_t j = 0; j < body.size(); ++j) {
    if (body[j] == '\\' && j + 1 < body.size()) {
      if (body[j + 1] == 's') {
        out += kSpaceSet;
      } else {
        out += body.substr(j, 2);
      }
      ++j;
    } else {
      out += body[j];
    }
  }
  return out;
}

std::string translate_class(std::string_view cls) {
  // cls includes the brackets.
  std::string_view inner = cls.substr(1, cls.size() - 2);
  bool negated = !inner.empty() && inner[0] == '^';
  // Split on top-level "&&".
  std::vector<std::string_view> operands;
  size_t start = 0;
  for (size_t j = 0; j < inner.size();) {
    if (inner[j] == '\\') {
      j += 2;
    } else if (inner[j] == '[') {
      j = class_end(inner, j);
    } else if (inner[j] == '&' && j + 1 < inner.size() && inner[j + 1] == '&') {
      operands.push_back(inner.substr(start, j - start));
      j += 2;
      start = j;
    } else {
      ++j;
    }
  }
  operands.push_back(inner.substr(start));
  auto bracket = [](std::string body) {
    std::string s;
    s.reserve(body.size() + 2);
    s += '[';
    s += body;
    s += ']';
    return s;
  };
  if (operands.size() == 1) return bracket(class_body(inner));
  KILN_CHECK(!negated, "regex pattern: negated class intersections are not supported: {}", std::string(cls));
  auto as_class = [&](std::string_view op) {
    if (op.size() >= 2 && op.front() == '[' && class_end(op, 0) == op.size()) return translate_class(op);
    return bracket(class_body(op));
  };
  std::string out = "(?:";
  for (size_t k = 1; k < operands.size(); ++k) {
    out += "(?=";
    out += as_class(operands[k]);
    out += ')';
  }
  out += as_class(operands[0]);
  out += ')';
  return out;
}

}  // namespace

std::string translate_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  for (size_t i = 0; i < p.size();) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      if (p[i + 1] == 's') {
        out += '[';
        out += kSpaceSet;
        out += ']';
      } else if (p[i + 1] == 'S') {
        out += "[^";
        out += kSpaceSet;
        out += ']';
      } else {
        out += p.substr(i, 2);
      }
      i += 2;
    } else if (c == '[') {
      size_t e = class_end(p, i);
      out += translate_class(p.substr(i, e - i));
      i = e;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

std::string regex_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}-/").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pattern) : source_(pattern) {
  std::string translated = translate_pattern(pattern);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);  // the pattern itself is UTF-checked
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    fail("regex pattern {} does not compile (at offset {}): {}", quote(pattern), static_cast<size_t>(off),
         reinterpret_cast<char*>(msg));
  }
  // JIT is an optimisation: the interpreter gives the same matches if it is unavailable.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

bool Regex::search(std::string_view subject, size_t start, size_t& begin, size_t& end) const {
  Scratch& s = scratch();
  int rc = pcre2_match(static_cast<pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(),
                       start, PCRE2_NO_UTF_CHECK, s.md, s.mctx);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof(msg));
    fail("regex {} failed on a {}-byte input: {}", quote(source_), subject.size(), reinterpret_cast<char*>(msg));
  }
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.md);
  begin = ov[0];
  end = ov[1];
  return true;
}

}  // namespace kiln::tok
