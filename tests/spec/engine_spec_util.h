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

// Several prompts of different lengths and lengths to generate; one (the third) plainly decoded.
inline std::vector<Request> mixed_requests() {
  std::vector<Request> reqs;
  for (size_t i = 0; i < models().prompts.size(); ++i) {
    reqs.push_back(request(models().prompts[i], 7 + 5 * static_cast<int64_t>(i)));
    reqs.back().speculate = i != 2;
  }
  return reqs;
}

// mixed_requests() sampled (temperature 0.8, top-k 40, top-p 0.95), each with its own seed.
inline std::vector<Request> sampled_mixed_requests() {
  std::vector<Request> reqs = mixed_requests();
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].sampling.temperature = 0.8f, reqs[i].sampling.top_k = 40, reqs[i].sampling.top_p = 0.95f;
    reqs[i].sampling.seed = 100 + i;
  }
  return reqs;
}

// Runs `reqs` together on `e`, then each alone: each must give the same tokens both ways (what
// is batched beside a request does not change its output). Returns the outputs run together.
inline std::vector<std::vector<int32_t>> expect_alone_as_together(Engine& e, const std::vector<Request>& reqs) {
  const auto together = run_all(e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::vector<Request> alone;
    alone.push_back(clone(reqs[i]));
    EXPECT_EQ(run_all(e, alone)[0], together[i]) << "request " << i;
  }
  return together;
}

}  // namespace kiln::spec
