// tokenizer.json post-processors, applied when encode is asked to add special tokens:
// TemplateProcessing, RobertaProcessing/BertProcessing, ByteLevel (ids unchanged) and Sequence.
// Only single sequences are encoded, so only the "single" template is used.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <vector>

namespace kiln::tok {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<uint32_t>& ids) const = 0;
};

std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j);

// The template transformers builds for Llama-style tokenizers from add_bos_token/add_eos_token.
std::unique_ptr<PostProcessor> make_bos_eos_processor(std::vector<uint32_t> prefix, std::vector<uint32_t> suffix);

}  // namespace kiln::tok
