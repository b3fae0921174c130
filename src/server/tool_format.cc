#include "server/tool_format.h"

#include <fmt/format.h>

#include "core/error.h"

namespace kiln::server {

ToolFormatChoice choose_tool_format(const std::string& flag, const nlohmann::json& model_config,
                                    const std::function<bool(std::string_view)>& has_token) {
  if (flag != "auto") {
    const auto f = parse_tool_format(flag);
    if (!f)
      throw Error(fmt::format(
          "--tool-call-parser: unknown format '{}' (auto, none, deepseek_v3, deepseek_v31, kimi_k2)", flag));
    return {*f, fmt::format("--tool-call-parser {}", flag)};
  }
  const std::string type =
      model_config.is_object() && model_config.contains("model_type") && model_config["model_type"].is_string()
          ? model_config["model_type"].get<std::string>()
          : "";
  const std::string from = type.empty() ? "config.json has no model_type" : fmt::format("model_type '{}'", type);
  // Kimi K2 checkpoints name themselves in model_type; DeepSeek V3 and V3.1 share "deepseek_v3",
  // and nothing in either checkpoint's config tells them apart.
  ToolFormat f = ToolFormat::None;
  if (type == "kimi_k2") f = ToolFormat::KimiK2;
  if (type == "deepseek_v3") f = ToolFormat::DeepSeekV3;
  if (f == ToolFormat::None)
    return {f, fmt::format("{}: no tool-call format known for it (--tool-call-parser deepseek_v3, deepseek_v31 or "
                           "kimi_k2 turns tool calls on)",
                           from)};
  const std::string_view marker = tool_markers(f).call_begin;
  if (!has_token(marker))
    return {ToolFormat::None,
            fmt::format("{}, but the tokenizer has no {} token, so the model cannot write calls (--tool-call-parser "
                        "overrides)",
                        from, marker)};
  if (f == ToolFormat::DeepSeekV3)
    return {f, fmt::format("{} and its tool-call tokens; a DeepSeek-V3.1 checkpoint writes calls differently and "
                           "needs --tool-call-parser deepseek_v31",
                           from)};
  return {f, fmt::format("{} and its tool-call tokens", from)};
}

}  // namespace kiln::server
