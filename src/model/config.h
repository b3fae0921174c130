// ModelConfig: the DeepSeek-V3 family config.json (model_type deepseek_v3 or kimi_k2), with the
// defaults transformers' DeepseekV3Config uses for absent keys. Both RoPE spellings are accepted:
// `rope_scaling` + top-level `rope_theta` (published checkpoints) and `rope_parameters` (newer).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

struct RopeConfig {
  std::string type = "default";  // "default" or "yarn"
  double theta = 10000.0;
  // YaRN (type == "yarn"); 0 means "not given".
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  std::optional<double> attention_factor;
};

struct Fp8Quant {
  int64_t block_n = 128;  // rows of W per scale
  int64_t block_k = 128;  // columns of W per scale
};

// compressed-tensors `pack-quantized` INT4 (Kimi K2-Thinking: the routed experts): symmetric,
// weight-only, one scale per `group_size` inputs of a row; eight nibbles per int32 (docs/quantization.md).
struct Int4Quant {
  int64_t group_size = 32;
  // Modules the checkpoint keeps unquantised, as the config lists them: exact module names
  // ("lm_head", "model.layers.0.self_attn.q_a_proj") or "re:" patterns. The tensors themselves
  // say which are packed (weight_packed); exact names here are checked against them.
  std::vector<std::string> ignore;
};

struct ModelConfig {
  std::string model_type = "deepseek_v3";
  int64_t vocab_size = 129280;
  int64_t hidden_size = 7168;
  int64_t intermediate_size = 18432;
  int64_t moe_intermediate_size = 2048;
  int64_t num_hidden_layers = 61;
  int64_t num_attention_heads = 128;
  int64_t n_shared_experts = 1;
  int64_t n_routed_experts = 256;
  int64_t num_experts_per_tok = 8;
  int64_t n_group = 8;
  int64_t topk_group = 4;
  int64_t first_k_dense_replace = 3;
  double routed_scaling_factor = 2.5;
  bool norm_topk_prob = true;
  int64_t q_lora_rank = 1536;  // 0: no q LoRA (q_proj)
  int64_t kv_lora_rank = 512;
  int64_t qk_rope_head_dim = 64;
  int64_t qk_nope_head_dim = 128;
  int64_t v_head_dim = 128;
  int64_t max_position_embeddings = 4096;
  double rms_norm_eps = 1e-6;
  bool rope_interleave = true;
  bool tie_word_embeddings = false;
  int64_t num_nextn_predict_layers = 0;
  RopeConfig rope;
  std::optional<Fp8Quant> fp8;    // quant_method fp8 (DeepSeek-V3 / Kimi K2)
  std::optional<Int4Quant> int4;  // quant_method compressed-tensors, format pack-quantized
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Width of one cached latent row: normalised c_kv then roped k_pe.
  int64_t kv_row_dim() const { return kv_lora_rank + qk_rope_head_dim; }
  bool is_moe_layer(int64_t layer) const { return layer >= first_k_dense_replace && n_routed_experts > 0; }
  // Softmax scale of q·k, YaRN's mscale_all_dim correction included (as transformers applies it).
  double softmax_scale() const;
  // The multiplier YaRN puts on cos/sin ("attention_factor").
  double rope_attention_factor() const;
  // Inverse frequencies of the qk_rope_head_dim/2 rotary pairs.
  std::vector<double> rope_inv_freq() const;
};

// Parses a config.json object; `source` names the file in error messages. An unsupported value is
// an error naming the field.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source);
ModelConfig load_model_config(const std::string& path);
// Reads `quantization_config` (absent or null: none) into c.fp8 / c.int4 (model/quant_config.cc).
void parse_quantization_config(const nlohmann::json& j, const std::string& source, ModelConfig& c);
// The config as a JSON object (canonical spelling), for model-info and tests.
nlohmann::json model_config_to_json(const ModelConfig& c);

}  // namespace kiln
