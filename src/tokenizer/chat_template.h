// Chat templates: renders a conversation with the checkpoint's Jinja template exactly as
// transformers' apply_chat_template(tokenize=False) does: trim_blocks + lstrip_blocks, `tojson`
// as json.dumps(ensure_ascii=False), raise_exception, strftime_now, loop controls, and the same
// variables (messages, tools, documents, add_generation_prompt, the tokenizer's special tokens,
// then extra kwargs). Unsupported syntax is a kiln::Error naming the template line.
//
// Conversations are nlohmann::ordered_json so that object key order survives: `tojson` prints
// keys in insertion order, as Python does, and the model saw them in that order.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>

namespace kiln::jinja {
struct Template;
}

namespace kiln::tok {

struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;      // null: no tools (the template sees tools=None)
  nlohmann::ordered_json documents;  // null: none
  bool add_generation_prompt = false;
  // transformers' continue_final_message: cut the output after the last message's content.
  bool continue_final_message = false;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // extra template variables
};

class ChatTemplate {
 public:
  // `special_tokens`: bos_token, eos_token, ... as template variables (strings).
  explicit ChatTemplate(const std::string& source,
                        nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object());
  // From a checkpoint directory: chat_template.jinja, else tokenizer_config.json "chat_template"
  // (a string, or a list of {name, template}; "tool_use" is picked when tools are given).
  // Special tokens come from tokenizer_config.json. For Kimi tokenizers (tokenization_kimi)
  // tool definitions get their keys sorted recursively, as Kimi's apply_chat_template does.
  static ChatTemplate load(const std::string& dir);

  std::string render(const ChatRequest& req) const;

  // Kimi's tokenizer sorts tool schema keys before rendering (deep_sort_dict).
  void set_sort_tool_keys(bool on) { sort_tool_keys_ = on; }
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  ChatTemplate() = default;
  static ChatTemplate load_dir(const std::string& dir);
  std::map<std::string, std::shared_ptr<const jinja::Template>> templates_;  // "default", "tool_use", ...
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
  bool sort_tool_keys_ = false;
};

// The special-token variables transformers passes to templates (special_tokens_map): bos_token,
// eos_token, unk_token, sep_token, pad_token, cls_token, mask_token when set, and
// additional_special_tokens.
nlohmann::ordered_json special_tokens_from_config(const nlohmann::json& tokenizer_config);

}  // namespace kiln::tok
