#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/parser.h"

namespace kiln::tok {

using nlohmann::json;
using nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  KILN_CHECK(f, "cannot open {}", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ordered_json deep_sort(const ordered_json& j) {
  if (j.is_object()) {
    std::vector<std::string> keys;
    for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
    std::sort(keys.begin(), keys.end());
    ordered_json out = ordered_json::object();
    for (const auto& k : keys) out[k] = deep_sort(j[k]);
    return out;
  }
  if (j.is_array()) {
    ordered_json out = ordered_json::array();
    for (const auto& e : j) out.push_back(deep_sort(e));
    return out;
  }
  return j;
}

std::string token_content(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

}  // namespace

ordered_json special_tokens_from_config(const json& cfg) {
  ordered_json out = ordered_json::object();
  if (!cfg.is_object()) return out;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!cfg.contains(key)) continue;
    std::string s = token_content(cfg[key]);
    if (!s.empty()) out[key] = s;
  }
  if (cfg.contains("additional_special_tokens") && cfg["additional_special_tokens"].is_array()) {
    ordered_json list = ordered_json::array();
    for (const auto& t : cfg["additional_special_tokens"]) list.push_back(token_content(t));
    out["additional_special_tokens"] = list;
  }
  return out;
}

ChatTemplate::ChatTemplate(const std::string& source, ordered_json special_tokens)
    : special_tokens_(std::move(special_tokens)) {
  templates_["default"] = jinja::parse_template(source);
}

ChatTemplate ChatTemplate::load(const std::string& dir) {
  try {
    return load_dir(dir);
  } catch (const nlohmann::json::exception& e) {
    fail("{}/tokenizer_config.json: {}", dir, e.what());
  }
}

ChatTemplate ChatTemplate::load_dir(const std::string& dir) {
  fs::path d(dir);
  json cfg;
  if (fs::exists(d / "tokenizer_config.json")) {
    cfg = json::parse(read_text(d / "tokenizer_config.json"), nullptr, false);
    KILN_CHECK(!cfg.is_discarded(), "{} is not valid JSON", (d / "tokenizer_config.json").string());
  }
  ChatTemplate t;
  t.special_tokens_ = special_tokens_from_config(cfg);
  if (fs::exists(d / "chat_template.jinja")) {
    t.templates_["default"] = jinja::parse_template(read_text(d / "chat_template.jinja"));
  } else if (cfg.is_object() && cfg.contains("chat_template")) {
    const json& ct = cfg["chat_template"];
    if (ct.is_string()) {
      t.templates_["default"] = jinja::parse_template(ct.get<std::string>());
    } else {
      KILN_CHECK(ct.is_array(), "tokenizer_config.json: chat_template must be a string or a list");
      for (const json& e : ct) {
        KILN_CHECK(e.is_object() && e.contains("name") && e.contains("template"),
                   "tokenizer_config.json: chat_template list entries need name and template");
        t.templates_[e["name"].get<std::string>()] = jinja::parse_template(e["template"].get<std::string>());
      }
    }
  }
  KILN_CHECK(!t.templates_.empty(), "{} has no chat template (chat_template.jinja or tokenizer_config.json)", dir);
  std::string auto_map = cfg.is_object() && cfg.contains("auto_map") ? cfg["auto_map"].dump() : "";
  t.sort_tool_keys_ = auto_map.find("tokenization_kimi") != std::string::npos || fs::exists(d / "tokenization_kimi.py");
  return t;
}

std::string ChatTemplate::render(const ChatRequest& req) const {
  KILN_CHECK(req.messages.is_array(), "chat template: messages must be a list");
  bool has_tools = !req.tools.is_null();
  auto it = has_tools && templates_.count("tool_use") ? templates_.find("tool_use") : templates_.find("default");
  KILN_CHECK(it != templates_.end(), "no default chat template");
  std::vector<std::pair<std::string, jinja::Value>> vars;
  vars.emplace_back("messages", jinja::Value::from_json(req.messages));
  vars.emplace_back("tools", has_tools ? jinja::Value::from_json(sort_tool_keys_ ? deep_sort(req.tools) : req.tools)
                                       : jinja::Value::none());
  vars.emplace_back("documents", jinja::Value::from_json(req.documents));
  vars.emplace_back("add_generation_prompt", jinja::Value::boolean(req.add_generation_prompt));
  for (auto kv = special_tokens_.begin(); kv != special_tokens_.end(); ++kv)
    vars.emplace_back(kv.key(), jinja::Value::from_json(kv.value()));
  KILN_CHECK(req.kwargs.is_object(), "chat template kwargs must be an object");
  for (auto kv = req.kwargs.begin(); kv != req.kwargs.end(); ++kv)
    vars.emplace_back(kv.key(), jinja::Value::from_json(kv.value()));
  jinja::Interpreter in(it->second);
  std::string out = in.render(vars);
  if (req.continue_final_message) {
    KILN_CHECK(
        !req.messages.empty() && req.messages.back().contains("content") && req.messages.back()["content"].is_string(),
        "continue_final_message needs a final message with string content");
    std::string final_content = req.messages.back()["content"].get<std::string>();
    // transformers strips the content and cuts the render right after its last occurrence.
    size_t b = final_content.find_first_not_of(" \t\n\r\f\v");
    size_t e = final_content.find_last_not_of(" \t\n\r\f\v");
    final_content = b == std::string::npos ? "" : final_content.substr(b, e - b + 1);
    size_t at = out.rfind(final_content);
    KILN_CHECK(at != std::string::npos, "continue_final_message: the final message is not in the rendered chat");
    out = out.substr(0, at + final_content.size());
    size_t last = out.find_last_not_of(" \t\n\r\f\v");
    out = last == std::string::npos ? "" : out.substr(0, last + 1);
  }
  return out;
}

}  // namespace kiln::tok
