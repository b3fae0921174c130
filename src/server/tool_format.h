// Which tool-call format `kiln serve` parses and forces: the --tool-call-parser flag (vLLM's
// spellings), else the model's config.json model_type, never the chat template's text. The
// reason goes to the startup log.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <string_view>

#include "server/output_parser.h"

namespace kiln::server {

struct ToolFormatChoice {
  ToolFormat format = ToolFormat::None;
  std::string reason;  // for the log: where the choice came from
};

// `flag`: "auto" or a format name (throws kiln::Error naming the accepted ones otherwise).
// `model_config`: config.json (null when unreadable). `has_token`: whether the tokenizer has a
// special token (a format whose markers are missing cannot be written by the model).
ToolFormatChoice choose_tool_format(const std::string& flag, const nlohmann::json& model_config,
                                    const std::function<bool(std::string_view)>& has_token);

}  // namespace kiln::server
