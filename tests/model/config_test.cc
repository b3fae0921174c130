#include "model/config.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "core/error.h"
#include "model/weight_layout.h"
#include "test_util.h"

namespace kiln {
namespace {

using json = nlohmann::json;

// The published Kimi K2 shape (issue 2).
json kimi_k2() {
  return json::parse(R"({"model_type":"kimi_k2","hidden_size":7168,"num_attention_heads":64,"q_lora_rank":1536,
    "kv_lora_rank":512,"qk_rope_head_dim":64,"qk_nope_head_dim":128,"v_head_dim":128,"n_routed_experts":384,
    "num_experts_per_tok":8,"n_shared_experts":1,"moe_intermediate_size":2048,"intermediate_size":18432,
    "num_hidden_layers":61,"first_k_dense_replace":1,"vocab_size":163840,"n_group":1,"topk_group":1,
    "rope_theta":50000.0,"max_position_embeddings":131072,"routed_scaling_factor":2.827,
    "rope_scaling":{"beta_fast":1.0,"beta_slow":1.0,"factor":32.0,"mscale":1.0,"mscale_all_dim":1.0,
                    "original_max_position_embeddings":4096,"type":"yarn"}})");
}

std::string error_of(const json& j) {
  try {
    parse_model_config(j, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, KimiK2CountsArePinned) {
  ModelConfig c = parse_model_config(kimi_k2(), "kimi_k2");
  ParamCounts p = count_params(c);
  EXPECT_NEAR(static_cast<double>(p.total) / 1e12, 1.03, 0.01);
  EXPECT_NEAR(static_cast<double>(p.active) / 1e9, 32.0, 1.5);
  EXPECT_EQ(kv_bytes_per_token(c, 2), 70272);
}

TEST(Config, ModelInfoCliReportsKimiK2) {
  std::string path = testing::TempDir() + "/kimi_k2_config.json";
  std::ofstream(path) << kimi_k2().dump();
  auto r = test::run_kiln("model-info --config " + path + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  json j = json::parse(r.out);
  EXPECT_NEAR(j["total_params"].get<double>() / 1e12, 1.03, 0.01);
  EXPECT_NEAR(j["active_params"].get<double>() / 1e9, 32.0, 1.5);
  EXPECT_EQ(j["kv_bytes_per_token"].get<int64_t>(), 70272);
}

TEST(Config, BothRopeSpellingsAgree) {
  json a = kimi_k2();
  json b = kimi_k2();
  b.erase("rope_scaling");
  b.erase("rope_theta");
  b["rope_parameters"] = {{"rope_type", "yarn"},   {"rope_theta", 50000.0},
                          {"factor", 32.0},        {"beta_fast", 1.0},
                          {"beta_slow", 1.0},      {"mscale", 1.0},
                          {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096}};
  ModelConfig ca = parse_model_config(a, "a"), cb = parse_model_config(b, "b");
  EXPECT_EQ(ca.rope.theta, 50000.0);
  EXPECT_EQ(cb.rope.theta, 50000.0);
  EXPECT_EQ(ca.rope_inv_freq(), cb.rope_inv_freq());
  EXPECT_DOUBLE_EQ(ca.softmax_scale(), cb.softmax_scale());
  // YaRN with mscale_all_dim 1: the softmax scale grows by (0.1 ln 32 + 1)^2.
  const double m = 0.1 * std::log(32.0) + 1.0;
  EXPECT_NEAR(ca.softmax_scale(), m * m / std::sqrt(192.0), 1e-12);
  EXPECT_DOUBLE_EQ(ca.rope_attention_factor(), 1.0);
}

TEST(Config, NullQLoraMeansQProj) {
  json j = kimi_k2();
  j["q_lora_rank"] = nullptr;
  ModelConfig c = parse_model_config(j, "x");
  EXPECT_EQ(c.q_lora_rank, 0);
  bool has_q_proj = false;
  for (auto& w : weight_layout(c)) has_q_proj |= w.name == "model.layers.0.self_attn.q_proj.weight";
  EXPECT_TRUE(has_q_proj);
}

TEST(Config, UnsupportedValuesNameTheField) {
  struct Case {
    const char* field;
    json value;
  };
  std::vector<Case> cases = {
      {"model_type", "llama"}, {"scoring_func", "softmax"}, {"hidden_act", "gelu"},     {"n_group", 5},
      {"topk_group", 3},       {"qk_rope_head_dim", 7},     {"num_attention_heads", 0}, {"hidden_size", "big"},
      {"moe_layer_freq", 2},   {"norm_topk_prob", "yes"},   {"attention_bias", true},   {"topk_method", "greedy"}};
  for (const auto& c : cases) {
    json j = kimi_k2();
    j["n_group"] = 8;
    j["topk_group"] = 2;
    j[c.field] = c.value;
    if (std::string(c.field) == "topk_group") j["n_group"] = 2;
    std::string err = error_of(j);
    EXPECT_NE(err.find(c.field), std::string::npos) << c.field << ": " << err;
  }
  json r = kimi_k2();
  r["rope_scaling"]["type"] = "longrope";
  EXPECT_NE(error_of(r).find("rope_scaling.rope_type"), std::string::npos) << error_of(r);
  json q = kimi_k2();
  q["quantization_config"] = {{"quant_method", "awq"}};
  EXPECT_NE(error_of(q).find("quantization_config.quant_method"), std::string::npos);
}

// Corrupt sizes fail naming the field, instead of wrapping a shape product (2^62 x 4 -> 0 elements,
// which once loaded an "empty" embedding and crashed in the forward) or allocating without end.
TEST(Config, SizesPastTheMaximumNameTheField) {
  struct Case {
    const char* field;
    json value;
    const char* says;
  };
  const int64_t huge = int64_t{1} << 62;
  std::vector<Case> cases = {{"vocab_size", huge, "vocab_size"},
                             {"hidden_size", huge, "hidden_size"},
                             {"num_attention_heads", huge, "num_attention_heads"},
                             {"num_hidden_layers", 30000000, "num_hidden_layers"},
                             {"n_routed_experts", 1 << 20, "n_routed_experts"},
                             {"num_nextn_predict_layers", 1000, "num_nextn_predict_layers"},
                             {"kv_lora_rank", huge, "kv_lora_rank"},
                             {"hidden_size", 1e30, "hidden_size"},                    // a float past int64
                             {"hidden_size", UINT64_MAX, "hidden_size"},              // would read as -1
                             {"eos_token_id", 163840, "eos_token_id"},                // = vocab_size
                             {"eos_token_id", json::array({1, -1}), "eos_token_id"},  // negative
                             {"bos_token_id", "<s>", "bos_token_id"},
                             {"rope_scaling", {{"type", 3}}, "rope_scaling.type"},
                             {"quantization_config", "fp8", "quantization_config"}};
  for (const auto& c : cases) {
    json j = kimi_k2();
    j[c.field] = c.value;
    const std::string err = error_of(j);
    EXPECT_NE(err.find(c.says), std::string::npos) << c.field << " = " << c.value.dump() << ": " << err;
  }
  // 1,024 layers of 4,096 experts each pass one by one, not together (every expert is its own tensors).
  json many = kimi_k2();
  many["num_hidden_layers"] = 1024;
  many["n_routed_experts"] = 4096;
  EXPECT_NE(error_of(many).find("routed experts"), std::string::npos) << error_of(many);
  for (const json& block : {json::array({int64_t{1} << 62, 128}), json::array({128, 1.5}), json::array({0, 128})}) {
    json f = kimi_k2();
    f["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", block}};
    EXPECT_NE(error_of(f).find("weight_block_size"), std::string::npos) << block.dump() << ": " << error_of(f);
  }
  json whole = kimi_k2();
  whole["hidden_size"] = 7168.0;  // whole floats stay accepted
  EXPECT_EQ(error_of(whole), "");
}

}  // namespace
}  // namespace kiln
