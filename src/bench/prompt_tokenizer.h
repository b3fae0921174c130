// What the benchmark needs from a tokenizer, behind a small interface: build prompt text of a given
// token length, and count the tokens of text. With `--tokenizer DIR` the model's own tokenizer does
// both exactly (Kiln's tokenizer module); without one a documented approximation stands in
// (docs/benchmarking.md, "Without a tokenizer"), so the benchmark runs against any server.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>

namespace kiln::bench {

class PromptTokenizer {
 public:
  virtual ~PromptTokenizer() = default;
  // What made the counts: "approximate (4 bytes per token)" or the tokenizer's directory.
  virtual std::string describe() const = 0;
  // True when counts come from the model's tokenizer.
  virtual bool exact() const = 0;
  // Text made of random tokens that encodes back to `tokens` tokens: exactly with a real tokenizer
  // (random ids decoded, re-encoded and trimmed until stable, as vLLM's random dataset does),
  // within the approximation's accuracy otherwise.
  virtual std::string random_text(int64_t tokens, std::mt19937_64& rng) const = 0;
  // Tokens in `text` as the model would see it, without special tokens.
  virtual int64_t count(std::string_view text) const = 0;
};

// No tokenizer: a token is taken as 4 bytes of UTF-8 (count = ceil(bytes / 4)), and random text is
// common short English words, nearly all single tokens in BPE vocabularies, 4 bytes a token.
std::unique_ptr<PromptTokenizer> make_approximate_tokenizer();

// The tokenizer of a checkpoint directory (tokenizer.json or tiktoken.model). Throws kiln::Error
// when the directory has none, or when this build has no tokenizer module.
std::unique_ptr<PromptTokenizer> load_prompt_tokenizer(const std::string& dir);

}  // namespace kiln::bench
