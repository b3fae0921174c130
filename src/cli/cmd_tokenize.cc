// `kiln tokenize --tokenizer DIR (--text T | --text-file F) [--json] [--no-special-tokens]`
// `kiln detokenize --tokenizer DIR --ids 1,2,3 [--skip-special-tokens]`
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kiln::cli {
namespace {

struct TokenizeArgs {
  std::string dir, text, text_file;
  bool text_given = false, json = false, no_special = false, split_special = false;
};

int run_tokenize(const TokenizeArgs& a) {
  KILN_CHECK(a.text_given != !a.text_file.empty(), "tokenize needs exactly one of --text or --text-file");
  std::string text = a.text;
  if (!a.text_file.empty()) {
    std::error_code ec;  // a folder opens as a stream that reads nothing, silently (a pipe is fine)
    KILN_CHECK(!std::filesystem::is_directory(a.text_file, ec), "--text-file {}: a folder, not a file", a.text_file);
    std::ifstream f(a.text_file, std::ios::binary);
    KILN_CHECK(f, "cannot open --text-file {}", a.text_file);
    std::ostringstream ss;
    ss << f.rdbuf();
    KILN_CHECK(!f.bad(), "--text-file {}: read failed", a.text_file);
    text = ss.str();
  }
  tok::Tokenizer t = tok::Tokenizer::load(a.dir);
  std::vector<uint32_t> ids = t.encode(text, !a.no_special, a.split_special);
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"ids", ids}}.dump().c_str());
    return 0;
  }
  std::string out;
  for (size_t k = 0; k < ids.size(); ++k) {
    if (k) out += ',';
    out += std::to_string(ids[k]);
  }
  std::printf("%s\n", out.c_str());
  return 0;
}

std::vector<uint32_t> parse_ids(const std::string& s) {
  std::vector<uint32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    KILN_CHECK(b != std::string::npos, "--ids has an empty entry in {}", tok::quote(s));
    item = item.substr(b, e - b + 1);
    KILN_CHECK(item.find_first_not_of("0123456789") == std::string::npos && item.size() <= 10,
               "--ids entry {} is not a token id", tok::quote(item));
    uint64_t v = std::stoull(item);
    KILN_CHECK(v <= UINT32_MAX, "--ids entry {} is out of range", item);
    ids.push_back(static_cast<uint32_t>(v));
  }
  return ids;
}

KILN_COMMAND("tokenize", "Encode text into token ids with a checkpoint's tokenizer", [](CLI::App& sub) {
  auto a = std::make_shared<TokenizeArgs>();
  sub.add_option("--tokenizer", a->dir, "directory with tokenizer.json or tiktoken.model")->required();
  sub.add_option("--text", a->text, "text to encode")->each([a](const std::string&) { a->text_given = true; });
  sub.add_option("--text-file", a->text_file, "file whose bytes are encoded");
  sub.add_flag("--json", a->json, "print {\"ids\": [...]}");
  sub.add_flag("--no-special-tokens", a->no_special, "do not add BOS/EOS (the post-processor)");
  sub.add_flag("--split-special-tokens", a->split_special, "encode special tokens written in the text as plain text");
  return [a] { return run_tokenize(*a); };
});

struct DetokenizeArgs {
  std::string dir, ids;
  bool skip_special = false;
};

KILN_COMMAND("detokenize", "Decode token ids into text", [](CLI::App& sub) {
  auto a = std::make_shared<DetokenizeArgs>();
  sub.add_option("--tokenizer", a->dir, "directory with tokenizer.json or tiktoken.model")->required();
  sub.add_option("--ids", a->ids, "comma-separated token ids")->required();
  sub.add_flag("--skip-special-tokens", a->skip_special, "drop special tokens from the text");
  return [a] {
    tok::Tokenizer t = tok::Tokenizer::load(a->dir);
    std::vector<uint32_t> ids = parse_ids(a->ids);
    for (uint32_t id : ids)
      KILN_CHECK(id < t.vocab_size(), "--ids: token id {} is outside the vocabulary (size {})", id, t.vocab_size());
    std::string text = t.decode(ids, a->skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  };
});

}  // namespace
}  // namespace kiln::cli
