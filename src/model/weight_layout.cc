#include "model/weight_layout.h"

#include "core/kv_fp8.h"

#include <fmt/format.h>

namespace kiln {

const char* weight_role_name(WeightRole r) {
  switch (r) {
    case WeightRole::Embedding: return "embedding";
    case WeightRole::LmHead: return "lm_head";
    case WeightRole::Norm: return "norm";
    case WeightRole::Attention: return "attention";
    case WeightRole::DenseMlp: return "dense_mlp";
    case WeightRole::Router: return "router";
    case WeightRole::RoutedExpert: return "routed_expert";
    case WeightRole::SharedExpert: return "shared_expert";
    case WeightRole::Mtp: return "mtp";
  }
  return "?";
}

namespace {

void add_decoder_layer(const ModelConfig& c, int64_t l, bool mtp, std::vector<WeightSpec>& out) {
  const std::string p = fmt::format("model.layers.{}.", l);
  const int64_t H = c.hidden_size, nh = c.num_attention_heads;
  auto add = [&](const std::string& name, Shape shape, WeightRole role, bool matrix, int64_t expert = -1) {
    out.push_back({p + name, std::move(shape), role, l, expert, matrix, mtp});
  };
  add("input_layernorm.weight", {H}, WeightRole::Norm, false);
  add("post_attention_layernorm.weight", {H}, WeightRole::Norm, false);
  if (c.q_lora_rank > 0) {
    add("self_attn.q_a_proj.weight", {c.q_lora_rank, H}, WeightRole::Attention, true);
    add("self_attn.q_a_layernorm.weight", {c.q_lora_rank}, WeightRole::Norm, false);
    add("self_attn.q_b_proj.weight", {nh * c.qk_head_dim(), c.q_lora_rank}, WeightRole::Attention, true);
  } else {
    add("self_attn.q_proj.weight", {nh * c.qk_head_dim(), H}, WeightRole::Attention, true);
  }
  add("self_attn.kv_a_proj_with_mqa.weight", {c.kv_row_dim(), H}, WeightRole::Attention, true);
  add("self_attn.kv_a_layernorm.weight", {c.kv_lora_rank}, WeightRole::Norm, false);
  add("self_attn.kv_b_proj.weight", {nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, WeightRole::Attention,
      true);
  add("self_attn.o_proj.weight", {H, nh * c.v_head_dim}, WeightRole::Attention, true);
  if (!c.is_moe_layer(l)) {
    const int64_t I = c.intermediate_size;
    add("mlp.gate_proj.weight", {I, H}, WeightRole::DenseMlp, true);
    add("mlp.up_proj.weight", {I, H}, WeightRole::DenseMlp, true);
    add("mlp.down_proj.weight", {H, I}, WeightRole::DenseMlp, true);
    return;
  }
  const int64_t I = c.moe_intermediate_size;
  add("mlp.gate.weight", {c.n_routed_experts, H}, WeightRole::Router, false);
  add("mlp.gate.e_score_correction_bias", {c.n_routed_experts}, WeightRole::Router, false);
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    const std::string ep = fmt::format("mlp.experts.{}.", e);
    add(ep + "gate_proj.weight", {I, H}, WeightRole::RoutedExpert, true, e);
    add(ep + "up_proj.weight", {I, H}, WeightRole::RoutedExpert, true, e);
    add(ep + "down_proj.weight", {H, I}, WeightRole::RoutedExpert, true, e);
  }
  if (c.n_shared_experts > 0) {
    const int64_t S = I * c.n_shared_experts;
    add("mlp.shared_experts.gate_proj.weight", {S, H}, WeightRole::SharedExpert, true);
    add("mlp.shared_experts.up_proj.weight", {S, H}, WeightRole::SharedExpert, true);
    add("mlp.shared_experts.down_proj.weight", {H, S}, WeightRole::SharedExpert, true);
  }
}

}  // namespace

std::vector<WeightSpec> weight_layout(const ModelConfig& c) {
  std::vector<WeightSpec> out;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  out.push_back({"model.embed_tokens.weight", {V, H}, WeightRole::Embedding});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) add_decoder_layer(c, l, false, out);
  out.push_back({"model.norm.weight", {H}, WeightRole::Norm});
  if (!c.tie_word_embeddings)
    out.push_back({"lm_head.weight", {V, H}, WeightRole::LmHead});  // kept in bf16 by FP8 checkpoints
  for (int64_t i = 0; i < c.num_nextn_predict_layers; ++i) {
    const int64_t l = c.num_hidden_layers + i;
    add_decoder_layer(c, l, true, out);
    const std::string p = fmt::format("model.layers.{}.", l);
    out.push_back({p + "embed_tokens.weight", {V, H}, WeightRole::Mtp, l, -1, false, true});
    out.push_back({p + "enorm.weight", {H}, WeightRole::Mtp, l, -1, false, true});
    out.push_back({p + "hnorm.weight", {H}, WeightRole::Mtp, l, -1, false, true});
    out.push_back({p + "eh_proj.weight", {H, 2 * H}, WeightRole::Mtp, l, -1, true, true});
    out.push_back({p + "shared_head.norm.weight", {H}, WeightRole::Mtp, l, -1, false, true});
    out.push_back({p + "shared_head.head.weight", {V, H}, WeightRole::Mtp, l, -1, false, true});
  }
  return out;
}

ParamCounts count_params(const ModelConfig& c) {
  ParamCounts p;
  for (const auto& w : weight_layout(c)) {
    const int64_t n = w.numel();
    if (w.mtp) {
      p.mtp += n;
      continue;
    }
    p.total += n;
    if (w.role == WeightRole::Embedding || w.role == WeightRole::LmHead) p.embedding += n;
    if (w.role == WeightRole::RoutedExpert)
      p.routed_expert += n;
    else
      p.active += n;
  }
  // A token runs num_experts_per_tok of the n_routed_experts in every MoE layer.
  if (c.n_routed_experts > 0) p.active += p.routed_expert / c.n_routed_experts * c.num_experts_per_tok;
  return p;
}

int64_t kv_bytes_per_token(const ModelConfig& c, int64_t bytes_per_value) {
  if (bytes_per_value == 1)  // the FP8 row: e4m3 c_kv, its scales and bf16 k_pe (core/kv_fp8.h)
    return c.num_hidden_layers * kv_fp8_layout(c.kv_lora_rank, c.qk_rope_head_dim).row_bytes;
  return c.num_hidden_layers * c.kv_row_dim() * bytes_per_value;
}

}  // namespace kiln
