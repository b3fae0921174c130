// Judging a prompt's size before paying for it: a body just under --max-body-bytes can hold
// millions of tokens, and templating and tokenizing it whole took ~150 MB per request only to
// answer context_length_exceeded. A prompt whose bytes could not fit the context even at the
// longest token per position is refused before any work, and tokenization stops at the context.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>

namespace kiln::server {

struct PromptBudget {
  int64_t context = 0;         // the engine's max_model_len, in tokens
  size_t max_token_bytes = 1;  // the most bytes one token stands for (Tokenizer::max_token_bytes)

  // Bytes past which a text cannot be fewer than `context` tokens. A normalizer may shrink text
  // before it is split into tokens (NFKC composes a character and its combining marks), so the
  // bound allows four times the longest token per position.
  size_t max_prompt_bytes() const;
  bool fits(size_t bytes) const { return bytes <= max_prompt_bytes(); }
};

// The bytes of message content that any chat template renders: system, user and tool messages
// (assistant turns are not counted: reasoning templates drop earlier turns' thinking).
size_t rendered_content_bytes(const nlohmann::ordered_json& messages);

}  // namespace kiln::server
