// Shared by the engine speculation tests: the bundled kiln-tiny (target) with kiln-tiny-draft,
// engines with and without a draft model, and requests run as one continuous batch.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "engine/engine.h"
#include "spec/engine_speculator.h"
#include "test_util.h"

namespace kiln::spec {

inline std::string model_dir(const std::string& name) {
  return (test::repo_root() / "models" / name).string();
}

struct Models {
  std::unique_ptr<ops::Backend> backend = ops::make_cpu_backend();
  std::unique_ptr<DeepseekV3Model> target = DeepseekV3Model::load(model_dir("kiln-tiny"), *backend);
  std::vector<std::vector<int32_t>> prompts;  // heldout acceptance prompts of different lengths
  Models() {
    std::ifstream f(model_dir("kiln-tiny") + "/heldout.json");
    const auto h = nlohmann::json::parse(f);
    for (size_t i = 0; i < 5; ++i) {
      auto ids = h["acceptance"]["prompt_ids"][i].get<std::vector<int32_t>>();
      ids.resize(std::min<size_t>(ids.size(), 5 + 9 * i));
      prompts.push_back(ids);
    }
  }
};

inline Models& models() {
  static Models m;
  return m;
}

inline EngineConfig config(int64_t k, int64_t block_size = 8, int64_t num_blocks = 256) {
  EngineConfig c;
  c.block_size = block_size;
  c.kv.num_blocks = num_blocks;
  c.check_invariants = true;
  if (k > 0) c.speculator = make_speculator("draft", model_dir("kiln-tiny-draft"), k, *models().target);
  return c;
}

inline Request request(const std::vector<int32_t>& prompt, int64_t max_tokens, float temperature = 0,
                       uint64_t seed = 1) {
  Request r;
  r.prompt = prompt;
  r.sampling.temperature = temperature;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.seed = seed;
  return r;
}

inline Request clone(const Request& r) {
  Request c;
  c.prompt = r.prompt;
  c.sampling = r.sampling;
  c.speculate = r.speculate;
  return c;
}

// Submits all at once (one continuous batch) and returns each request's tokens.
inline std::vector<std::vector<int32_t>> run_all(Engine& e, const std::vector<Request>& reqs) {
  std::vector<RequestStream> streams;
  for (const auto& r : reqs) streams.push_back(e.submit(clone(r)));
  std::vector<std::vector<int32_t>> out;
  for (auto& s : streams) {
    OutputChunk all;
    while (auto c = s.next()) all.merge(std::move(*c));
    EXPECT_EQ(all.error, "");
    EXPECT_EQ(static_cast<int64_t>(all.token_ids.size()), all.output_tokens);
    out.push_back(all.token_ids);
  }
  return out;
}

}  // namespace kiln::spec
