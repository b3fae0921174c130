// tiktoken files: cl100k_base and o200k_base rank files (converted at test time from the js-tiktoken
// npm package into the tiktoken.model text format) against ids from js-tiktoken
// (tests/data/tokenizer/tiktoken_refs.json, made by tests/tokenizer/make_tiktoken_refs.mjs).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tiktoken.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Writes DIR/tiktoken.model and DIR/tokenizer_config.json from js-tiktoken's compressed ranks
// (lines "<key> <first rank> <base64 token> <base64 token> ..."). Returns false when missing.
bool make_tiktoken_dir(const std::string& name, const fs::path& dir) {
  fs::path src = test::npm_dir() / "js-tiktoken" / "dist" / "ranks" / fmt::format("{}.js", name);
  if (!fs::exists(src)) return false;
  std::string js = test::read_file(src);
  size_t b = js.find('{'), e = js.rfind('}');
  json ranks = json::parse(js.substr(b, e - b + 1));
  std::string model;
  std::istringstream lines(ranks["bpe_ranks"].get<std::string>());
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string key, tok;
    long rank;
    if (!(words >> key >> rank)) continue;
    while (words >> tok) model += fmt::format("{} {}\n", tok, rank++);
  }
  fs::create_directories(dir);
  std::ofstream(dir / "tiktoken.model", std::ios::binary) << model;
  json cfg = {{"pat_str", ranks["pat_str"]}, {"added_tokens_decoder", json::object()}};
  for (auto it = ranks["special_tokens"].begin(); it != ranks["special_tokens"].end(); ++it)
    cfg["added_tokens_decoder"][std::to_string(it.value().get<int>())] = {{"content", it.key()}, {"special", true}};
  cfg["eos_token"] = "<|endoftext|>";
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
  return true;
}

// JavaScript's \s includes U+FEFF and excludes U+0085; tiktoken (Rust) and Kiln use Unicode
// White_Space, which is the reverse. Strings holding either are not comparable with js-tiktoken.
bool js_whitespace_differs(const std::string& s) {
  return s.find("\xEF\xBB\xBF") != std::string::npos || s.find("\xC2\x85") != std::string::npos;
}

class TiktokenRefs : public ::testing::TestWithParam<std::string> {};

TEST_P(TiktokenRefs, MatchesJsTiktoken) {
  fs::path dir = fs::temp_directory_path() / fmt::format("kiln_tiktoken_{}", GetParam());
  if (!make_tiktoken_dir(GetParam(), dir)) GTEST_SKIP() << "js-tiktoken missing: run `npm ci` in tests/npm";
  Tokenizer t = Tokenizer::load(dir.string());
  json refs = json::parse(test::read_file(test::data_dir() / "tiktoken_refs.json"));
  json corpus = json::parse(test::read_file(test::data_dir() / "corpus.json"));
  const json& cases = refs["encodings"][GetParam()]["cases"];
  ASSERT_EQ(cases.size(), corpus.size());
  size_t bad = 0, skipped = 0;
  for (size_t k = 0; k < corpus.size(); ++k) {
    std::string input = test::corpus_bytes(corpus[k]);
    if (js_whitespace_differs(sanitize_utf8(input))) {
      ++skipped;
      continue;
    }
    std::vector<uint32_t> want = cases[k].get<std::vector<uint32_t>>();
    std::vector<uint32_t> got = t.encode(input, false);
    if (got != want && ++bad <= 10)
      ADD_FAILURE() << GetParam() << " ids differ for corpus[" << k << "] \"" << test::printable(sanitize_utf8(input))
                    << "\"\n  want " << json(want).dump() << "\n  got  " << json(got).dump();
    EXPECT_EQ(t.decode(got), sanitize_utf8(input)) << "round trip of corpus[" << k << "]";
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_LE(skipped, 3u);
  EXPECT_EQ(t.eos_id(), t.token_to_id("<|endoftext|>"));
  EXPECT_TRUE(t.is_special(*t.eos_id()));
}

INSTANTIATE_TEST_SUITE_P(Encodings, TiktokenRefs, ::testing::Values("cl100k_base", "o200k_base"));

TEST(Tiktoken, ParseErrorsNameTheLine) {
  try {
    parse_tiktoken_ranks("IQ== 0\nnot*base64 1\n");
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_tiktoken_ranks("IQ== 0\nIg== 0\n"), std::exception);  // rank twice
  EXPECT_THROW(parse_tiktoken_ranks(""), std::exception);
  EXPECT_THROW(Tokenizer::from_tiktoken("IQ== 0\n", json::object()), std::exception);  // no pattern
  // Fuzzer finding, kept as a regression: a split pattern that is not valid UTF-8 is an error.
  EXPECT_THROW(Tokenizer::from_tiktoken("IQ== 0\n", json{{"pat_str", "[\xFF\xFF]+"}}), kiln::Error);
  EXPECT_THROW(parse_tiktoken_ranks("IQ== 99999999\n"), kiln::Error);  // rank past the id limit
  // A rank file without a token for every byte would drop those bytes from text silently.
  try {
    Tokenizer::from_tiktoken("IQ== 0\n", json{{"pat_str", "\\S+"}});
    FAIL();
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no token for the byte 0x00"), std::string::npos) << e.what();
  }
}

TEST(Tiktoken, KimiPatternSplitsHanRuns) {
  auto p = make_regex_pieces(kimi_k2_pattern());
  auto split = [&](const std::string& s) {
    PieceArena arena;
    std::vector<Piece> out;
    p->split({s, true}, arena, out);
    std::vector<std::string> v;
    for (const auto& x : out) v.emplace_back(x.text);
    return v;
  };
  EXPECT_EQ(split("中文English混合"), (std::vector<std::string>{"中文", "English", "混合"}));
  EXPECT_EQ(split("北京市 Pascal"), (std::vector<std::string>{"北京市", " Pascal"}));
  EXPECT_EQ(split("I'm HTTPServer 12345"), (std::vector<std::string>{"I'm", " HTTPServer", " ", "123", "45"}));
}

TEST(Tiktoken, KimiDefaultsReserveSpecialIds) {
  // A toy rank file with Kimi's conventions: 256 byte tokens, then the reserved special block.
  std::string model;
  static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int b = 0; b < 256; ++b) {
    std::string enc = {b64[b >> 2], b64[(b & 3) << 4], '=', '='};
    model += fmt::format("{} {}\n", enc, b);
  }
  json cfg = {{"tokenizer_class", "TikTokenTokenizer"},
              {"auto_map", {{"AutoTokenizer", {"tokenization_kimi.TikTokenTokenizer", nullptr}}}},
              {"bos_token", "[BOS]"},
              {"eos_token", "[EOS]"},
              {"added_tokens_decoder",
               {{"256", {{"content", "[BOS]"}, {"special", true}}},
                {"257", {{"content", "[EOS]"}, {"special", true}}},
                {"258", {{"content", "<|im_end|>"}, {"special", true}}}}}};
  Tokenizer t = Tokenizer::from_tiktoken(model, cfg);
  EXPECT_EQ(t.bos_id(), 256u);
  EXPECT_EQ(t.eos_id(), 257u);
  EXPECT_EQ(t.token_to_id("<|reserved_token_300|>"), 300u);
  EXPECT_EQ(t.vocab_size(), 256u + 258u);
  std::vector<uint32_t> ids = t.encode("ab<|im_end|>c", false);
  EXPECT_EQ(ids, (std::vector<uint32_t>{'a', 'b', 258, 'c'}));
  EXPECT_EQ(t.decode(ids), "ab<|im_end|>c");
  EXPECT_EQ(t.decode(ids, true), "abc");
}

}  // namespace
}  // namespace kiln::tok
