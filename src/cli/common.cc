#include "cli/common.h"

#include <charconv>

#include "core/error.h"
#include "core/log.h"

namespace kiln::cli {

std::vector<int32_t> parse_ids(const std::string& s, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    while (!tok.empty() && tok.front() == ' ') tok.erase(tok.begin());
    while (!tok.empty() && tok.back() == ' ') tok.pop_back();
    int32_t v = 0;
    auto [p, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    KILN_CHECK(!tok.empty() && ec == std::errc() && p == tok.data() + tok.size() && v >= 0,
               "{}: \"{}\" is not a non-negative token id (expected a list like 1,2,3)", flag, tok);
    ids.push_back(v);
    i = j + 1;
  }
  KILN_CHECK(!ids.empty(), "{}: no token ids given", flag);
  return ids;
}

std::unique_ptr<ops::Backend> make_backend(const std::string& device) {
  if (device == "cpu") return ops::make_cpu_backend();
  KILN_CHECK(device == "cuda", "--device must be cpu or cuda, got \"{}\"", device);
  return ops::make_cuda_backend();
}

LoadedModel load_model(const std::string& dir, const std::string& device, const std::string& kv_dtype) {
  KILN_CHECK(kv_dtype == "auto" || kv_dtype == "bf16" || kv_dtype == "f32",
             "--kv-cache-dtype must be auto, bf16 or f32, got \"{}\"", kv_dtype);
  LoadedModel m;
  m.backend = make_backend(device);
  m.model = DeepseekV3Model::load(dir, *m.backend);
  if (kv_dtype != "auto") m.model->set_kv_dtype(kv_dtype == "bf16" ? DType::BF16 : DType::F32);
  spdlog::info("loaded {} ({} layers, {} heads) on {}", dir, m.model->config().num_hidden_layers,
               m.model->config().num_attention_heads, m.backend->name());
  spdlog::info("kernel plan ({} heads per GPU):", m.model->config().num_attention_heads);
  for (const auto& [op, impl] : m.backend->kernel_plan()) spdlog::info("  {:<14} {}", op, impl);
  return m;
}

}  // namespace kiln::cli
