// The bytes behind every token id, for tool-call constraints (tool_constraint.h).
#include <cctype>

#include "core/log.h"
#include "server/tool_constraint.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server {
namespace {

// GPT-2's byte-level alphabet (bytes_to_unicode), inverted: code point -> byte, -1 if none.
std::vector<int> byte_level_inverse() {
  std::vector<int> inv(324, -1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    inv[static_cast<size_t>(printable ? b : 256 + extra++)] = b;
  }
  return inv;
}

// Decodes UTF-8 `s` into code points; false on malformed input.
bool code_points(const std::string& s, std::vector<uint32_t>& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + static_cast<size_t>(n) > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0x3F);
    out.push_back(cp);
    i += static_cast<size_t>(n);
  }
  return true;
}

bool from_byte_level(const std::string& tok, const std::vector<int>& inv, std::string& out) {
  thread_local std::vector<uint32_t> cps;
  if (!code_points(tok, cps)) return false;
  out.clear();
  for (uint32_t cp : cps) {
    if (cp >= inv.size() || inv[cp] < 0) return false;
    out.push_back(static_cast<char>(inv[cp]));
  }
  return true;
}

}  // namespace

std::shared_ptr<const TokenVocab> token_vocab(const tok::Tokenizer& t, const std::vector<int32_t>& end_ids) {
  const size_t n = t.vocab_size();
  const std::vector<int> inv = byte_level_inverse();
  std::vector<std::string> bytes(n);
  std::vector<uint8_t> unit(n, 0);
  std::vector<uint8_t> byte_level(n, 0);
  size_t byte_level_count = 0, present = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<uint32_t>(i);
    const auto s = t.id_to_token(id);
    if (!s) continue;  // a hole in the ids: never allowed
    ++present;
    if (t.is_special(id)) {
      bytes[i] = *s;
      unit[i] = 1;
    } else if (from_byte_level(*s, inv, bytes[i])) {
      byte_level[i] = 1;
      ++byte_level_count;
    } else {
      bytes[i] = *s;
    }
  }
  // A byte-level vocabulary spells every ordinary token in the alphabet: what does not fit is
  // added markup, kept whole. Otherwise (SentencePiece-style) tokens are text with "▁" spaces.
  const bool is_byte_level = byte_level_count * 10 >= present * 9;
  for (size_t i = 0; i < n; ++i) {
    if (unit[i] || bytes[i].empty()) continue;
    if (is_byte_level) {
      if (!byte_level[i]) unit[i] = 1;
      continue;
    }
    std::string s = *t.id_to_token(static_cast<uint32_t>(i));
    if (s.size() == 6 && s.rfind("<0x", 0) == 0 && s[5] == '>' && std::isxdigit(static_cast<unsigned char>(s[3])) &&
        std::isxdigit(static_cast<unsigned char>(s[4]))) {
      bytes[i] = std::string(1, static_cast<char>(std::stoi(s.substr(3, 2), nullptr, 16)));
      continue;
    }
    std::string out;
    for (size_t k = 0; k < s.size();) {
      if (s.compare(k, 3, "\xE2\x96\x81") == 0) {
        out += ' ';
        k += 3;
      } else {
        out += s[k++];
      }
    }
    bytes[i] = std::move(out);
  }
  for (int32_t id : end_ids)
    if (id >= 0 && static_cast<size_t>(id) < n) unit[static_cast<size_t>(id)] = 1;
  if (!is_byte_level)
    spdlog::warn(
        "the vocabulary is not byte-level: the bytes of tokens (tool-call constraints, logprobs) are approximate");
  return std::make_shared<TokenVocab>(std::move(bytes), std::move(unit));
}

}  // namespace kiln::server
