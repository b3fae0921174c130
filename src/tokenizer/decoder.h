// tokenizer.json decoders: ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace, BPEDecoder and
// Sequence. Each rewrites the list of token strings, as Hugging Face's decode_chain does; the
// final text is the concatenation.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace kiln::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// Returns nullptr for `null`; throws kiln::Error naming an unsupported type.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j);

// Runs the decoder and joins the result; without a decoder tokens are joined with spaces
// (Hugging Face's behaviour).
std::string run_decoder(const Decoder* d, std::vector<std::string> tokens);

}  // namespace kiln::tok
