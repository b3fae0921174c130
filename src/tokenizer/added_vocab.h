// Added tokens (special tokens and user-added words): found in the text before any
// normalisation or pre-tokenisation, leftmost-longest as Hugging Face's Aho-Corasick matcher does,
// honouring each token's lstrip / rstrip / single_word flags. Tokens flagged `normalized` are
// matched in a second pass over normalised text.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kiln::tok {

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// A run of text, or an added token (token >= 0) covering text.
struct Segment {
  std::string_view text;
  int64_t token = -1;
  size_t offset = 0;  // byte offset of text within the string that was split
};

class AddedVocab {
 public:
  void add(AddedToken t);
  // Call once after all add()s. Contents of `normalized` tokens are matched in normalised text,
  // so they are normalised too (identity when the tokenizer has no normalizer).
  void build(const std::function<std::string(std::string_view)>& normalize = nullptr);

  // Splits `text` on the added tokens of one pass (normalized == the token's flag) and appends the
  // pieces to out, in order. `base` is added to each piece's offset. `skip_special`: special
  // tokens are not matched (Hugging Face's encode_special_tokens / split_special_tokens).
  void split(std::string_view text, bool normalized_pass, size_t base, std::vector<Segment>& out,
             bool skip_special = false) const;

  const AddedToken* by_id(uint32_t id) const;
  std::optional<uint32_t> by_content(std::string_view content) const;
  bool empty() const { return tokens_.empty(); }
  bool has_normalized() const { return has_normalized_; }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> next;  // sorted by byte
      int32_t token = -1;                                   // index into tokens_
    };
    std::vector<Node> nodes{Node{}};
    bool first_byte[256] = {};
    void insert(std::string_view s, int32_t token);
    // Longest token starting at text[i], or -1; sets len.
    int32_t longest(std::string_view text, size_t i, size_t& len) const;
  };
  std::vector<AddedToken> tokens_;
  std::unordered_map<uint32_t, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
  Trie raw_, normalized_;
  bool has_normalized_ = false;
};

}  // namespace kiln::tok
