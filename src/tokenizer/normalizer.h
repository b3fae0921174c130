// tokenizer.json normalizers: NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip,
// StripAccents and Sequence. Each rewrites one text segment (the text between added tokens).
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace kiln::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void apply(std::string& s) const = 0;
};

// Returns nullptr for `null` and for an empty Sequence (the identity, which keeps encode on its
// zero-copy path). Throws kiln::Error naming an unsupported type.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j);

}  // namespace kiln::tok
