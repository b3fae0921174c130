// Internal: the parts a Tokenizer is assembled from. Shared by the loaders (tokenizer.cc,
// tiktoken.cc) and the incremental detokenizer.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>

#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pretokenizer.h"

namespace kiln::tok {

struct TokenizerImpl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  AddedVocab added;
  nlohmann::json config;
  std::string bos_token, eos_token;
  std::optional<uint32_t> bos_id, eos_id;
  // The decoder contains ByteFallback: "<0xAB>" tokens combine into characters across steps.
  bool byte_fallback_decoder = false;
};

// Reads a special-token entry of tokenizer_config.json: a string, or {"content": ...}.
std::string config_token_string(const nlohmann::json& config, const char* key);
// Sets bos/eos strings and ids from the config.
void resolve_special_tokens(TokenizerImpl& impl);
// Adds the tokens of config["added_tokens_decoder"] that the vocabulary does not have yet.
void add_config_added_tokens(TokenizerImpl& impl);

}  // namespace kiln::tok
