// Unit tests of the tokenizer.json building blocks, with expectations taken from Hugging Face's
// documented behaviour, and a small Llama-2-style (Metaspace + byte fallback) tokenizer end to end.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace kiln::tok {
namespace {

using nlohmann::json;
using Strings = std::vector<std::string>;

Strings pre(const json& j, const std::string& text, bool at_start = true, bool byte_mode = false) {
  auto p = make_pre_tokenizer(j, byte_mode);
  PieceArena arena;
  std::vector<Piece> out;
  p->split({text, at_start}, arena, out);
  Strings s;
  for (const Piece& x : out) s.emplace_back(x.text);
  return s;
}

TEST(PreTokenizer, SplitBehaviors) {
  auto split = [](const char* behavior) {
    return json{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}};
  };
  const std::string t = "the-final--countdown";
  EXPECT_EQ(pre(split("Removed"), t), (Strings{"the", "final", "countdown"}));
  EXPECT_EQ(pre(split("Isolated"), t), (Strings{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pre(split("MergedWithPrevious"), t), (Strings{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pre(split("MergedWithNext"), t), (Strings{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pre(split("Contiguous"), t), (Strings{"the", "-", "final", "--", "countdown"}));
  json inv = split("Removed");
  inv["invert"] = true;
  EXPECT_EQ(pre(inv, t), (Strings{"-", "-", "-"}));
}

TEST(PreTokenizer, RegexSplitAndSequence) {
  json seq = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}"}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}, {"invert", false}}}}};
  EXPECT_EQ(pre(seq, "abc 12345 de"), (Strings{"abc", "123", "45", "de"}));
}

TEST(PreTokenizer, Digits) {
  EXPECT_EQ(pre({{"type", "Digits"}, {"individual_digits", true}}, "Call 123 please"),
            (Strings{"Call ", "1", "2", "3", " please"}));
  EXPECT_EQ(pre({{"type", "Digits"}, {"individual_digits", false}}, "Call 123 please"),
            (Strings{"Call ", "123", " please"}));
}

TEST(PreTokenizer, Metaspace) {
  json m = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}, {"split", true}};
  EXPECT_EQ(pre(m, "Hey friend!"), (Strings{"\xE2\x96\x81Hey",
                                            "\xE2\x96\x81"
                                            "friend!"}));
  m["prepend_scheme"] = "first";
  EXPECT_EQ(pre(m, "Hey", /*at_start=*/false), (Strings{"Hey"}));
  EXPECT_EQ(pre(m, "Hey", /*at_start=*/true), (Strings{"\xE2\x96\x81Hey"}));
  m["split"] = false;
  EXPECT_EQ(pre(m, "a b"), (Strings{"\xE2\x96\x81"
                                    "a\xE2\x96\x81"
                                    "b"}));
}

TEST(PreTokenizer, ByteLevel) {
  json b = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  EXPECT_EQ(pre(b, "Hello my friend"), (Strings{"Hello", "\xC4\xA0my",
                                                "\xC4\xA0"
                                                "friend"}));
  EXPECT_EQ(pre(b, "Hello my friend", true, /*byte_mode=*/true), (Strings{"Hello", " my", " friend"}));
  b["add_prefix_space"] = true;
  EXPECT_EQ(pre(b, "Hi", true, true), (Strings{" Hi"}));
}

TEST(PreTokenizer, UnsupportedTypeIsNamed) {
  try {
    make_pre_tokenizer({{"type", "UnicodeScripts"}}, false);
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("UnicodeScripts"), std::string::npos);
  }
}

std::string norm(const json& j, std::string s) {
  make_normalizer(j)->apply(s);
  return s;
}

TEST(Normalizer, Types) {
  EXPECT_EQ(norm({{"type", "NFKC"}}, "\xEF\xBC\xA8i"), "Hi");
  EXPECT_EQ(norm({{"type", "Lowercase"}}, "\xC3\x89T\xC3\x89"), "\xC3\xA9t\xC3\xA9");
  EXPECT_EQ(norm({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}, "a b"),
            "a\xE2\x96\x81"
            "b");
  EXPECT_EQ(norm({{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}}, "a    b  c"), "a b c");
  EXPECT_EQ(norm({{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}}, "x"), "\xE2\x96\x81x");
  EXPECT_EQ(norm({{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}}, " \t x \n"), "x \n");
  EXPECT_EQ(norm({{"type", "StripAccents"}}, "e\xCC\x81"), "e");
  EXPECT_EQ(make_normalizer({{"type", "Sequence"}, {"normalizers", json::array()}}), nullptr);
}

std::string dec(const json& j, const Strings& tokens) {
  return run_decoder(make_decoder(j).get(), tokens);
}

TEST(Decoder, Types) {
  EXPECT_EQ(dec({{"type", "ByteFallback"}}, {"a", "<0xE2>", "<0x82>", "<0xAC>", "b"}),
            "a\xE2\x82\xAC"
            "b");
  // An invalid run becomes one U+FFFD per byte.
  EXPECT_EQ(dec({{"type", "ByteFallback"}}, {"<0xE2>", "<0x82>", "c"}),
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "c");
  EXPECT_EQ(dec({{"type", "ByteLevel"}}, {"Hello", "\xC4\xA0world", "<|x|>"}), "Hello world<|x|>");
  json meta = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}};
  EXPECT_EQ(dec(meta, {"\xE2\x96\x81Hey",
                       "\xE2\x96\x81"
                       "friend"}),
            "Hey friend");
  EXPECT_EQ(dec({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 1}}, {"  a  "}), " a ");
  EXPECT_EQ(dec({{"type", "BPEDecoder"}, {"suffix", "</w>"}}, {"hel", "lo</w>", "there</w>"}), "hello there");
  EXPECT_EQ(run_decoder(nullptr, {"a", "b"}), "a b");
}

TEST(AddedVocab, FlagsAndLeftmostLongest) {
  AddedVocab v;
  v.add({"<mask>", 10, true, /*lstrip=*/true, false, false, false});
  v.add({"<end>", 11, true, false, /*rstrip=*/true, false, false});
  v.add({"ab", 12, false, false, false, /*single_word=*/true, false});
  v.add({"<a>", 13, true, false, false, false, false});
  v.add({"<a><b>", 14, true, false, false, false, false});
  v.build();
  auto run = [&](const std::string& text) {
    std::vector<Segment> segs;
    v.split(text, false, 0, segs);
    Strings out;
    for (const Segment& s : segs) out.push_back(s.token >= 0 ? fmt::format("[{}]", s.token) : std::string(s.text));
    return out;
  };
  EXPECT_EQ(run("a  <mask> b"), (Strings{"a", "[10]", " b"}));
  EXPECT_EQ(run("a <end>  b"), (Strings{"a ", "[11]", "b"}));
  EXPECT_EQ(run("ab xab ab"), (Strings{"[12]", " xab ", "[12]"}));
  EXPECT_EQ(run("x<a><b>y<a>"), (Strings{"x", "[14]", "y", "[13]"}));
  EXPECT_EQ(run(""), (Strings{""}));
}

// A tiny Llama-2-style tokenizer: Prepend + Replace normalizer, no pre-tokenizer, byte fallback,
// TemplateProcessing BOS, and the Replace/ByteFallback/Fuse/Strip decoder chain.
std::string llama2_json() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  const char* extra[] = {"\xE2\x96\x81",
                         "h",
                         "e",
                         "l",
                         "o",
                         "\xE2\x96\x81h",
                         "\xE2\x96\x81he",
                         "ll",
                         "\xE2\x96\x81hell",
                         "\xE2\x96\x81hello",
                         "w",
                         "r",
                         "d",
                         "\xE2\x96\x81w",
                         "or",
                         "\xE2\x96\x81wor",
                         "ld",
                         "\xE2\x96\x81world"};
  int id = 259;
  for (const char* t : extra) vocab[t] = id++;
  json merges = {"\xE2\x96\x81 h",
                 "\xE2\x96\x81h e",
                 "l l",
                 "\xE2\x96\x81he ll",
                 "\xE2\x96\x81hell o",
                 "\xE2\x96\x81 w",
                 "o r",
                 "\xE2\x96\x81w or",
                 "l d",
                 "\xE2\x96\x81wor ld"};
  json added = json::array();
  for (auto [content, i] : {std::pair{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}})
    added.push_back({{"id", i},
                     {"content", content},
                     {"special", true},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"single_word", false},
                     {"normalized", false}});
  json t = {{"added_tokens", added},
            {"normalizer",
             {{"type", "Sequence"},
              {"normalizers",
               {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}}},
            {"pre_tokenizer", nullptr},
            {"post_processor",
             {{"type", "TemplateProcessing"},
              {"single",
               {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
              {"pair", json::array()},
              {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
            {"decoder",
             {{"type", "Sequence"},
              {"decoders",
               {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                {{"type", "ByteFallback"}},
                {{"type", "Fuse"}},
                {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
            {"model",
             {{"type", "BPE"},
              {"unk_token", "<unk>"},
              {"byte_fallback", true},
              {"fuse_unk", true},
              {"vocab", vocab},
              {"merges", merges}}}};
  return t.dump();
}

TEST(TokenizerJson, MalformedInputIsAnErrorNotACrash) {
  // Fuzzer finding, kept as a regression: a float vocabulary id (undefined behaviour to convert).
  EXPECT_THROW(Tokenizer::from_tokenizer_json(R"({"model": {"type": "BPE", "vocab": {"a": 1.7e22}, "merges": []}})"),
               kiln::Error);
  EXPECT_THROW(Tokenizer::from_tokenizer_json(R"({"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}})"),
               kiln::Error);
  EXPECT_THROW(Tokenizer::from_tokenizer_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})"),
               kiln::Error);
  EXPECT_THROW(Tokenizer::from_tokenizer_json(R"({"model": {"type": "WordPiece"}})"), kiln::Error);
  EXPECT_THROW(Tokenizer::from_tokenizer_json("{not json"), kiln::Error);
  EXPECT_THROW(Tokenizer::from_tokenizer_json(R"({"model": {"type": "BPE", "vocab": [], "merges": []}})"), kiln::Error);
  std::string deep = R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "normalizer": )";
  for (int k = 0; k < 100; ++k) deep += R"({"type": "Sequence", "normalizers": [)";
  for (int k = 0; k < 100; ++k) deep += "]}";
  EXPECT_THROW(Tokenizer::from_tokenizer_json(deep + "}"), kiln::Error);
}

TEST(Llama2Style, EncodeDecode) {
  Tokenizer t = Tokenizer::from_tokenizer_json(llama2_json(), json{{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  EXPECT_EQ(t.encode("hello world"), (std::vector<uint32_t>{1, 268, 276}));
  EXPECT_EQ(t.encode("hello world", false), (std::vector<uint32_t>{268, 276}));
  std::vector<uint32_t> ids = t.encode("h\xC3\xA9", false);
  EXPECT_EQ(ids, (std::vector<uint32_t>{264, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(t.decode(ids), "h\xC3\xA9");
  EXPECT_EQ(t.decode(t.encode("hello world")), "<s> hello world");
  EXPECT_EQ(t.decode(t.encode("hello world"), true), "hello world");
  EXPECT_EQ(t.bos_id(), 1u);
  EXPECT_EQ(t.eos_id(), 2u);
  EXPECT_EQ(t.id_to_token(268), "\xE2\x96\x81hello");
  EXPECT_EQ(t.token_to_id("<0x41>"), 3u + 0x41);
}

}  // namespace
}  // namespace kiln::tok
