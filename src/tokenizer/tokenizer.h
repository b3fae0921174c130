// Kiln's tokenizer: reads the tokenizer files that ship with a checkpoint and turns text into
// token ids and back exactly as the model was trained.
//
//   Tokenizer t = Tokenizer::load("/models/DeepSeek-V3");   // tokenizer.json or tiktoken.model
//   std::vector<uint32_t> ids = t.encode("Hello", /*add_special_tokens=*/true);
//   std::string text = t.decode(ids);
//
// Supported: Hugging Face tokenizer.json BPE models (byte-level or byte-fallback) with their
// normalizers, pre-tokenizers, added tokens, post-processors and decoders; tiktoken files
// (`tiktoken.model`) with the split pattern and special tokens from tokenizer_config.json (Kimi K2).
// Input that is not valid UTF-8 is repaired first: every ill-formed sequence becomes U+FFFD (the
// "maximal subpart" rule Python uses for errors="replace").
//
// A Tokenizer is immutable once loaded and safe to share between threads; copies share state.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tok {

struct TokenizerImpl;

class Tokenizer {
 public:
  // Loads DIR/tokenizer.json (or DIR/tiktoken.model) plus DIR/tokenizer_config.json when present.
  // Throws kiln::Error naming the file and the field at fault.
  static Tokenizer load(const std::string& dir);
  // From file contents; `config` is tokenizer_config.json (or null).
  static Tokenizer from_tokenizer_json(std::string_view tokenizer_json, const nlohmann::json& config = nullptr);
  // `model_text`: tiktoken.model lines "<base64 token> <rank>". The split pattern comes from
  // config["pat_str"], or is Kimi's when the config names Kimi's tokenizer class (see
  // docs/tokenizers.md); special tokens come from config["added_tokens_decoder"].
  static Tokenizer from_tiktoken(std::string_view model_text, const nlohmann::json& config, bool kimi_defaults = false);

  // add_special_tokens: apply the post-processor (e.g. prepend BOS). Special tokens written in the
  // text are recognised as special tokens, as Hugging Face does by default; pass
  // split_special_tokens=true to encode them as plain text instead (safer for untrusted input).
  // max_tokens: stop once more than this many ids are found (the result then holds more than
  // max_tokens ids, but not all of them), so an oversized prompt costs no more than the limit.
  std::vector<uint32_t> encode(std::string_view text, bool add_special_tokens = true, bool split_special_tokens = false,
                               size_t max_tokens = SIZE_MAX) const;
  // The most bytes any one token stands for (as written in the vocabulary, an upper bound).
  size_t max_token_bytes() const;
  // Unknown ids are skipped, as Hugging Face does.
  std::string decode(std::span<const uint32_t> ids, bool skip_special_tokens = false) const;

  std::optional<uint32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(uint32_t id) const;
  bool is_special(uint32_t id) const;
  // Largest id + 1 over the model vocabulary and added tokens.
  size_t vocab_size() const;

  std::optional<uint32_t> bos_id() const;
  std::optional<uint32_t> eos_id() const;
  // Special token strings from tokenizer_config.json ("" when absent).
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  // tokenizer_config.json as loaded (null when there was none).
  const nlohmann::json& config() const;

 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerImpl> impl) : impl_(std::move(impl)) {}
  static Tokenizer build_from_json(const nlohmann::json& j, const nlohmann::json& config);
  static Tokenizer build_from_tiktoken(std::string_view model_text, const nlohmann::json& config, bool kimi_defaults);
  std::shared_ptr<const TokenizerImpl> impl_;
  friend class IncrementalDetokenizer;
};

// Streaming decode for one sequence: feed ids as they are generated, get text as soon as it is
// final. Never emits a partial UTF-8 character (byte-level and byte-fallback tokens that split a
// character are held until it completes), and the concatenation of everything returned by step()
// and finish() equals tokenizer.decode(all ids).
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  // Returns the text that became final with this id (often empty).
  std::string step(uint32_t id);
  // Returns whatever is still held (e.g. an incomplete character, decoded as U+FFFD).
  std::string finish();

 private:
  std::string decode_prefix(size_t n) const;
  bool is_byte_token(uint32_t id) const;
  Tokenizer tok_;
  bool skip_special_;
  std::vector<uint32_t> ids_;  // the window: ids_[0] onward
  size_t done_ = 0;            // bytes of window_text() already emitted (or context)
};

}  // namespace kiln::tok
