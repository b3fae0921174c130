// Byte-pair encoding of one pre-tokenized piece. Two merge rules share one O(n log n) merge loop
// (a min-heap of candidate pairs keyed by (rank, position), stale entries skipped on pop):
//  - Hugging Face BPE: a merge list ranks pairs of token ids;
//  - tiktoken: a pair's rank is the rank of the concatenated bytes, when that is a token.
// In byte mode (ByteLevel models and tiktoken) pieces are raw bytes and each byte starts as its
// own symbol; vocabulary strings are kept in their original (byte-level) spelling for
// id_to_token / token_to_id.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/flat_map.h"

namespace kiln::tok {

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object (type BPE). `byte_mode`: the pre-tokenizer ends
  // in ByteLevel, so pieces arrive as raw bytes.
  static std::unique_ptr<BpeModel> from_hf_json(const nlohmann::json& model, bool byte_mode);
  // tiktoken ranks: ranks[i] are the bytes of token i (empty string = unused id).
  static std::unique_ptr<BpeModel> from_tiktoken(std::vector<std::string> ranks);

  // Appends the ids of `piece` to out.
  void tokenize(std::string_view piece, std::vector<uint32_t>& out) const;

  std::optional<uint32_t> token_to_id(std::string_view token) const;
  // The vocabulary spelling of id, or nullptr when the model has no such id.
  const std::string* id_to_token(uint32_t id) const;
  size_t vocab_size() const { return id_to_token_.size(); }
  bool byte_mode() const { return byte_mode_; }

 private:
  BpeModel() = default;
  struct Symbol {
    uint32_t id, start, len;
    int32_t prev, next;
  };
  void merge(std::string_view piece, std::vector<uint32_t>& out) const;
  bool initial_symbols(std::string_view piece, std::vector<Symbol>& syms) const;
  // Rank and merged id of the adjacent pair (a, b), or false.
  bool pair_rank(std::string_view piece, const Symbol& a, const Symbol& b, uint32_t& rank, uint32_t& id) const;

  bool byte_mode_ = false;
  bool tiktoken_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  std::optional<uint32_t> unk_id_;
  std::string prefix_, suffix_;  // continuing_subword_prefix, end_of_word_suffix
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  StringMap token_to_id_;  // vocabulary spelling -> id
  StringMap raw_to_id_;    // byte mode: raw bytes -> id
  std::array<int64_t, 256> byte_id_{};
  PairMap merges_;

  // Word cache: most pieces repeat, and a hit skips the merge loop entirely. Sharded so that
  // concurrent encoders rarely contend.
  static constexpr size_t kShards = 16, kShardCapacity = 8192, kMaxCachedBytes = 256;
  // Transparent hashing lets a string_view look up a std::string key without allocating.
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return hash_bytes(s); }
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<uint32_t>, Hash, std::equal_to<>> map;
  };
  mutable std::unique_ptr<Shard[]> cache_ = std::make_unique<Shard[]>(kShards);
};

}  // namespace kiln::tok
