#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>

#include "core/error.h"

namespace kiln::tok {

char32_t next_code_point(std::string_view s, size_t& i) {
  unsigned char b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  int n = utf8_len(b);
  char32_t cp = b & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  size_t end = i + static_cast<size_t>(n);
  if (end > s.size()) end = s.size();
  for (size_t k = i + 1; k < end; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[k]) & 0x3F);
  i = end;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string to_utf8(char32_t cp) {
  std::string s;
  append_utf8(s, cp);
  return s;
}

std::u32string to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) out.push_back(next_code_point(s, i));
  return out;
}

std::string from_u32(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

namespace {

// Length of the well-formed sequence at s[i], or 0 with `bad` = number of bytes forming the
// maximal ill-formed subpart (at least 1). `truncated` is set when the input ended while the
// sequence was still a valid prefix.
int scan_sequence(std::string_view s, size_t i, int& bad, bool& truncated) {
  unsigned char b = static_cast<unsigned char>(s[i]);
  truncated = false;
  if (b < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    bad = 1;
    return 0;
  }
  for (int k = 1; k <= need; ++k) {
    if (i + static_cast<size_t>(k) >= s.size()) {
      bad = k;
      truncated = true;
      return 0;
    }
    unsigned char c = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
    if (c < lo || c > hi) {
      bad = k;
      return 0;
    }
    lo = 0x80;
    hi = 0xBF;
  }
  return need + 1;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    int bad;
    bool truncated;
    int n = scan_sequence(s, i, bad, truncated);
    if (n == 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    int bad;
    bool truncated;
    int n = scan_sequence(s, i, bad, truncated);
    if (n > 0) {
      out.append(s.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
    } else {
      append_utf8(out, kReplacementChar);
      i += static_cast<size_t>(bad);
    }
  }
  return out;
}

std::string quote(std::string_view s, size_t max_bytes) {
  std::string out = "\"";
  std::string_view body = s.substr(0, max_bytes);
  for (size_t i = 0; i < body.size();) {
    int bad;
    bool truncated;
    int n = scan_sequence(body, i, bad, truncated);
    unsigned char c = static_cast<unsigned char>(body[i]);
    if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7F))) {
      static const char* hex = "0123456789abcdef";
      if (c == '\n') {
        out += "\\n";
      } else {
        out += "\\x";
        out += hex[c >> 4];
        out += hex[c & 15];
      }
      ++i;
      continue;
    }
    if (c == '"' || c == '\\') out += '\\';
    out.append(body.substr(i, static_cast<size_t>(n)));
    i += static_cast<size_t>(n);
  }
  out += '"';
  if (s.size() > max_bytes) out += "...";
  return out;
}

size_t complete_utf8_prefix(std::string_view s) {
  // Only the last 3 bytes can belong to an unfinished sequence.
  size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = start; i < s.size(); ++i) {
    unsigned char b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) == 0x80) continue;
    int bad;
    bool truncated;
    if (scan_sequence(s, i, bad, truncated) == 0 && truncated) return i;
  }
  return s.size();
}

bool is_unicode_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_python_space(char32_t c) {
  return is_unicode_whitespace(c) || (c >= 0x1C && c <= 0x1F);
}

bool is_python_linebreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

static utf8proc_category_t category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

bool is_alpha(char32_t c) {
  switch (category(c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: return true;
    default: return false;
  }
}

bool is_digit(char32_t c) {
  auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool is_alphanumeric(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
  return is_alpha(c) || is_digit(c);
}

bool is_word_char(char32_t c) {
  return c == '_' || is_alphanumeric(c);
}

bool is_python_printable(char32_t c) {
  if (c == ' ') return true;
  switch (category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
  }
}

bool is_upper(char32_t c) {
  return category(c) == UTF8PROC_CATEGORY_LU || category(c) == UTF8PROC_CATEGORY_LT;
}
bool is_lower(char32_t c) {
  return category(c) == UTF8PROC_CATEGORY_LL;
}

char32_t to_upper(char32_t c) {
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_lower(char32_t c) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}

std::string upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) append_utf8(out, to_upper(next_code_point(s, i)));
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) append_utf8(out, to_lower(next_code_point(s, i)));
  return out;
}

std::string normalize(std::string_view s, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::NFC: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::NFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::NFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::NFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  // ASCII is invariant under every normal form: skip the library call for it.
  bool ascii = true;
  for (char c : s) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(s);
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &out,
                   static_cast<utf8proc_option_t>(options));
  KILN_CHECK(n >= 0, "unicode normalisation failed: {}", utf8proc_errmsg(n));
  std::string result(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

namespace {

struct ByteTables {
  std::array<char32_t, 256> to_cp{};
  std::array<int16_t, 324> to_byte{};  // code points used stay below 256 + 68
  std::array<std::string, 256> utf8{};
  ByteTables() {
    to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      to_cp[static_cast<size_t>(b)] = cp;
      to_byte[cp] = static_cast<int16_t>(b);
      utf8[static_cast<size_t>(b)] = to_utf8(cp);
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables t;
  return t;
}

}  // namespace

const char32_t* byte_to_unicode_table() {
  return byte_tables().to_cp.data();
}

int unicode_to_byte(char32_t cp) {
  return cp < 324 ? byte_tables().to_byte[cp] : -1;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  const auto& t = byte_tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += t.utf8[b];
  return out;
}

bool byte_level_to_bytes(std::string_view s, std::string& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    int b = unicode_to_byte(next_code_point(s, i));
    if (b < 0) return false;
    out.push_back(static_cast<char>(b));
  }
  return true;
}

}  // namespace kiln::tok
