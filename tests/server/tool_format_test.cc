// The tool-call format `kiln serve` uses: the flag wins; on auto, config.json's model_type with
// the tokenizer's markers decides, never the chat template.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "server/tool_format.h"

namespace kiln::server {
namespace {

using nlohmann::json;

auto tokens(std::set<std::string> have) {
  return [have](std::string_view t) { return have.count(std::string(t)) > 0; };
}

const std::string kDsCall =
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "call\xE2\x96\x81"
    "begin\xEF\xBD\x9C>";

TEST(ToolFormat, FlagWins) {
  const json ds = {{"model_type", "deepseek_v3"}};
  for (const auto& [flag, f] :
       std::vector<std::pair<std::string, ToolFormat>>{{"deepseek_v3", ToolFormat::DeepSeekV3},
                                                       {"deepseek_v31", ToolFormat::DeepSeekV31},
                                                       {"kimi_k2", ToolFormat::KimiK2},
                                                       {"none", ToolFormat::None}}) {
    const ToolFormatChoice c = choose_tool_format(flag, ds, tokens({}));
    EXPECT_EQ(c.format, f) << flag;
    EXPECT_NE(c.reason.find("--tool-call-parser " + flag), std::string::npos) << c.reason;
    EXPECT_EQ(tool_format_name(f), flag);
  }
  try {
    choose_tool_format("hermes", ds, tokens({}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deepseek_v31"), std::string::npos) << e.what();
  }
}

TEST(ToolFormat, AutoFromModelType) {
  const ToolFormatChoice ds = choose_tool_format("auto", {{"model_type", "deepseek_v3"}}, tokens({kDsCall}));
  EXPECT_EQ(ds.format, ToolFormat::DeepSeekV3);
  EXPECT_NE(ds.reason.find("deepseek_v31"), std::string::npos) << "says how to pick V3.1: " << ds.reason;
  EXPECT_EQ(choose_tool_format("auto", {{"model_type", "kimi_k2"}}, tokens({"<|tool_call_begin|>"})).format,
            ToolFormat::KimiK2);
  // The model type without the tokens to write calls (kiln-tiny), or the tokens without a known
  // type: none, each saying why.
  const ToolFormatChoice tiny = choose_tool_format("auto", {{"model_type", "deepseek_v3"}}, tokens({}));
  EXPECT_EQ(tiny.format, ToolFormat::None);
  EXPECT_NE(tiny.reason.find("tokenizer"), std::string::npos) << tiny.reason;
  const ToolFormatChoice other = choose_tool_format("auto", {{"model_type", "llama"}}, tokens({kDsCall}));
  EXPECT_EQ(other.format, ToolFormat::None);
  EXPECT_NE(other.reason.find("llama"), std::string::npos) << other.reason;
  EXPECT_EQ(choose_tool_format("auto", json(), tokens({kDsCall})).format, ToolFormat::None);
  EXPECT_EQ(choose_tool_format("auto", {{"model_type", 3}}, tokens({kDsCall})).format, ToolFormat::None);
}

}  // namespace
}  // namespace kiln::server
