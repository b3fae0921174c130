#include "model/deepseek_v3.h"

#include <algorithm>
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

LatentKvPool DeepseekV3Model::new_pool(int64_t num_blocks, int64_t block_size) const {
  KILN_CHECK(num_blocks > 0 && block_size > 0, "KV pool needs positive blocks and block size, got {} x {}", num_blocks,
             block_size);
  LatentKvPool p;
  p.num_blocks = num_blocks;
  p.block_size = block_size;
  p.row_dim = c_.kv_row_dim();
  for (int64_t l = 0; l < c_.num_hidden_layers; ++l)
    p.layers.push_back(be_.alloc(DType::F32, {num_blocks * block_size, p.row_dim}));
  return p;
}

SequenceCache DeepseekV3Model::new_cache(int64_t capacity, int64_t block_size) const {
  SequenceCache s;
  s.capacity = capacity;
  s.pool = new_pool(std::max<int64_t>(1, (capacity + block_size - 1) / block_size), block_size);
  return s;
}

OwnedTensor DeepseekV3Model::scratch(int64_t rows, int64_t cols) {
  return be_.alloc(DType::F32, {rows, cols});
}

std::vector<float> DeepseekV3Model::forward(const std::vector<int32_t>& tokens, SequenceCache& cache, bool all_logits,
                                            MlaForm form) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  KILN_CHECK(T > 0, "forward needs at least one token");
  KILN_CHECK(cache.length + T <= cache.capacity, "sequence of {} tokens exceeds its cache capacity {}",
             cache.length + T, cache.capacity);
  ForwardBatch b;
  b.tokens = tokens;
  b.cu_q = {0, static_cast<int32_t>(T)};
  b.kv_lens = {static_cast<int32_t>(cache.length + T)};
  b.max_blocks = cache.pool.num_blocks;
  for (int64_t i = 0; i < b.max_blocks; ++i) b.block_tables.push_back(static_cast<int32_t>(i));
  for (int64_t i = 0; i < T; ++i) {
    b.positions.push_back(static_cast<int32_t>(cache.length + i));
    b.slot_mapping.push_back(static_cast<int32_t>(cache.length + i));  // identity block table
    if (all_logits || i == T - 1) b.logit_rows.push_back(static_cast<int32_t>(i));
  }
  auto out = forward(b, cache.pool, form);
  cache.length += T;
  return out;
}

// The batch's index arrays, uploaded once per step.
struct DeepseekV3Model::StepInputs {
  int64_t T = 0, B = 0, total_kv = 0;
  bool all_single = true;  // every sequence has one new token (a pure decode step)
  OwnedTensor ids, pos, cu_q, kv_lens, block_tables, slots, cu_kv;
  ops::PagedKv paged(const LatentKvPool& pool, int64_t layer) const {
    return {pool.layers[static_cast<size_t>(layer)].f32(), block_tables.t.as<int32_t>(), kv_lens.t.as<int32_t>(),
            pool.block_size, block_tables.t.shape[1]};
  }
};

std::vector<float> DeepseekV3Model::forward(const ForwardBatch& batch, LatentKvPool& pool, MlaForm form) {
  const int64_t T = batch.num_tokens(), B = batch.num_seqs(), H = c_.hidden_size, V = c_.vocab_size;
  KILN_CHECK(T > 0 && B > 0, "forward needs at least one token");
  KILN_CHECK(static_cast<int64_t>(batch.cu_q.size()) == B + 1 && batch.cu_q.back() == T &&
                 static_cast<int64_t>(batch.positions.size()) == T &&
                 static_cast<int64_t>(batch.slot_mapping.size()) == T &&
                 static_cast<int64_t>(batch.block_tables.size()) == B * batch.max_blocks,
             "malformed ForwardBatch: {} tokens, {} sequences", T, B);
  for (int32_t id : batch.tokens) KILN_CHECK(id >= 0 && id < V, "token id {} is outside the vocabulary [0, {})", id, V);
  for (int32_t s : batch.slot_mapping)
    KILN_CHECK(s >= 0 && s < pool.num_slots(), "slot {} is outside the KV pool ({} slots)", s, pool.num_slots());
  for (int32_t p : batch.positions)
    KILN_CHECK(p >= 0 && p < c_.max_position_embeddings, "position {} exceeds max_position_embeddings {}", p,
               c_.max_position_embeddings);

  StepInputs in;
  in.T = T;
  in.B = B;
  std::vector<int32_t> cu_kv(static_cast<size_t>(B + 1), 0);
  for (int64_t b = 0; b < B; ++b) {
    const int32_t q_len = batch.cu_q[static_cast<size_t>(b + 1)] - batch.cu_q[static_cast<size_t>(b)];
    KILN_CHECK(q_len >= 1 && batch.kv_lens[static_cast<size_t>(b)] >= q_len &&
                   batch.kv_lens[static_cast<size_t>(b)] <= batch.max_blocks * pool.block_size,
               "malformed ForwardBatch: sequence {} has {} new tokens and {} in context", b, q_len,
               batch.kv_lens[static_cast<size_t>(b)]);
    in.all_single &= q_len == 1;
    cu_kv[static_cast<size_t>(b + 1)] = cu_kv[static_cast<size_t>(b)] + batch.kv_lens[static_cast<size_t>(b)];
  }
  in.total_kv = cu_kv.back();
  auto upload_i32 = [&](const std::vector<int32_t>& v, Shape shape) {
    OwnedTensor t = be_.alloc(DType::I32, std::move(shape));
    be_.upload(t.t, v.data());
    return t;
  };
  in.ids = upload_i32(batch.tokens, {T});
  in.pos = upload_i32(batch.positions, {T});
  in.cu_q = upload_i32(batch.cu_q, {B + 1});
  in.kv_lens = upload_i32(batch.kv_lens, {B});
  in.block_tables = upload_i32(batch.block_tables, {B, batch.max_blocks});
  in.slots = upload_i32(batch.slot_mapping, {T});
  in.cu_kv = upload_i32(cu_kv, {B + 1});

  OwnedTensor x = scratch(T, H), h = scratch(T, H), y = scratch(T, H);  // x: the residual stream [T, H]
  be_.embedding({in.ids.t.as<int32_t>(), w_.embed.t.data, w_.embed.t.dtype, x.f32(), T, V, H});
  const float eps = static_cast<float>(c_.rms_norm_eps);
  for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
    const LayerWeights& lw = w_.layers[static_cast<size_t>(l)];
    be_.rms_norm({x.f32(), 0, lw.input_norm.t.data, lw.input_norm.t.dtype, h.f32(), 0, T, H, eps});
    attention(l, h.f32(), y.f32(), in, pool, form);
    be_.add({x.f32(), y.f32(), x.f32(), T * H});
    be_.rms_norm({x.f32(), 0, lw.post_attn_norm.t.data, lw.post_attn_norm.t.dtype, h.f32(), 0, T, H, eps});
    ffn(l, h.f32(), y.f32(), T);
    be_.add({x.f32(), y.f32(), x.f32(), T * H});
  }

  // Only the requested rows go through the final norm and the vocabulary projection.
  const int64_t rows = static_cast<int64_t>(batch.logit_rows.size());
  if (rows == 0) return {};
  OwnedTensor sel = scratch(rows, H);
  for (int64_t i = 0; i < rows; ++i) {
    const int32_t r = batch.logit_rows[static_cast<size_t>(i)];
    KILN_CHECK(r >= 0 && r < T, "logit row {} is outside the batch of {} tokens", r, T);
    be_.copy({x.f32() + r * H, H, sel.f32() + i * H, H, 1, H});
  }
  be_.rms_norm({sel.f32(), 0, w_.final_norm.t.data, w_.final_norm.t.dtype, sel.f32(), 0, rows, H, eps});
  OwnedTensor logits = scratch(rows, V);
  be_.linear({sel.f32(), 0, w_.lm_head.t.data, w_.lm_head.t.dtype, logits.f32(), 0, rows, V, H});
  std::vector<float> out(static_cast<size_t>(rows * V));
  be_.download(out.data(), logits.t);
  return out;
}

void DeepseekV3Model::attention(int64_t l, const float* x, float* out, const StepInputs& in, LatentKvPool& pool,
                                MlaForm form) {
  const LayerWeights& w = w_.layers[static_cast<size_t>(l)];
  const int64_t T = in.T, H = c_.hidden_size, nh = c_.num_attention_heads, nope = c_.qk_nope_head_dim,
                rope = c_.qk_rope_head_dim, qk = c_.qk_head_dim(), vd = c_.v_head_dim, r = c_.kv_lora_rank,
                row = c_.kv_row_dim();
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const int32_t* positions = in.pos.t.as<int32_t>();

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

  // New latent rows: normalised c_kv ‖ roped k_pe, then into their pool slots.
  OwnedTensor kva = scratch(T, row);  // [T, kv_lora + rope]
  be_.linear({x, 0, w.kv_a.t.data, w.kv_a.t.dtype, kva.f32(), 0, T, row, H});
  be_.rms_norm({kva.f32(), row, w.kv_a_norm.t.data, w.kv_a_norm.t.dtype, kva.f32(), row, T, r, eps});
  be_.rope({kva.f32() + r, T, 1, row, 0, rope, positions, inv_freq_.f32(), rope_factor_, c_.rope_interleave});
  float* layer_pool = pool.layers[static_cast<size_t>(l)].f32();
  be_.kv_scatter({kva.f32(), in.slots.t.as<int32_t>(), layer_pool, T, row});

  OwnedTensor o = scratch(T, nh * vd);  // [T, nh, v]
  if (form == MlaForm::Auto) form = in.all_single ? MlaForm::Absorbed : MlaForm::Expanded;
  const ops::PagedKv paged = in.paged(pool, l);

  if (form == MlaForm::Expanded) {
    const int64_t ctx = in.total_kv;
    OwnedTensor kv = scratch(ctx, row);  // [total_kv, row]: every sequence's context, contiguous
    be_.kv_gather({paged, in.cu_kv.t.as<int32_t>(), in.B, row, ctx, kv.f32()});
    OwnedTensor kvb = scratch(ctx, nh * (nope + vd));  // [ctx, nh, nope + v]
    be_.linear({kv.f32(), row, w.kv_b.t.data, w.kv_b.t.dtype, kvb.f32(), 0, ctx, nh * (nope + vd), r});
    OwnedTensor k = scratch(ctx, nh * qk), v = scratch(ctx, nh * vd);  // [ctx, nh, qk], [ctx, nh, v]
    be_.copy({kvb.f32(), nope + vd, k.f32(), qk, ctx * nh, nope});
    be_.copy({kvb.f32() + nope, nope + vd, v.f32(), vd, ctx * nh, vd});
    for (int64_t hd = 0; hd < nh; ++hd) be_.copy({kv.f32() + r, row, k.f32() + hd * qk + nope, nh * qk, ctx, rope});
    const ops::VarlenSeqs seqs{in.cu_q.t.as<int32_t>(), in.cu_kv.t.as<int32_t>(), in.B};
    be_.mla_expanded({q.f32(), k.f32(), v.f32(), o.f32(), seqs, T, nh, qk, vd, scale_});
  } else {
    // Fold W_uk into q: q_lat[h] = W_uk[h]ᵀ q_nope[h]; the rope part rides along unchanged.
    OwnedTensor qa = scratch(T, nh * row);  // [T, nh, kv_lora + rope]
    be_.linear_heads(
        {q.f32(), nh * qk, qk, w.w_uk_t.t.data, r * nope, w.w_uk_t.t.dtype, qa.f32(), nh * row, row, nh, T, r, nope});
    be_.copy({q.f32() + nope, qk, qa.f32() + r, row, T * nh, rope});
    OwnedTensor lat = scratch(T, nh * r);  // [T, nh, kv_lora]
    be_.mla_absorbed({qa.f32(), paged, in.cu_q.t.as<int32_t>(), in.B, T, lat.f32(), nh, r, rope, scale_});
    // Fold W_uv into the output: v[h] = W_uv[h] · lat[h].
    const size_t esz = dtype_size(w.kv_b.t.dtype);
    const void* wuv = static_cast<const char*>(w.kv_b.t.data) + static_cast<size_t>(nope * r) * esz;
    be_.linear_heads({lat.f32(), nh * r, r, wuv, (nope + vd) * r, w.kv_b.t.dtype, o.f32(), nh * vd, vd, nh, T, vd, r});
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
