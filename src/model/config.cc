#include "model/config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace kiln {
namespace {

using json = nlohmann::json;

// Reads field `key` into `out` when present and not null; a value of the wrong type is an error
// naming the field.
template <typename T>
void read(const json& j, const char* key, T& out, const std::string& src) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  try {
    if constexpr (std::is_same_v<T, bool>) {
      KILN_CHECK(it->is_boolean(), "expected a boolean");
    } else if constexpr (std::is_integral_v<T>) {
      // Whole floats are taken (some writers emit 2048.0); past T's range a conversion would be
      // undefined, and 2^64 - 1 would read as -1.
      const bool whole = it->is_number_float() && std::floor(it->get<double>()) == it->get<double>() &&
                         std::fabs(it->get<double>()) < 0x1p62;
      const bool in_range = it->is_number_integer() &&
                            (!it->is_number_unsigned() || it->get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX));
      KILN_CHECK(in_range || whole, "expected an integer (within int64; written as a float, whole and below 2^62)");
    } else if constexpr (std::is_floating_point_v<T>) {
      KILN_CHECK(it->is_number(), "expected a number");
    }
    out = it->get<T>();
  } catch (const std::exception& e) {
    fail("{}: field \"{}\" has an invalid value {}: {}", src, key, it->dump(), e.what());
  }
}

void require_positive(int64_t v, const char* key, const std::string& src) {
  KILN_CHECK(v > 0, "{}: field \"{}\" must be positive, got {}", src, key, v);
}

// A size field between 1 and max. The caps are far past any published model (DeepSeek-V3: hidden
// 7,168, 61 layers, 256 experts; Kimi K2: 384 experts) and keep every shape product and parameter
// sum inside int64, so a corrupt config fails here and not as an overflow or a huge allocation.
void require_size(int64_t v, const char* key, const std::string& src, int64_t max) {
  require_positive(v, key, src);
  KILN_CHECK(v <= max, "{}: field \"{}\" is {}, past the supported maximum {}", src, key, v, max);
}

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

void parse_rope(const json& j, ModelConfig& c, const std::string& src) {
  read(j, "rope_theta", c.rope.theta, src);
  const json* r = nullptr;
  const char* which = "rope_scaling";
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    r = &*it;
    which = "rope_parameters";
  } else if (auto it2 = j.find("rope_scaling"); it2 != j.end() && !it2->is_null()) {
    r = &*it2;
  }
  if (!r) return;
  std::string field = which;
  KILN_CHECK(r->is_object(), "{}: field \"{}\" must be an object", src, field);
  // A nested per-layer-type form ({"full_attention": {...}}) is not used by this family.
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (!r->contains(key)) continue;
    KILN_CHECK(r->at(key).is_string(), "{}: field \"{}.{}\" must be a string, got {}", src, field, key,
               r->at(key).dump());
    type = r->at(key).get<std::string>();
    break;
  }
  KILN_CHECK(type == "default" || type == "yarn", "{}: field \"{}.rope_type\" is \"{}\"; supported: default, yarn", src,
             field, type);
  c.rope.type = type;
  std::string sub = src + " (" + field + ")";
  read(*r, "rope_theta", c.rope.theta, sub);
  if (type == "yarn") {
    KILN_CHECK(r->contains("factor"), "{}: field \"{}.factor\" is required for yarn", src, field);
    read(*r, "factor", c.rope.factor, sub);
    read(*r, "original_max_position_embeddings", c.rope.original_max_position_embeddings, sub);
    read(*r, "beta_fast", c.rope.beta_fast, sub);
    read(*r, "beta_slow", c.rope.beta_slow, sub);
    read(*r, "mscale", c.rope.mscale, sub);
    read(*r, "mscale_all_dim", c.rope.mscale_all_dim, sub);
    double af = 0;
    if (r->contains("attention_factor") && !r->at("attention_factor").is_null()) {
      read(*r, "attention_factor", af, sub);
      c.rope.attention_factor = af;
    }
    KILN_CHECK(c.rope.factor >= 1.0, "{}: field \"{}.factor\" must be >= 1, got {}", src, field, c.rope.factor);
  }
  KILN_CHECK(c.rope.theta > 0, "{}: field \"rope_theta\" must be positive", src);
}

}  // namespace

double ModelConfig::softmax_scale() const {
  double s = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope.type != "default" && rope.mscale_all_dim != 0.0) {
    double m = yarn_get_mscale(rope.factor, rope.mscale_all_dim);
    s *= m * m;
  }
  return s;
}

// transformers: when original_max_position_embeddings is given, the factor used for the
// frequencies and the attention factor is max_position_embeddings / original (equal to `factor`
// in every published checkpoint).
static double effective_yarn_factor(const ModelConfig& c) {
  if (c.rope.original_max_position_embeddings > 0)
    return static_cast<double>(c.max_position_embeddings) /
           static_cast<double>(c.rope.original_max_position_embeddings);
  return c.rope.factor;
}

double ModelConfig::rope_attention_factor() const {
  if (rope.type != "yarn") return 1.0;
  if (rope.attention_factor) return *rope.attention_factor;
  double f = effective_yarn_factor(*this);
  if (rope.mscale != 0.0 && rope.mscale_all_dim != 0.0)
    return yarn_get_mscale(f, rope.mscale) / yarn_get_mscale(f, rope.mscale_all_dim);
  return yarn_get_mscale(f, 1.0);
}

std::vector<double> ModelConfig::rope_inv_freq() const {
  const int64_t dim = qk_rope_head_dim;
  const int64_t half = dim / 2;
  // transformers computes these in float32; matching that keeps long-position phases identical.
  std::vector<float> pos_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    pos_freq[static_cast<size_t>(i)] =
        std::pow(static_cast<float>(rope.theta), static_cast<float>(2 * i) / static_cast<float>(dim));
  std::vector<double> inv(static_cast<size_t>(half));
  if (rope.type != "yarn") {
    for (size_t i = 0; i < inv.size(); ++i) inv[i] = 1.0f / pos_freq[i];
    return inv;
  }
  const double factor = effective_yarn_factor(*this);
  const double orig = rope.original_max_position_embeddings > 0
                          ? static_cast<double>(rope.original_max_position_embeddings)
                          : static_cast<double>(max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) * std::log(orig / (rotations * 2.0 * M_PI))) / (2.0 * std::log(rope.theta));
  };
  double low = std::max(std::floor(correction_dim(rope.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(rope.beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    float ramp = static_cast<float>((static_cast<double>(i) - low) / (high - low));
    ramp = std::min(1.0f, std::max(0.0f, ramp));
    float extrap_factor = 1.0f - ramp;
    float extrap = 1.0f / pos_freq[static_cast<size_t>(i)];
    float interp = 1.0f / (static_cast<float>(factor) * pos_freq[static_cast<size_t>(i)]);
    inv[static_cast<size_t>(i)] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
  }
  return inv;
}

ModelConfig parse_model_config(const json& j, const std::string& src) {
  KILN_CHECK(j.is_object(), "{}: config must be a JSON object", src);
  ModelConfig c;
  read(j, "model_type", c.model_type, src);
  KILN_CHECK(c.model_type == "deepseek_v3" || c.model_type == "kimi_k2",
             "{}: field \"model_type\" is \"{}\"; supported: deepseek_v3, kimi_k2", src, c.model_type);
  read(j, "vocab_size", c.vocab_size, src);
  read(j, "hidden_size", c.hidden_size, src);
  read(j, "intermediate_size", c.intermediate_size, src);
  read(j, "moe_intermediate_size", c.moe_intermediate_size, src);
  read(j, "num_hidden_layers", c.num_hidden_layers, src);
  read(j, "num_attention_heads", c.num_attention_heads, src);
  read(j, "n_shared_experts", c.n_shared_experts, src);
  read(j, "n_routed_experts", c.n_routed_experts, src);
  read(j, "num_experts_per_tok", c.num_experts_per_tok, src);
  read(j, "n_group", c.n_group, src);
  read(j, "topk_group", c.topk_group, src);
  read(j, "first_k_dense_replace", c.first_k_dense_replace, src);
  read(j, "routed_scaling_factor", c.routed_scaling_factor, src);
  read(j, "norm_topk_prob", c.norm_topk_prob, src);
  if (auto it = j.find("q_lora_rank"); it != j.end()) {
    if (it->is_null())
      c.q_lora_rank = 0;
    else
      read(j, "q_lora_rank", c.q_lora_rank, src);
  }
  read(j, "kv_lora_rank", c.kv_lora_rank, src);
  read(j, "qk_rope_head_dim", c.qk_rope_head_dim, src);
  read(j, "qk_nope_head_dim", c.qk_nope_head_dim, src);
  read(j, "v_head_dim", c.v_head_dim, src);
  read(j, "max_position_embeddings", c.max_position_embeddings, src);
  read(j, "rms_norm_eps", c.rms_norm_eps, src);
  read(j, "rope_interleave", c.rope_interleave, src);
  read(j, "tie_word_embeddings", c.tie_word_embeddings, src);
  read(j, "num_nextn_predict_layers", c.num_nextn_predict_layers, src);
  parse_rope(j, c, src);

  std::string act = "silu", scoring = "sigmoid", topk_method = "noaux_tc";
  read(j, "hidden_act", act, src);
  read(j, "scoring_func", scoring, src);
  read(j, "topk_method", topk_method, src);
  KILN_CHECK(act == "silu", "{}: field \"hidden_act\" is \"{}\"; supported: silu", src, act);
  KILN_CHECK(scoring == "sigmoid", "{}: field \"scoring_func\" is \"{}\"; supported: sigmoid", src, scoring);
  KILN_CHECK(topk_method == "noaux_tc", "{}: field \"topk_method\" is \"{}\"; supported: noaux_tc", src, topk_method);
  int64_t moe_layer_freq = 1;
  read(j, "moe_layer_freq", moe_layer_freq, src);
  KILN_CHECK(moe_layer_freq == 1, "{}: field \"moe_layer_freq\" is {}; supported: 1", src, moe_layer_freq);
  bool attention_bias = false;
  read(j, "attention_bias", attention_bias, src);
  KILN_CHECK(!attention_bias, "{}: field \"attention_bias\" is true; supported: false", src);

  require_size(c.vocab_size, "vocab_size", src, int64_t{1} << 24);
  require_size(c.hidden_size, "hidden_size", src, int64_t{1} << 17);
  require_size(c.num_hidden_layers, "num_hidden_layers", src, 1024);
  require_size(c.num_attention_heads, "num_attention_heads", src, 4096);
  require_size(c.kv_lora_rank, "kv_lora_rank", src, int64_t{1} << 16);
  require_size(c.qk_nope_head_dim, "qk_nope_head_dim", src, int64_t{1} << 14);
  require_size(c.v_head_dim, "v_head_dim", src, int64_t{1} << 14);
  require_size(c.max_position_embeddings, "max_position_embeddings", src, int64_t{1} << 30);
  require_size(c.qk_rope_head_dim, "qk_rope_head_dim", src, int64_t{1} << 14);
  KILN_CHECK(c.qk_rope_head_dim % 2 == 0, "{}: field \"qk_rope_head_dim\" must be even, got {}", src,
             c.qk_rope_head_dim);
  KILN_CHECK(c.q_lora_rank >= 0, "{}: field \"q_lora_rank\" must be null or positive", src);
  if (c.q_lora_rank > 0) require_size(c.q_lora_rank, "q_lora_rank", src, int64_t{1} << 16);
  KILN_CHECK(c.rms_norm_eps > 0, "{}: field \"rms_norm_eps\" must be positive", src);
  KILN_CHECK(c.first_k_dense_replace >= 0, "{}: field \"first_k_dense_replace\" must be >= 0", src);
  KILN_CHECK(c.num_nextn_predict_layers >= 0 && c.num_nextn_predict_layers <= 64,
             "{}: field \"num_nextn_predict_layers\" must be 0 to 64, got {}", src, c.num_nextn_predict_layers);
  if (c.first_k_dense_replace > 0) require_size(c.intermediate_size, "intermediate_size", src, int64_t{1} << 20);
  if (c.first_k_dense_replace < c.num_hidden_layers) {
    require_size(c.n_routed_experts, "n_routed_experts", src, 4096);
    require_size(c.moe_intermediate_size, "moe_intermediate_size", src, int64_t{1} << 18);
    require_positive(c.num_experts_per_tok, "num_experts_per_tok", src);
    require_positive(c.n_group, "n_group", src);
    require_positive(c.topk_group, "topk_group", src);
    KILN_CHECK(c.n_shared_experts >= 0 && c.n_shared_experts <= 1024,
               "{}: field \"n_shared_experts\" must be 0 to 1024, got {}", src, c.n_shared_experts);
    // Every routed expert is its own tensors in the checkpoint (and in the weight layout).
    const int64_t moe_layers =
        c.num_hidden_layers + c.num_nextn_predict_layers - std::min(c.first_k_dense_replace, c.num_hidden_layers);
    KILN_CHECK(moe_layers * c.n_routed_experts <= (int64_t{1} << 18),
               "{}: {} MoE layers of {} routed experts are past the supported {} experts in all", src, moe_layers,
               c.n_routed_experts, int64_t{1} << 18);
    KILN_CHECK(c.n_routed_experts % c.n_group == 0, "{}: field \"n_group\" ({}) must divide n_routed_experts ({})", src,
               c.n_group, c.n_routed_experts);
    KILN_CHECK(c.topk_group <= c.n_group, "{}: field \"topk_group\" ({}) exceeds n_group ({})", src, c.topk_group,
               c.n_group);
    KILN_CHECK(c.n_routed_experts / c.n_group >= 2, "{}: field \"n_group\": each group needs at least 2 experts", src);
    KILN_CHECK(c.num_experts_per_tok <= c.topk_group * (c.n_routed_experts / c.n_group),
               "{}: field \"num_experts_per_tok\" ({}) exceeds the experts in topk_group groups", src,
               c.num_experts_per_tok);
  }

  parse_quantization_config(j, src, c);
  // Special token ids index the vocabulary.
  auto token_id = [&](const json& v, const char* key) {
    KILN_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < c.vocab_size,
               "{}: field \"{}\" must hold token ids 0 to vocab_size - 1 ({}), got {}", src, key, c.vocab_size - 1,
               v.dump());
    return v.get<int64_t>();
  };
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    if (it->is_array()) {
      for (auto& v : *it) c.eos_token_ids.push_back(token_id(v, "eos_token_id"));
    } else {
      c.eos_token_ids.push_back(token_id(*it, "eos_token_id"));
    }
  }
  if (auto it = j.find("bos_token_id"); it != j.end() && !it->is_null()) c.bos_token_id = token_id(*it, "bos_token_id");
  return c;
}

ModelConfig load_model_config(const std::string& path) {
  std::error_code ec;  // the throwing overload would escape as a filesystem_error (EACCES, ...)
  KILN_CHECK(!std::filesystem::is_directory(path, ec), "config file {} is a directory", path);
  std::ifstream f(path);
  KILN_CHECK(f.good(), "cannot open config file {}", path);
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
  return parse_model_config(j, path);
}

json model_config_to_json(const ModelConfig& c) {
  json r = {{"model_type", c.model_type},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"moe_intermediate_size", c.moe_intermediate_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"n_shared_experts", c.n_shared_experts},
            {"n_routed_experts", c.n_routed_experts},
            {"num_experts_per_tok", c.num_experts_per_tok},
            {"n_group", c.n_group},
            {"topk_group", c.topk_group},
            {"first_k_dense_replace", c.first_k_dense_replace},
            {"routed_scaling_factor", c.routed_scaling_factor},
            {"norm_topk_prob", c.norm_topk_prob},
            {"q_lora_rank", c.q_lora_rank ? json(c.q_lora_rank) : json(nullptr)},
            {"kv_lora_rank", c.kv_lora_rank},
            {"qk_rope_head_dim", c.qk_rope_head_dim},
            {"qk_nope_head_dim", c.qk_nope_head_dim},
            {"v_head_dim", c.v_head_dim},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_interleave", c.rope_interleave},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"num_nextn_predict_layers", c.num_nextn_predict_layers}};
  json rope = {{"rope_type", c.rope.type}, {"rope_theta", c.rope.theta}};
  if (c.rope.type == "yarn") {
    rope["factor"] = c.rope.factor;
    rope["original_max_position_embeddings"] = c.rope.original_max_position_embeddings;
    rope["beta_fast"] = c.rope.beta_fast;
    rope["beta_slow"] = c.rope.beta_slow;
    rope["mscale"] = c.rope.mscale;
    rope["mscale_all_dim"] = c.rope.mscale_all_dim;
  }
  r["rope_parameters"] = rope;
  if (c.fp8)
    r["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {c.fp8->block_n, c.fp8->block_k}}};
  if (c.int4)
    r["quantization_config"] = {{"quant_method", "compressed-tensors"},
                                {"format", "pack-quantized"},
                                {"group_size", c.int4->group_size},
                                {"ignore", c.int4->ignore}};
  return r;
}

}  // namespace kiln
