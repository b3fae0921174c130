// Streaming detokenization by re-decoding a short window of recent ids and emitting what is new.
// Text is held back while it may still change: trailing U+FFFD (an unfinished UTF-8 sequence
// decodes to it, and more bytes can turn it into a character) and the output of a trailing run of
// byte-fallback tokens (Hugging Face decodes such a run all-or-nothing, so an added byte can turn
// the whole run into U+FFFDs). Everything else is final, so the pieces concatenate to the full
// decode.
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace kiln::tok {

namespace {
constexpr std::string_view kFffd = "\xEF\xBF\xBD";
// Once this many ids sit in a fully emitted window, keep only the last kContext as context.
constexpr size_t kSlideAt = 8, kContext = 2;
}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tok_(tokenizer), skip_special_(skip_special_tokens) {}

std::string IncrementalDetokenizer::decode_prefix(size_t n) const {
  return tok_.decode(std::span<const uint32_t>(ids_.data(), n), skip_special_);
}

bool IncrementalDetokenizer::is_byte_token(uint32_t id) const {
  if (!tok_.impl_->byte_fallback_decoder || tok_.impl_->added.by_id(id)) return false;
  const std::string* s = tok_.impl_->model->id_to_token(id);
  return s && s->size() == 6 && s->compare(0, 3, "<0x") == 0 && (*s)[5] == '>';
}

std::string IncrementalDetokenizer::step(uint32_t id) {
  ids_.push_back(id);
  size_t stable_ids = ids_.size();
  while (stable_ids > 0 && is_byte_token(ids_[stable_ids - 1])) --stable_ids;
  std::string w = decode_prefix(stable_ids);
  size_t stable = w.size();
  while (stable >= kFffd.size() && std::string_view(w).substr(stable - kFffd.size()) == kFffd) stable -= kFffd.size();
  std::string out;
  if (stable > done_) {
    out = w.substr(done_, stable - done_);
    done_ = stable;
  }
  if (stable_ids == ids_.size() && done_ == w.size() && ids_.size() >= kSlideAt) {
    std::vector<uint32_t> tail(ids_.end() - kContext, ids_.end());
    std::string t = tok_.decode(tail, skip_special_);
    if (w.size() >= t.size() && std::string_view(w).substr(w.size() - t.size()) == t) {
      ids_ = std::move(tail);
      done_ = t.size();
    }
  }
  return out;
}

std::string IncrementalDetokenizer::finish() {
  std::string w = decode_prefix(ids_.size());
  std::string out = done_ < w.size() ? w.substr(done_) : std::string();
  ids_.clear();
  done_ = 0;
  return out;
}

}  // namespace kiln::tok
