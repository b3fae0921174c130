// The PromptTokenizer over Kiln's own tokenizer module; compiled only when the build has one
// (src/bench/CMakeLists.txt), so the benchmark never depends on it to build.
#include <algorithm>
#include <vector>

#include "bench/prompt_tokenizer.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace kiln::bench {
namespace {

class ModelTokenizer final : public PromptTokenizer {
 public:
  ModelTokenizer(std::string dir, tok::Tokenizer t) : dir_(std::move(dir)), tok_(std::move(t)) {
    // Random prompts draw from ordinary tokens only: a special token in a prompt would change what
    // the server does (end of turn, role markers), not just the length.
    for (uint32_t id = 0; id < tok_.vocab_size(); ++id)
      if (!tok_.is_special(id) && tok_.id_to_token(id)) ids_.push_back(id);
    KILN_CHECK(!ids_.empty(), "--tokenizer {}: the vocabulary has no ordinary tokens", dir_);
  }

  std::string describe() const override { return dir_; }
  bool exact() const override { return true; }

  std::string random_text(int64_t tokens, std::mt19937_64& rng) const override {
    const size_t n = static_cast<size_t>(std::max<int64_t>(tokens, 0));
    std::uniform_int_distribution<size_t> pick(0, ids_.size() - 1);
    std::vector<uint32_t> ids(n);
    for (auto& id : ids) id = ids_[pick(rng)];
    // Decoding random ids and encoding the text again merges some neighbours into other tokens, so
    // the length drifts; trim or top up and repeat until the round trip is stable (a few rounds).
    std::string text = tok_.decode(ids);
    for (int round = 0; round < 10; ++round) {
      std::vector<uint32_t> again = tok_.encode(text, /*add_special_tokens=*/false, /*split_special_tokens=*/true);
      if (again.size() == n) break;
      if (again.size() > n) {
        again.resize(n);
      } else {
        while (again.size() < n) again.push_back(ids_[pick(rng)]);
      }
      text = tok_.decode(again);
    }
    return text;
  }

  int64_t count(std::string_view text) const override {
    return static_cast<int64_t>(tok_.encode(text, /*add_special_tokens=*/false, /*split_special_tokens=*/true).size());
  }

 private:
  std::string dir_;
  tok::Tokenizer tok_;
  std::vector<uint32_t> ids_;
};

}  // namespace

std::unique_ptr<PromptTokenizer> load_prompt_tokenizer(const std::string& dir) {
  return std::make_unique<ModelTokenizer>(dir, tok::Tokenizer::load(dir));
}

}  // namespace kiln::bench
