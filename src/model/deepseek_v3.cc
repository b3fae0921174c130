#include "model/deepseek_v3.h"

#include <filesystem>

#include "core/error.h"
#include "core/log.h"

namespace kiln {

DeepseekV3Model::DeepseekV3Model(ModelConfig config, ModelWeights weights, ops::Backend& backend)
    : c_(std::move(config)), w_(std::move(weights)), be_(backend) {
  std::vector<double> inv = c_.rope_inv_freq();
  std::vector<float> invf(inv.begin(), inv.end());
  inv_freq_ = be_.alloc(DType::F32, {static_cast<int64_t>(invf.size())});
  be_.upload(inv_freq_.t, invf.data());
  rope_factor_ = static_cast<float>(c_.rope_attention_factor());
  scale_ = static_cast<float>(c_.softmax_scale());
}

std::unique_ptr<DeepseekV3Model> DeepseekV3Model::load(const std::string& dir, ops::Backend& backend) {
  ModelConfig c = load_model_config((std::filesystem::path(dir) / "config.json").string());
  Checkpoint ckpt(dir);
  ModelWeights w = load_weights(c, ckpt, backend);
  return std::make_unique<DeepseekV3Model>(std::move(c), std::move(w), backend);
}

SequenceCache DeepseekV3Model::new_cache(int64_t capacity) const {
  SequenceCache s;
  s.capacity = capacity;
  for (int64_t l = 0; l < c_.num_hidden_layers; ++l)
    s.layers.push_back(be_.alloc(DType::F32, {capacity, c_.kv_row_dim()}));
  return s;
}

OwnedTensor DeepseekV3Model::scratch(int64_t rows, int64_t cols) {
  return be_.alloc(DType::F32, {rows, cols});
}

std::vector<float> DeepseekV3Model::forward(const std::vector<int32_t>& tokens, SequenceCache& cache, bool all_logits,
                                            MlaForm form) {
  const int64_t T = static_cast<int64_t>(tokens.size()), H = c_.hidden_size, V = c_.vocab_size;
  KILN_CHECK(T > 0, "forward needs at least one token");
  KILN_CHECK(cache.length + T <= cache.capacity, "sequence of {} tokens exceeds its cache capacity {}",
             cache.length + T, cache.capacity);
  for (int32_t id : tokens) KILN_CHECK(id >= 0 && id < V, "token id {} is outside the vocabulary [0, {})", id, V);

  std::vector<int32_t> pos_host(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) pos_host[static_cast<size_t>(i)] = static_cast<int32_t>(cache.length + i);
  OwnedTensor ids = be_.alloc(DType::I32, {T}), pos = be_.alloc(DType::I32, {T});
  be_.upload(ids.t, tokens.data());
  be_.upload(pos.t, pos_host.data());

  OwnedTensor x = scratch(T, H), h = scratch(T, H), y = scratch(T, H);  // x: the residual stream [T, H]
  be_.embedding({ids.t.as<int32_t>(), w_.embed.t.data, w_.embed.t.dtype, x.f32(), T, V, H});
  const float eps = static_cast<float>(c_.rms_norm_eps);
  for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
    const LayerWeights& lw = w_.layers[static_cast<size_t>(l)];
    be_.rms_norm({x.f32(), 0, lw.input_norm.t.data, lw.input_norm.t.dtype, h.f32(), 0, T, H, eps});
    attention(l, h.f32(), y.f32(), T, cache, form, pos.t.as<int32_t>());
    be_.add({x.f32(), y.f32(), x.f32(), T * H});
    be_.rms_norm({x.f32(), 0, lw.post_attn_norm.t.data, lw.post_attn_norm.t.dtype, h.f32(), 0, T, H, eps});
    ffn(l, h.f32(), y.f32(), T);
    be_.add({x.f32(), y.f32(), x.f32(), T * H});
  }
  cache.length += T;

  const int64_t rows = all_logits ? T : 1;
  const float* last = x.f32() + (T - rows) * H;
  be_.rms_norm({last, 0, w_.final_norm.t.data, w_.final_norm.t.dtype, h.f32(), 0, rows, H, eps});
  OwnedTensor logits = scratch(rows, V);
  be_.linear({h.f32(), 0, w_.lm_head.t.data, w_.lm_head.t.dtype, logits.f32(), 0, rows, V, H});
  std::vector<float> out(static_cast<size_t>(rows * V));
  be_.download(out.data(), logits.t);
  return out;
}

void DeepseekV3Model::attention(int64_t l, const float* x, float* out, int64_t T, SequenceCache& cache, MlaForm form,
                                const int32_t* positions) {
  const LayerWeights& w = w_.layers[static_cast<size_t>(l)];
  const int64_t H = c_.hidden_size, nh = c_.num_attention_heads, nope = c_.qk_nope_head_dim, rope = c_.qk_rope_head_dim,
                qk = c_.qk_head_dim(), vd = c_.v_head_dim, r = c_.kv_lora_rank, row = c_.kv_row_dim();
  const float eps = static_cast<float>(c_.rms_norm_eps);

  // q [T, nh, qk]: q_nope ‖ q_pe per head.
  OwnedTensor q = scratch(T, nh * qk);
  if (c_.q_lora_rank > 0) {
    OwnedTensor qa = scratch(T, c_.q_lora_rank);  // [T, q_lora]
    be_.linear({x, 0, w.q_a.t.data, w.q_a.t.dtype, qa.f32(), 0, T, c_.q_lora_rank, H});
    be_.rms_norm({qa.f32(), 0, w.q_a_norm.t.data, w.q_a_norm.t.dtype, qa.f32(), 0, T, c_.q_lora_rank, eps});
    be_.linear({qa.f32(), 0, w.q_b.t.data, w.q_b.t.dtype, q.f32(), 0, T, nh * qk, c_.q_lora_rank});
  } else {
    be_.linear({x, 0, w.q_proj.t.data, w.q_proj.t.dtype, q.f32(), 0, T, nh * qk, H});
  }
  be_.rope({q.f32() + nope, T, nh, nh * qk, qk, rope, positions, inv_freq_.f32(), rope_factor_, c_.rope_interleave});

  // New latent rows go straight into the cache: normalised c_kv ‖ roped k_pe.
  OwnedTensor kva = scratch(T, row);  // [T, kv_lora + rope]
  be_.linear({x, 0, w.kv_a.t.data, w.kv_a.t.dtype, kva.f32(), 0, T, row, H});
  float* rows = cache.layers[static_cast<size_t>(l)].f32() + cache.length * row;
  be_.rms_norm({kva.f32(), row, w.kv_a_norm.t.data, w.kv_a_norm.t.dtype, rows, row, T, r, eps});
  be_.copy({kva.f32() + r, row, rows + r, row, T, rope});
  be_.rope({rows + r, T, 1, row, 0, rope, positions, inv_freq_.f32(), rope_factor_, c_.rope_interleave});

  const int64_t ctx = cache.length + T;
  const float* kv = cache.layers[static_cast<size_t>(l)].f32();  // [ctx, row]
  const int32_t cu_q[2] = {0, static_cast<int32_t>(T)}, cu_kv[2] = {0, static_cast<int32_t>(ctx)};
  OwnedTensor cuq = be_.alloc(DType::I32, {2}), cukv = be_.alloc(DType::I32, {2});
  be_.upload(cuq.t, cu_q);
  be_.upload(cukv.t, cu_kv);
  const ops::VarlenSeqs seqs{cuq.t.as<int32_t>(), cukv.t.as<int32_t>(), 1};
  OwnedTensor o = scratch(T, nh * vd);  // [T, nh, v]
  if (form == MlaForm::Auto) form = T == 1 ? MlaForm::Absorbed : MlaForm::Expanded;

  if (form == MlaForm::Expanded) {
    OwnedTensor kvb = scratch(ctx, nh * (nope + vd));  // [ctx, nh, nope + v]
    be_.linear({kv, row, w.kv_b.t.data, w.kv_b.t.dtype, kvb.f32(), 0, ctx, nh * (nope + vd), r});
    OwnedTensor k = scratch(ctx, nh * qk), v = scratch(ctx, nh * vd);  // [ctx, nh, qk], [ctx, nh, v]
    be_.copy({kvb.f32(), nope + vd, k.f32(), qk, ctx * nh, nope});
    be_.copy({kvb.f32() + nope, nope + vd, v.f32(), vd, ctx * nh, vd});
    for (int64_t hd = 0; hd < nh; ++hd) be_.copy({kv + r, row, k.f32() + hd * qk + nope, nh * qk, ctx, rope});
    be_.mla_expanded({q.f32(), k.f32(), v.f32(), o.f32(), seqs, nh, qk, vd, scale_});
  } else {
    // Fold W_uk into q: q_lat[h] = W_uk[h]ᵀ q_nope[h]; the rope part rides along unchanged.
    OwnedTensor qa = scratch(T, nh * row);  // [T, nh, kv_lora + rope]
    const size_t uk_esz = dtype_size(w.w_uk_t.t.dtype);
    for (int64_t hd = 0; hd < nh; ++hd) {
      const void* wuk = static_cast<const char*>(w.w_uk_t.t.data) + static_cast<size_t>(hd * r * nope) * uk_esz;
      be_.linear({q.f32() + hd * qk, nh * qk, wuk, w.w_uk_t.t.dtype, qa.f32() + hd * row, nh * row, T, r, nope});
    }
    be_.copy({q.f32() + nope, qk, qa.f32() + r, row, T * nh, rope});
    OwnedTensor lat = scratch(T, nh * r);  // [T, nh, kv_lora]
    be_.mla_absorbed({qa.f32(), kv, lat.f32(), seqs, nh, r, rope, scale_});
    // Fold W_uv into the output: v[h] = W_uv[h] · lat[h].
    const size_t esz = dtype_size(w.kv_b.t.dtype);
    for (int64_t hd = 0; hd < nh; ++hd) {
      const void* wuv =
          static_cast<const char*>(w.kv_b.t.data) + static_cast<size_t>((hd * (nope + vd) + nope) * r) * esz;
      be_.linear({lat.f32() + hd * r, nh * r, wuv, w.kv_b.t.dtype, o.f32() + hd * vd, nh * vd, T, vd, r});
    }
  }
  be_.linear({o.f32(), 0, w.o_proj.t.data, w.o_proj.t.dtype, out, 0, T, H, nh * vd});
}

void DeepseekV3Model::ffn(int64_t l, const float* x, float* out, int64_t T) {
  const LayerWeights& w = w_.layers[static_cast<size_t>(l)];
  const int64_t H = c_.hidden_size;
  auto mlp = [&](const OwnedTensor& gate_up, const OwnedTensor& down, float* dst) {
    const int64_t inter = gate_up.t.shape[0] / 2;
    OwnedTensor gu = scratch(T, 2 * inter), act = scratch(T, inter);
    be_.linear({x, 0, gate_up.t.data, gate_up.t.dtype, gu.f32(), 0, T, 2 * inter, H});
    be_.swiglu({gu.f32(), act.f32(), T, inter});
    be_.linear({act.f32(), 0, down.t.data, down.t.dtype, dst, 0, T, H, inter});
  };
  if (!w.moe) {
    mlp(w.mlp_gate_up, w.mlp_down, out);
    return;
  }
  const int64_t E = c_.n_routed_experts, k = c_.num_experts_per_tok;
  OwnedTensor logits = scratch(T, E);  // [T, E] router logits in f32
  be_.linear({x, 0, w.router.t.data, w.router.t.dtype, logits.f32(), 0, T, E, H});
  OwnedTensor ids = be_.alloc(DType::I32, {T, k}), wts = scratch(T, k);
  be_.router({logits.f32(), w.router_bias.f32(), ids.t.as<int32_t>(), wts.f32(), T, E, k, c_.n_group, c_.topk_group,
              c_.norm_topk_prob, static_cast<float>(c_.routed_scaling_factor)});
  be_.moe({x, ids.t.as<int32_t>(), wts.f32(), w.experts_gate_up.t.data, w.experts_down.t.data,
           w.experts_gate_up.t.dtype, out, T, H, c_.moe_intermediate_size, E, k});
  if (c_.n_shared_experts > 0) {
    OwnedTensor s = scratch(T, H);
    mlp(w.shared_gate_up, w.shared_down, s.f32());
    be_.add({out, s.f32(), out, T * H});
  }
}

}  // namespace kiln
