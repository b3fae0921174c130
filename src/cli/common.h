// Helpers the subcommands share: id lists, device choice, model loading.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/deepseek_v3.h"
#include "ops/backend.h"

namespace kiln::cli {

// "1,2,3" -> {1, 2, 3}; anything else is an error naming `flag`.
std::vector<int32_t> parse_ids(const std::string& s, const std::string& flag);

std::unique_ptr<ops::Backend> make_backend(const std::string& device);

// One backend and the model on it.
struct LoadedModel {
  std::unique_ptr<ops::Backend> backend;
  std::unique_ptr<DeepseekV3Model> model;
};
// kv_dtype: "auto" (the backend's: bf16 on CUDA, f32 on the CPU), "bf16" or "f32".
LoadedModel load_model(const std::string& dir, const std::string& device, const std::string& kv_dtype = "auto");

}  // namespace kiln::cli
