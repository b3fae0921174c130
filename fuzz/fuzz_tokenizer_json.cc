// tokenizer.json from an untrusted checkpoint: loading must either succeed or throw kiln::Error, and
// a loaded tokenizer must encode, decode and stream without crashing.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  try {
    kiln::tok::Tokenizer t = kiln::tok::Tokenizer::from_tokenizer_json(in);
    for (std::string_view s :
         {"Hello world 123", "  \n\t\xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 <s> x", "", "\xFF\xC3"}) {
      std::vector<uint32_t> ids = t.encode(s, true);
      t.decode(ids, false);
      t.decode(ids, true);
      kiln::tok::IncrementalDetokenizer d(t);
      for (uint32_t id : ids) d.step(id);
      d.finish();
    }
    std::vector<uint32_t> some = {0, 1, 2, 3, 255, 256, 1000, 4000000000u};
    t.decode(some);
  } catch (const kiln::Error&) {
  }
  return 0;
}
