#include "plan/presets.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "core/error.h"

namespace kiln::plan {
namespace {

using json = nlohmann::json;

// The published config.json of deepseek-ai/DeepSeek-V3 (architecture fields; FP8 checkpoint).
json deepseek_v3() {
  return {{"model_type", "deepseek_v3"},
          {"vocab_size", 129280},
          {"hidden_size", 7168},
          {"intermediate_size", 18432},
          {"moe_intermediate_size", 2048},
          {"num_hidden_layers", 61},
          {"num_attention_heads", 128},
          {"n_shared_experts", 1},
          {"n_routed_experts", 256},
          {"num_experts_per_tok", 8},
          {"n_group", 8},
          {"topk_group", 4},
          {"first_k_dense_replace", 3},
          {"routed_scaling_factor", 2.5},
          {"q_lora_rank", 1536},
          {"kv_lora_rank", 512},
          {"qk_rope_head_dim", 64},
          {"qk_nope_head_dim", 128},
          {"v_head_dim", 128},
          {"max_position_embeddings", 163840},
          {"num_nextn_predict_layers", 1},
          {"rope_theta", 10000},
          {"rope_scaling",
           {{"type", "yarn"},
            {"factor", 40},
            {"original_max_position_embeddings", 4096},
            {"beta_fast", 32},
            {"beta_slow", 1},
            {"mscale", 1.0},
            {"mscale_all_dim", 1.0}}}};
}

// moonshotai/Kimi-K2-Instruct's config.json: DeepSeek-V3's layout with 384 experts, 64 heads, one
// dense layer, a 163840 vocabulary and no NextN layer.
json kimi_k2() {
  json j = deepseek_v3();
  j["model_type"] = "kimi_k2";
  j["vocab_size"] = 163840;
  j["num_attention_heads"] = 64;
  j["n_routed_experts"] = 384;
  j["n_group"] = 1;
  j["topk_group"] = 1;
  j["first_k_dense_replace"] = 1;
  j["routed_scaling_factor"] = 2.827;
  j["max_position_embeddings"] = 131072;
  j["num_nextn_predict_layers"] = 0;
  j["rope_theta"] = 50000;
  j["rope_scaling"] = {{"type", "yarn"},       {"factor", 32},   {"original_max_position_embeddings", 4096},
                       {"beta_fast", 1},       {"beta_slow", 1}, {"mscale", 1.0},
                       {"mscale_all_dim", 1.0}};
  return j;
}

// moonshotai/Moonlight-16B-A3B's config.json.
json moonlight() {
  return {{"model_type", "deepseek_v3"},
          {"vocab_size", 163840},
          {"hidden_size", 2048},
          {"intermediate_size", 11264},
          {"moe_intermediate_size", 1408},
          {"num_hidden_layers", 27},
          {"num_attention_heads", 16},
          {"n_shared_experts", 2},
          {"n_routed_experts", 64},
          {"num_experts_per_tok", 6},
          {"n_group", 1},
          {"topk_group", 1},
          {"first_k_dense_replace", 1},
          {"routed_scaling_factor", 2.446},
          {"q_lora_rank", nullptr},
          {"kv_lora_rank", 512},
          {"qk_rope_head_dim", 64},
          {"qk_nope_head_dim", 128},
          {"v_head_dim", 128},
          {"max_position_embeddings", 8192},
          {"rope_theta", 50000},
          {"num_nextn_predict_layers", 0}};
}

// Kimi K3 as the published deployment describes it: 2.8 T parameters, 96 attention heads (12 per
// GPU at TP8), 61 layers of 576-wide MLA latent KV. Everything else is an assumption, argued in
// docs/planning.md: Kimi K2's per-layer shapes (hidden 7168, expert width 2048, top-8, one shared
// expert, one dense layer, 163840 vocabulary) with the routed-expert count raised to reach 2.8 T.
// 1056 experts (a multiple of 32, so EP 8/16/32 divide it) give 2.805 T.
json kimi_k3() {
  json j = kimi_k2();
  j["num_attention_heads"] = 96;
  j["n_routed_experts"] = 1056;
  return j;
}

std::string canonical(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return c == '_' || c == ' ' ? '-' : static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = [] {
    std::vector<ModelPreset> p;
    auto add = [&](const char* name, const char* desc, const json& j, WeightFormat f) {
      p.push_back({name, desc, parse_model_config(j, std::string("preset ") + name), f});
    };
    add("deepseek-v3", "DeepSeek-V3 (671 B + 14 B NextN), published config, ships FP8", deepseek_v3(),
        WeightFormat::Fp8);
    add("kimi-k2", "Kimi K2 (1.03 T), published config, Instruct ships FP8 (K2 Thinking: int4 experts)", kimi_k2(),
        WeightFormat::Fp8);
    add("moonlight-16b-a3b", "Moonlight-16B-A3B, published config, ships BF16", moonlight(), WeightFormat::Bf16);
    add("kimi-k3",
        "Kimi K3 as its deployment describes it (2.8 T, 96 heads, 61 layers); other dimensions assumed "
        "(docs/planning.md)",
        kimi_k3(), WeightFormat::Int4Experts);
    return p;
  }();
  return presets;
}

const ModelPreset* find_preset(const std::string& name) {
  const std::string want = canonical(name);
  for (const auto& p : model_presets()) {
    if (p.name == want) return &p;
  }
  // Short aliases people type.
  if (want == "dsv3" || want == "deepseek-v3-0324" || want == "deepseek-r1") return find_preset("deepseek-v3");
  if (want == "moonlight" || want == "moonlight-16b") return find_preset("moonlight-16b-a3b");
  if (want == "k2" || want == "kimi-k2-thinking") return find_preset("kimi-k2");
  if (want == "k3") return find_preset("kimi-k3");
  return nullptr;
}

WeightFormat checkpoint_format(const ModelConfig& c) {
  return c.fp8 ? WeightFormat::Fp8 : c.int4 ? WeightFormat::Int4Experts : WeightFormat::Bf16;
}

ResolvedModel resolve_model(const std::string& arg) {
  namespace fs = std::filesystem;
  KILN_CHECK(!arg.empty(), "--model is required (a checkpoint directory, a config.json, or a preset)");
  std::error_code ec;
  if (fs::is_directory(arg, ec)) {
    std::string path = (fs::path(arg) / "config.json").string();
    ModelConfig c = load_model_config(path);
    return {arg, c, checkpoint_format(c)};
  }
  if (fs::is_regular_file(arg, ec)) {
    ModelConfig c = load_model_config(arg);
    return {arg, c, checkpoint_format(c)};
  }
  if (const ModelPreset* p = find_preset(arg)) return {p->name, p->config, p->default_weights};
  std::string names;
  for (const auto& p : model_presets()) names += (names.empty() ? "" : ", ") + p.name;
  fail("--model {}: not a directory, a config file or a preset (presets: {})", arg, names);
}

}  // namespace kiln::plan
