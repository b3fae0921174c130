// UTF-8 and Unicode helpers shared by the tokenizer and the template engine. Text is UTF-8 in
// std::string everywhere; these helpers give the few code-point views we need (Python's and
// Rust's notions of whitespace, lossy repair of invalid input, the GPT-2 byte alphabet).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tok {

constexpr char32_t kReplacementChar = 0xFFFD;

// Decodes the code point at s[i] (s must be valid UTF-8) and advances i.
char32_t next_code_point(std::string_view s, size_t& i);
// Length in bytes of the UTF-8 sequence introduced by lead byte b (1 for invalid leads).
inline int utf8_len(unsigned char b) {
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}
void append_utf8(std::string& out, char32_t cp);
std::string to_utf8(char32_t cp);
std::u32string to_u32(std::string_view s);
std::string from_u32(std::u32string_view s);
size_t count_code_points(std::string_view s);

// True when s is well-formed UTF-8 (no overlongs, surrogates or values past U+10FFFF).
bool is_valid_utf8(std::string_view s);
// Replaces every ill-formed subsequence with U+FFFD using the "maximal subpart" rule (the one
// Python's errors="replace", Rust's from_utf8_lossy and WHATWG TextDecoder share).
std::string sanitize_utf8(std::string_view s);
// s in double quotes for error messages: control characters and invalid bytes escaped, long
// strings cut (fmt's {:?} asserts on invalid UTF-8, and messages must never fail to format).
std::string quote(std::string_view s, size_t max_bytes = 200);
// Length of the longest prefix of s that ends on a complete code point, treating an incomplete
// but so far valid sequence at the end as "not yet complete" (used by streaming).
size_t complete_utf8_prefix(std::string_view s);

// Character classes. Rust's char::is_whitespace is the Unicode White_Space property; Python's
// str.isspace adds U+001C..U+001F. Word characters follow Rust's is_alphanumeric (+ '_').
bool is_unicode_whitespace(char32_t c);
bool is_python_space(char32_t c);
bool is_alphanumeric(char32_t c);
bool is_word_char(char32_t c);
bool is_python_printable(char32_t c);
bool is_python_linebreak(char32_t c);
bool is_alpha(char32_t c);
bool is_digit(char32_t c);
bool is_upper(char32_t c);
bool is_lower(char32_t c);
char32_t to_upper(char32_t c);
char32_t to_lower(char32_t c);
std::string upper(std::string_view s);
std::string lower(std::string_view s);

enum class NormalForm { NFC, NFD, NFKC, NFKD };
std::string normalize(std::string_view s, NormalForm form);

// GPT-2's reversible byte <-> printable code point table (bytes_to_unicode).
const char32_t* byte_to_unicode_table();
// Returns -1 when cp is not one of the 256 byte-level code points.
int unicode_to_byte(char32_t cp);
std::string bytes_to_byte_level(std::string_view bytes);
// Maps a byte-level string back to bytes; false when a code point is outside the alphabet.
bool byte_level_to_bytes(std::string_view s, std::string& out);

}  // namespace kiln::tok
