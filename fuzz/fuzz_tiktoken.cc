// tiktoken.model from an untrusted checkpoint (and, when the input starts with "#pat ", a split
// pattern on its first line): loading succeeds or throws kiln::Error; encode/decode never crash.
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  nlohmann::json cfg = {
      {"pat_str",
       R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)"},
      {"added_tokens_decoder", {{"300", {{"content", "<|end|>"}, {"special", true}}}}}};
  if (in.substr(0, 5) == "#pat ") {
    size_t nl = in.find('\n');
    cfg["pat_str"] = std::string(in.substr(5, nl == std::string_view::npos ? std::string_view::npos : nl - 5));
    in = nl == std::string_view::npos ? std::string_view() : in.substr(nl + 1);
  }
  try {
    kiln::tok::Tokenizer t = kiln::tok::Tokenizer::from_tiktoken(in, cfg);
    for (std::string_view s : {"Hello world 123", "  \n\t\xE4\xB8\xAD\xE6\x96\x87 <|end|>\xF0\x9F\x98\x80", ""}) {
      std::vector<uint32_t> ids = t.encode(s, false);
      t.decode(ids);
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
