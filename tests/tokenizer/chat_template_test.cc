// Chat templates and the Jinja engine against renders made with Python jinja2 configured as
// transformers configures it (tools/make_tokenizer_refs.py templates -> template_refs.json).
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/parser.h"

namespace kiln::tok {
namespace {

using nlohmann::ordered_json;

ordered_json load(const char* name) {
  return ordered_json::parse(test::read_file(test::data_dir() / name));
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(ChatTemplate, MatchesJinja2ForEveryTemplateAndConversation) {
  ordered_json spec = load("template_cases.json"), refs = load("template_refs.json");
  std::map<std::string, const ordered_json*> cases;
  for (const auto& c : spec["cases"]) cases[c["name"].get<std::string>()] = &c;
  for (auto it = spec["templates"].begin(); it != spec["templates"].end(); ++it) {
    const std::string name = it.key();
    const ordered_json& t = it.value();
    ChatTemplate ct(test::read_file(test::data_dir() / t["file"].get<std::string>()),
                    t.value("special_tokens", ordered_json::object()));
    ct.set_sort_tool_keys(t.value("sort_tool_keys", false));
    size_t compared = 0;
    for (const auto& r : refs["templates"][name]) {
      const ordered_json& c = *cases.at(r["case"].get<std::string>());
      ChatRequest req;
      req.messages = c["messages"];
      if (c.contains("tools")) req.tools = c["tools"];
      if (c.contains("kwargs")) req.kwargs = c["kwargs"];
      req.add_generation_prompt = r["add_generation_prompt"].get<bool>();
      std::string label = name + "/" + r["case"].get<std::string>() + (req.add_generation_prompt ? "+gen" : "");
      if (r.contains("error")) {
        EXPECT_THROW(ct.render(req), std::exception) << label << ": jinja2 raised " << r["error"];
        continue;
      }
      std::string got;
      EXPECT_NO_THROW(got = ct.render(req)) << label << ": " << message_of([&] { ct.render(req); });
      EXPECT_EQ(got, r["output"].get<std::string>()) << label;
      ++compared;
    }
    // The issue asks for at least 20 conversations per template (with and without the prompt).
    EXPECT_GE(compared, 38u) << name;
  }
}

TEST(Jinja, SnippetsMatchJinja2) {
  ordered_json spec = load("template_cases.json"), refs = load("template_refs.json");
  const auto& snippets = spec["snippets"];
  ASSERT_EQ(snippets.size(), refs["snippets"].size());
  for (size_t k = 0; k < snippets.size(); ++k) {
    const auto& s = snippets[k];
    const auto& r = refs["snippets"][k];
    std::string name = s["name"].get<std::string>();
    std::vector<std::pair<std::string, jinja::Value>> vars;
    for (auto v = s["vars"].begin(); v != s["vars"].end(); ++v)
      vars.emplace_back(v.key(), jinja::Value::from_json(v.value()));
    std::string got, err;
    try {
      jinja::Interpreter in(jinja::parse_template(s["template"].get<std::string>()));
      got = in.render(vars);
    } catch (const std::exception& e) {
      err = e.what();
    }
    if (r.contains("error")) {
      EXPECT_FALSE(err.empty()) << name << ": jinja2 raised " << r["error"] << " but Kiln rendered \"" << got << "\"";
    } else {
      EXPECT_EQ(err, "") << name;
      EXPECT_EQ(got, r["output"].get<std::string>()) << name;
    }
  }
}

std::string render(const std::string& tmpl) {
  ChatTemplate ct(tmpl);
  return ct.render(ChatRequest{});
}

TEST(Jinja, UnsupportedSyntaxNamesTheLine) {
  std::string m = message_of([] { render("a\nb\n{% include 'x.jinja' %}"); });
  EXPECT_NE(m.find("line 3"), std::string::npos) << m;
  EXPECT_NE(m.find("include"), std::string::npos) << m;
  m = message_of([] { render("{{ 1 +\n }}"); });
  EXPECT_NE(m.find("line 2"), std::string::npos) << m;
  m = message_of([] { render("{% if true %}x"); });
  EXPECT_NE(m.find("endif"), std::string::npos) << m;
  m = message_of([] { render("x\n{{ raise_exception('bad role') }}"); });
  EXPECT_NE(m.find("line 2"), std::string::npos) << m;
  EXPECT_NE(m.find("bad role"), std::string::npos) << m;
  m = message_of([] { render("{{ x | nosuchfilter }}"); });
  EXPECT_NE(m.find("nosuchfilter"), std::string::npos) << m;
  EXPECT_THROW(render("{{ 'unterminated }}"), std::exception);
  EXPECT_THROW(render("{% for x in %}{% endfor %}"), std::exception);
  EXPECT_THROW(render("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}"), std::exception);  // recursion limit
  // Fuzzer findings, kept as regressions: an integer attribute past int64, self-containing values.
  EXPECT_THROW(render("{{ x.99999999999999999999999 }}"), kiln::Error);
  EXPECT_THROW(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"), kiln::Error);
  EXPECT_THROW(render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"), kiln::Error);
  EXPECT_THROW(render("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}"), kiln::Error);
  EXPECT_THROW(render("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"), kiln::Error);  // output cap
}

// A template can arrive with a request: sizes it asks for are checked before anything is built
// (these once wrapped past the check, or were never checked, and allocated until memory ran out).
TEST(Jinja, HugeRepetitionsAndWidthsAreErrors) {
  for (const char* t :
       {"{{ 'abcd' * 4611686018427387904 }}", "{{ ([0] * 16000000) | length }}",
        "{% set s = 'x' * 1000000 %}{{ ([s] * 100) | length }}", "{{ 'x'.ljust(100000000000) }}",
        "{{ 'x'.center(100000000000) }}", "{{ '1'.zfill(1000000000000) }}", "{{ 'x' | center(1000000000000) }}",
        "{{ 'a\nb' | indent(1000000000000) }}", "{{ 'a\nb' | indent(1000000000000, true) }}",
        "{{ {'a': 1} | tojson(indent=1000000000000) }}", "{{ 'x'.ljust(5, 'ab') }}"})
    EXPECT_THROW(render(t), kiln::Error) << t;
  EXPECT_EQ(render("{{ [0] * 3 }}|{{ 'ab' * 2 }}|{{ 'x'.rjust(3, '-') }}|{{ 'a\nb' | indent(2) }}"),
            "[0, 0, 0]|abab|--x|a\n  b");
}

TEST(Jinja, VariablesTransformersPasses) {
  ChatRequest req;
  EXPECT_EQ(ChatTemplate("{{ tools is none }}{{ documents is none }}{{ add_generation_prompt }}{{ messages|length }}")
                .render(req),
            "TrueTrueFalse0");
  req.tools = ordered_json::array();
  req.kwargs = {{"enable_thinking", false}};
  EXPECT_EQ(ChatTemplate("{{ tools is none }}{{ enable_thinking }}").render(req), "FalseFalse");
  ordered_json special = {{"bos_token", "<s>"}};
  EXPECT_EQ(ChatTemplate("{{ bos_token }}|{{ strftime_now('%Y')|length }}", special).render(req), "<s>|4");
}

TEST(Jinja, ToolKeysKeepInsertionOrderUnlessSorted) {
  ChatRequest req;
  req.tools = ordered_json::parse(R"([{"z": 1, "a": {"y": 2, "b": 3}}])");
  ChatTemplate ct("{{ tools|tojson }}");
  EXPECT_EQ(ct.render(req), R"([{"z": 1, "a": {"y": 2, "b": 3}}])");
  ct.set_sort_tool_keys(true);
  EXPECT_EQ(ct.render(req), R"([{"a": {"b": 3, "y": 2}, "z": 1}])");
}

TEST(ChatTemplate, ContinueFinalMessage) {
  ChatRequest req;
  req.messages =
      ordered_json::parse(R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, "}])");
  req.continue_final_message = true;
  ChatTemplate ct("{% for m in messages %}<{{ m.role }}>{{ m.content }}</end>\n{% endfor %}");
  EXPECT_EQ(ct.render(req), "<user>hi</end>\n<assistant>Sure,");
}

TEST(ChatTemplate, LoadsDeepSeekCheckpointDirectory) {
  if (!std::filesystem::exists(test::deepseek_dir() / "tokenizer_config.json"))
    GTEST_SKIP() << "run `npm ci` in tests/npm";
  ChatTemplate ct = ChatTemplate::load(test::deepseek_dir().string());
  ChatRequest req;
  req.messages = ordered_json::parse(R"([{"role": "user", "content": "Hi"}])");
  req.add_generation_prompt = true;
  EXPECT_EQ(ct.render(req),
            "<\xEF\xBD\x9C"
            "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C><\xEF\xBD\x9CUser\xEF\xBD\x9C>Hi<\xEF\xBD\x9C"
            "Assistant\xEF\xBD\x9C>");
}

}  // namespace
}  // namespace kiln::tok
