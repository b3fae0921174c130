// Model presets for the planner, and resolving `--model DIR|CONFIG|PRESET` to a config. A preset is
// written as a config.json object and goes through parse_model_config, so it obeys the same checks
// as a checkpoint's config.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "plan/weight_bytes.h"

namespace kiln::plan {

struct ModelPreset {
  std::string name;         // canonical spelling, e.g. "kimi-k3"
  std::string description;  // one line: what it is and where the dimensions come from
  ModelConfig config;
  WeightFormat default_weights;  // the format the published checkpoint ships in
};

const std::vector<ModelPreset>& model_presets();
// Case-insensitive; '_' and ' ' count as '-'. nullptr when there is no such preset.
const ModelPreset* find_preset(const std::string& name);

struct ResolvedModel {
  std::string name;  // preset name or the config path
  ModelConfig config;
  WeightFormat default_weights;
};
// The format a checkpoint's quantization_config says its weights ship in (none: bf16).
WeightFormat checkpoint_format(const ModelConfig& c);
// A directory (its config.json), a config file, or a preset name; anything else is an error that
// lists the presets.
ResolvedModel resolve_model(const std::string& arg);

}  // namespace kiln::plan
