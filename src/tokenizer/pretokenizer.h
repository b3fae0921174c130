// tokenizer.json pre-tokenizers: Sequence, Split (regex or literal, every `behavior`, `invert`),
// ByteLevel, Digits, Metaspace, Whitespace, WhitespaceSplit, Punctuation. Pieces are views into
// the segment being encoded or into a per-call arena when a step rewrites text.
#pragma once

#include <nlohmann/json.hpp>

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tok {

struct Piece {
  std::string_view text;
  bool at_start = false;  // begins at offset 0 of the original input (Metaspace "first")
};

class PieceArena {
 public:
  std::string_view hold(std::string s) {
    store_.push_back(std::move(s));
    return store_.back();
  }

 private:
  std::deque<std::string> store_;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Appends the pieces of p to out, in order; empty pieces are dropped.
  virtual void split(const Piece& p, PieceArena& arena, std::vector<Piece>& out) const = 0;
};

struct PreTokenizerInfo {
  bool has_byte_level = false;  // a ByteLevel step exists (the model then works in byte mode)
};

// `byte_mode`: ByteLevel steps leave pieces as raw bytes instead of mapping them to the GPT-2
// alphabet (the BPE model then reads bytes directly). Returns nullptr for `null`.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, bool byte_mode);
PreTokenizerInfo inspect_pre_tokenizer(const nlohmann::json& j);

// The tiktoken split: regex matches become pieces, text between matches is dropped (as tiktoken's
// find_iter loop does).
std::unique_ptr<PreTokenizer> make_regex_pieces(const std::string& pattern);

}  // namespace kiln::tok
