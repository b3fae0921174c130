#include "bench/prompt_tokenizer.h"

#include <array>

#include "core/error.h"

namespace kiln::bench {
namespace {

// Short, frequent English words: each is one token (with its leading space) in the GPT-2, Llama-3,
// DeepSeek-V3 and Kimi vocabularies, and together they average close to 4 bytes.
constexpr std::array<std::string_view, 64> kWords = {
    " the", " of",  " and", " to",  " in",  " is",  " it",  " you",  " he",  " was", " for", " on",  " are",
    " as",  " his", " at",  " be",  " one", " had", " by",  " but",  " not", " all", " we",  " can", " out",
    " up",  " use", " how", " an",  " she", " do",  " if",  " will", " so",  " way", " new", " day", " may",
    " my",  " has", " see", " two", " him", " get", " now", " man",  " its", " who", " did", " old", " our",
    " me",  " no",  " go",  " set", " own", " end", " why", " let",  " put", " say", " big", " a"};

class ApproximateTokenizer final : public PromptTokenizer {
 public:
  std::string describe() const override { return "approximate (4 bytes per token)"; }
  bool exact() const override { return false; }

  std::string random_text(int64_t tokens, std::mt19937_64& rng) const override {
    // Fill 4 bytes per token with random words; the last gap is closed with a shorter word so that
    // count() of the result is exactly `tokens`.
    const size_t target = static_cast<size_t>(std::max<int64_t>(tokens, 0)) * 4;
    std::string s;
    s.reserve(target + 8);
    std::uniform_int_distribution<size_t> pick(0, kWords.size() - 1);
    while (s.size() + 2 <= target) {
      std::string_view w = kWords[pick(rng)];
      if (s.size() + w.size() > target) w = target - s.size() >= 3 ? " an" : " a";
      s.append(w);
    }
    return s;
  }

  int64_t count(std::string_view text) const override { return static_cast<int64_t>((text.size() + 3) / 4); }
};

}  // namespace

std::unique_ptr<PromptTokenizer> make_approximate_tokenizer() {
  return std::make_unique<ApproximateTokenizer>();
}

#ifndef KILN_BENCH_HAS_TOKENIZER
std::unique_ptr<PromptTokenizer> load_prompt_tokenizer(const std::string& dir) {
  fail(
      "--tokenizer {}: this build of kiln has no tokenizer module; leave --tokenizer out to use the "
      "approximate counts",
      dir);
}
#endif

}  // namespace kiln::bench
