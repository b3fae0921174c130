#include "tokenizer/tiktoken.h"

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {

using nlohmann::json;

namespace {

int b64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool b64_decode(std::string_view s, std::string& out) {
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  size_t i = 0;
  for (; i < s.size() && s[i] != '='; ++i) {
    int v = b64_value(s[i]);
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  for (; i < s.size(); ++i)
    if (s[i] != '=') return false;
  return true;
}

}  // namespace

std::vector<std::string> parse_tiktoken_ranks(std::string_view text) {
  std::vector<std::string> ranks;
  size_t line_no = 0;
  std::string bytes;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    size_t sp = line.find(' ');
    KILN_CHECK(sp != std::string_view::npos && sp > 0, "tiktoken.model line {}: expected \"<base64> <rank>\"", line_no);
    KILN_CHECK(b64_decode(line.substr(0, sp), bytes) && !bytes.empty(),
               "tiktoken.model line {}: token is not valid base64", line_no);
    std::string_view num = line.substr(sp + 1);
    uint64_t rank = 0;
    KILN_CHECK(!num.empty() && num.size() <= 9, "tiktoken.model line {}: bad rank", line_no);
    for (char c : num) {
      KILN_CHECK(c >= '0' && c <= '9', "tiktoken.model line {}: rank is not a number", line_no);
      rank = rank * 10 + static_cast<uint64_t>(c - '0');
    }
    KILN_CHECK(rank < (uint64_t{1} << 22), "tiktoken.model line {}: rank {} is out of range", line_no, rank);
    if (rank >= ranks.size()) ranks.resize(rank + 1);
    KILN_CHECK(ranks[rank].empty(), "tiktoken.model line {}: rank {} appears twice", line_no, rank);
    ranks[rank] = bytes;
  }
  KILN_CHECK(!ranks.empty(), "tiktoken.model has no tokens");
  return ranks;
}

const std::string& kimi_k2_pattern() {
  static const std::string p =
      R"([\p{Han}]+)"
      R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
      R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
      R"(|\p{N}{1,3})"
      R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
      R"(|\s*[\r\n]+)"
      R"(|\s+(?!\S))"
      R"(|\s+)";
  return p;
}

Tokenizer Tokenizer::from_tiktoken(std::string_view model_text, const json& config, bool kimi_defaults) {
  try {
    return build_from_tiktoken(model_text, config, kimi_defaults);
  } catch (const nlohmann::json::exception& e) {
    fail("tokenizer_config.json: {}", e.what());
  }
}

Tokenizer Tokenizer::build_from_tiktoken(std::string_view model_text, const json& config, bool kimi_defaults) {
  auto impl = std::make_shared<TokenizerImpl>();
  impl->config = config;
  if (config.is_object()) {
    std::string cls = config.value("tokenizer_class", "");
    std::string auto_map = config.contains("auto_map") ? config["auto_map"].dump() : "";
    kimi_defaults |= auto_map.find("tokenization_kimi") != std::string::npos;
    kimi_defaults |= cls == "TikTokenTokenizer" && !config.contains("pat_str");
  }
  std::vector<std::string> ranks = parse_tiktoken_ranks(model_text);
  size_t num_base = ranks.size();
  std::string pattern;
  if (config.is_object() && config.contains("pat_str")) {
    KILN_CHECK(config["pat_str"].is_string(), "tokenizer_config.json: pat_str must be a string");
    pattern = config["pat_str"].get<std::string>();
  } else {
    KILN_CHECK(kimi_defaults,
               "tiktoken tokenizer: no split pattern (give \"pat_str\" in tokenizer_config.json; Kimi's is "
               "built in and used when the config names tokenization_kimi)");
    pattern = kimi_k2_pattern();
  }
  impl->pre_tokenizer = make_regex_pieces(pattern);
  impl->model = BpeModel::from_tiktoken(std::move(ranks));
  impl->decoder = make_decoder(json{{"type", "ByteLevel"}});
  add_config_added_tokens(*impl);
  if (kimi_defaults) {
    for (size_t id = num_base; id < num_base + kKimiReservedSpecialTokens + 2; ++id) {
      auto uid = static_cast<uint32_t>(id);
      if (impl->added.by_id(uid)) continue;
      impl->added.add({fmt::format("<|reserved_token_{}|>", id), uid, true, false, false, false, false});
    }
  }
  impl->added.build();
  resolve_special_tokens(*impl);
  return Tokenizer(std::move(impl));
}

}  // namespace kiln::tok
