// `kiln chat-template --tokenizer DIR --messages FILE.json [--tools FILE.json]
//                     [--add-generation-prompt] [--kwargs JSON] [--template FILE]`
// Prints the rendered prompt exactly (no trailing newline is added).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/chat_template.h"

namespace kiln::cli {
namespace {

struct ChatTemplateArgs {
  std::string dir, messages, tools, kwargs, template_file;
  bool add_generation_prompt = false, continue_final = false;
};

nlohmann::ordered_json read_json(const std::string& path, const char* flag) {
  std::ifstream f(path, std::ios::binary);
  KILN_CHECK(f, "cannot open {} {}", flag, path);
  std::ostringstream ss;
  ss << f.rdbuf();
  auto j = nlohmann::ordered_json::parse(ss.str(), nullptr, false);
  KILN_CHECK(!j.is_discarded(), "{} {} is not valid JSON", flag, path);
  return j;
}

int run_chat_template(const ChatTemplateArgs& a) {
  tok::ChatRequest req;
  nlohmann::ordered_json m = read_json(a.messages, "--messages");
  // Either a list of messages, or {"messages": [...], "tools": [...]} like a chat request body.
  if (m.is_object()) {
    KILN_CHECK(m.contains("messages"), "--messages {}: an object needs a \"messages\" list", a.messages);
    if (m.contains("tools")) req.tools = m["tools"];
    req.messages = m["messages"];
  } else {
    req.messages = m;
  }
  KILN_CHECK(req.messages.is_array(), "--messages {}: messages must be a JSON list", a.messages);
  if (!a.tools.empty()) req.tools = read_json(a.tools, "--tools");
  if (!a.kwargs.empty()) {
    req.kwargs = nlohmann::ordered_json::parse(a.kwargs, nullptr, false);
    KILN_CHECK(!req.kwargs.is_discarded() && req.kwargs.is_object(), "--kwargs must be a JSON object");
  }
  req.add_generation_prompt = a.add_generation_prompt;
  req.continue_final_message = a.continue_final;
  tok::ChatTemplate t = tok::ChatTemplate::load(a.dir);
  if (!a.template_file.empty()) {
    std::ifstream f(a.template_file, std::ios::binary);
    KILN_CHECK(f, "cannot open --template {}", a.template_file);
    std::ostringstream ss;
    ss << f.rdbuf();
    tok::ChatTemplate custom(ss.str(), t.special_tokens());
    std::string out = custom.render(req);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  std::string out = t.render(req);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

KILN_COMMAND("chat-template", "Render a conversation with the checkpoint's chat template", [](CLI::App& sub) {
  auto a = std::make_shared<ChatTemplateArgs>();
  sub.add_option("--tokenizer", a->dir, "directory with tokenizer_config.json / chat_template.jinja")->required();
  sub.add_option("--messages", a->messages, "JSON file: a list of messages (or {messages, tools})")->required();
  sub.add_option("--tools", a->tools, "JSON file: a list of tool definitions");
  sub.add_option("--kwargs", a->kwargs, "extra template variables as a JSON object");
  sub.add_option("--template", a->template_file, "render this Jinja file instead of the checkpoint's template");
  sub.add_flag("--add-generation-prompt", a->add_generation_prompt, "end with the assistant turn header");
  sub.add_flag("--continue-final-message", a->continue_final, "leave the final message open");
  return [a] { return run_chat_template(*a); };
});

}  // namespace
}  // namespace kiln::cli
