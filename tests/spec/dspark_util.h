// Shared by the DSpark engine and CLI tests: a random-weight DeepSpec-format block draft for
// kiln-tiny's shapes (hidden 256, vocabulary 8192, 5 layers), written to a temporary directory.
// The embedding and lm_head are left out: the engine takes the target's.
//
// Random weights alone would almost never be accepted, which would leave the accept paths of the
// tests untried. So the Markov head can be planted with bigrams (prev -> next): slot i of its
// rank gets a large markov_w1[prev] and markov_w2[next] = e_i, so whenever `prev` is the token
// before a block position, `next` dominates that position's logits. Tests plant what the target
// itself says next, and drafts are then accepted some of the time.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"

namespace kiln::test {

inline nlohmann::json dspark_tiny_config() {
  return {{"architectures", {"DeepseekV3DSparkModel"}},
          {"model_type", "deepseek_v3"},
          {"vocab_size", 8192},
          {"hidden_size", 256},
          {"intermediate_size", 128},
          {"num_hidden_layers", 1},
          {"num_attention_heads", 8},
          {"q_lora_rank", 128},
          {"kv_lora_rank", 128},
          {"qk_rope_head_dim", 16},
          {"qk_nope_head_dim", 32},
          {"v_head_dim", 32},
          {"first_k_dense_replace", 1},
          {"n_routed_experts", 0},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},
          {"rope_interleave", true},
          {"num_target_layers", 5},
          // 4 is the last layer: HF's hidden_states[5], after the final norm (kHiddenFinalNorm).
          {"target_layer_ids", {1, 4}},
          {"block_size", 4},
          {"mask_token_id", 8191},
          {"markov_rank", 16},
          {"markov_head_type", "vanilla"},
          {"enable_confidence_head", true},
          {"confidence_head_with_markov", true}};
}

// The drafts a test program wrote, removed when it ends.
inline std::vector<std::filesystem::path>& dspark_dirs() {
  static std::vector<std::filesystem::path> dirs;
  return dirs;
}
struct RemoveDsparkDrafts : ::testing::Environment {
  void TearDown() override {
    for (const auto& d : dspark_dirs()) std::filesystem::remove_all(d);
  }
};
inline const auto* const kRemoveDsparkDrafts = ::testing::AddGlobalTestEnvironment(new RemoveDsparkDrafts);

// A fresh temporary directory (`prefix`_`name`_pid_serial), removed when the test program ends.
inline std::filesystem::path fresh_draft_dir(const std::string& prefix, const std::string& name) {
  static int serial = 0;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      (prefix + "_" + name + "_" + std::to_string(getpid()) + "_" + std::to_string(serial++));
  std::filesystem::create_directories(dir);
  dspark_dirs().push_back(dir);
  return dir;
}

// The shapes of a DSpark block draft's tensors for config `j` (a null q_lora_rank: plain q_proj),
// less the embedding and lm_head.
inline std::map<std::string, std::vector<int64_t>> dspark_shapes(const nlohmann::json& j) {
  const int64_t V = j["vocab_size"], H = j["hidden_size"], I = j["intermediate_size"], nh = j["num_attention_heads"],
                r = j["kv_lora_rank"], rope = j["qk_rope_head_dim"], nope = j["qk_nope_head_dim"], vd = j["v_head_dim"],
                R = j["markov_rank"], L = static_cast<int64_t>(j["target_layer_ids"].size());
  const int64_t ql = j["q_lora_rank"].is_null() ? 0 : j["q_lora_rank"].get<int64_t>();
  std::map<std::string, std::vector<int64_t>> shapes = {{"fc.weight", {H, L * H}},
                                                        {"hidden_norm.weight", {H}},
                                                        {"norm.weight", {H}},
                                                        {"markov_head.markov_w1.weight", {V, R}},
                                                        {"markov_head.markov_w2.weight", {V, R}},
                                                        {"confidence_head.proj.weight", {1, H + R}},
                                                        {"confidence_head.proj.bias", {1}}};
  for (int64_t l = 0; l < j["num_hidden_layers"].get<int64_t>(); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    shapes[p + "input_layernorm.weight"] = {H};
    shapes[p + "post_attention_layernorm.weight"] = {H};
    if (ql > 0) {
      shapes[p + "self_attn.q_a_proj.weight"] = {ql, H};
      shapes[p + "self_attn.q_a_layernorm.weight"] = {ql};
      shapes[p + "self_attn.q_b_proj.weight"] = {nh * (nope + rope), ql};
    } else {
      shapes[p + "self_attn.q_proj.weight"] = {nh * (nope + rope), H};
    }
    shapes[p + "self_attn.kv_a_proj_with_mqa.weight"] = {r + rope, H};
    shapes[p + "self_attn.kv_a_layernorm.weight"] = {r};
    shapes[p + "self_attn.kv_b_proj.weight"] = {nh * (nope + vd), r};
    shapes[p + "self_attn.o_proj.weight"] = {H, nh * vd};
    shapes[p + "mlp.gate_proj.weight"] = {I, H};
    shapes[p + "mlp.up_proj.weight"] = {I, H};
    shapes[p + "mlp.down_proj.weight"] = {H, I};
  }
  return shapes;
}

// Writes config `j` and random weights (seeded) with the bigrams planted; returns the directory.
inline std::string write_dspark_draft(const std::string& name, const nlohmann::json& j,
                                      const std::vector<std::pair<int32_t, int32_t>>& plant = {}) {
  const int64_t R = j["markov_rank"];
  const std::map<std::string, std::vector<int64_t>> shapes = dspark_shapes(j);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::map<std::string, RawTensor> raw;
  for (const auto& [n, s] : shapes) {
    int64_t numel = 1;
    for (int64_t d : s) numel *= d;
    std::vector<float> v(static_cast<size_t>(numel));
    const bool is_norm = s.size() == 1 && n.find("bias") == std::string::npos;
    const float scale = s.size() == 2 ? 0.1f / std::sqrt(static_cast<float>(s[1])) : 1.0f;
    for (float& x : v) x = is_norm ? 1.0f : scale * normal(rng);
    if (n == "markov_head.markov_w1.weight" || n == "markov_head.markov_w2.weight")
      for (size_t i = 0; i < plant.size() && static_cast<int64_t>(i) < R; ++i) {
        const int32_t row = n == "markov_head.markov_w1.weight" ? plant[i].first : plant[i].second;
        v[static_cast<size_t>(row * R + static_cast<int64_t>(i))] = n == "markov_head.markov_w1.weight" ? 40.0f : 1.0f;
      }
    raw[n] = {"F32", s, std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4)};
  }
  const std::filesystem::path dir = fresh_draft_dir("kiln_dspark", name);
  std::ofstream(dir / "config.json") << j.dump(2);
  write_safetensors((dir / "model.safetensors").string(), raw);
  return dir.string();
}

// The bigrams of `seqs` (each token to the one after it), the first of each `prev` only, at most `max`.
inline std::vector<std::pair<int32_t, int32_t>> bigrams(const std::vector<std::vector<int32_t>>& seqs, size_t max) {
  std::vector<std::pair<int32_t, int32_t>> out;
  for (const auto& s : seqs)
    for (size_t i = 0; i + 1 < s.size() && out.size() < max; ++i) {
      bool seen = false;
      for (const auto& [a, b] : out) seen = seen || a == s[i];
      if (!seen) out.emplace_back(s[i], s[i + 1]);
    }
  return out;
}

}  // namespace kiln::test
