// tiktoken files: `tiktoken.model` holds one "<base64 bytes> <rank>" line per token; the split
// pattern and special tokens live beside it (for Kimi K2 in tokenization_kimi.py and
// tokenizer_config.json). A tiktoken vocabulary is a byte-level BPE whose merge priority is the
// rank of the merged bytes, so it is loaded into the same pipeline as tokenizer.json models.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kiln::tok {

// ranks[i] = bytes of the token with rank i ("" for unused ranks). Throws kiln::Error naming the
// line at fault.
std::vector<std::string> parse_tiktoken_ranks(std::string_view text);

// Kimi K2's split pattern (tokenization_kimi.py, `pat_str`), in its original Rust-regex spelling.
const std::string& kimi_k2_pattern();

// Kimi reserves this many special ids after the base vocabulary (plus two), naming the ones
// tokenizer_config.json does not list "<|reserved_token_{id}|>".
constexpr int kKimiReservedSpecialTokens = 256;

}  // namespace kiln::tok
