// BlockDrafterModel's forward (block_drafter_model.h), written once against the op interface.
#include "spec/block_drafter_model.h"

#include <cmath>
#include <numeric>

#include "core/error.h"

namespace kiln::spec {

BlockDrafterModel::BlockDrafterModel(BlockDrafterConfig config, BlockDrafterWeights weights, ops::Backend& backend)
    : c_(std::move(config)), w_(std::move(weights)), be_(backend) {
  const ModelConfig& m = c_.layers;
  KILN_CHECK(static_cast<int64_t>(w_.layers.size()) == m.num_hidden_layers, "internal: {} draft layers, config {}",
             w_.layers.size(), m.num_hidden_layers);
  std::vector<double> inv = m.rope_inv_freq();
  std::vector<float> invf(inv.begin(), inv.end());
  inv_freq_ = be_.alloc(DType::F32, {static_cast<int64_t>(invf.size())});
  be_.upload(inv_freq_.t, invf.data());
  rope_factor_ = static_cast<float>(m.rope_attention_factor());
  scale_ = static_cast<float>(m.softmax_scale());
  // Greedy choice through the backend's sample op, so drafting never waits on the host between
  // block positions: temperature 0, every other transform off (ops/params.h SampleParams).
  const int64_t B = c_.block_size;
  std::vector<float> f(static_cast<size_t>(6 * B));
  for (int64_t i = 0; i < B; ++i) {
    f[static_cast<size_t>(0 * B + i)] = 0.0f;  // temperature
    f[static_cast<size_t>(1 * B + i)] = 1.0f;  // top_p
    f[static_cast<size_t>(2 * B + i)] = 0.0f;  // min_p
    f[static_cast<size_t>(3 * B + i)] = 1.0f;  // repetition
    f[static_cast<size_t>(4 * B + i)] = 0.0f;  // presence
    f[static_cast<size_t>(5 * B + i)] = 0.0f;  // frequency
  }
  sample_f32_ = be_.alloc(DType::F32, {6 * B});
  be_.upload(sample_f32_.t, f.data());
  const std::vector<int32_t> top_k(static_cast<size_t>(B), 0);
  sample_i32_ = ints(top_k);
  const std::vector<int64_t> seeds(static_cast<size_t>(2 * B), 0);  // seed, counter: unused when greedy
  sample_u64_ = be_.alloc(DType::I64, {2 * B});
  be_.upload(sample_u64_.t, seeds.data());
  const float one = 1.0f;
  ones_ = be_.alloc(DType::F32, {1});
  be_.upload(ones_.t, &one);
}

OwnedTensor BlockDrafterModel::ints(std::span<const int32_t> v) {
  OwnedTensor t = be_.alloc(DType::I32, {std::max<int64_t>(1, static_cast<int64_t>(v.size()))});
  if (!v.empty()) be_.upload(t.t, v.data());
  return t;
}

BlockDrafterContext BlockDrafterModel::new_context(int64_t capacity) const {
  KILN_CHECK(capacity >= 0, "a block drafter context needs a capacity >= 0, got {}", capacity);
  BlockDrafterContext ctx;
  ctx.capacity = capacity;
  ctx.dtype = be_.kv_dtype();
  const int64_t blocks = (capacity + c_.block_size + kBlock - 1) / kBlock;  // the block's rows fit after any context
  for (int64_t l = 0; l < c_.layers.num_hidden_layers; ++l)
    ctx.pools.push_back(be_.alloc(ctx.dtype, {blocks * kBlock, c_.layers.kv_row_dim()}));
  return ctx;
}

void BlockDrafterModel::truncate_context(BlockDrafterContext& ctx, int64_t length) const {
  KILN_CHECK(length >= 0 && length <= ctx.length, "cannot truncate a context of {} rows to {}", ctx.length, length);
  ctx.length = length;  // rows past it are overwritten by the next append or block
}

void BlockDrafterModel::append_context(BlockDrafterContext& ctx, std::span<const float> host) {
  const int64_t F = c_.feature_dim();
  KILN_CHECK(static_cast<int64_t>(host.size()) % F == 0, "context features: {} values are not rows of {}", host.size(),
             F);
  const int64_t n = static_cast<int64_t>(host.size()) / F;
  if (n == 0) return;
  OwnedTensor t = scratch(n, F);
  be_.upload(t.t, host.data());
  append_context(ctx, t.t);
}

void BlockDrafterModel::append_context(BlockDrafterContext& ctx, const Tensor& features) {
  const int64_t F = c_.feature_dim(), H = c_.hidden();
  KILN_CHECK(features.dtype == DType::F32 && features.shape.size() == 2 && features.shape[1] == F,
             "context features must be f32 [n, {}] (the hidden states of {} target layers), got {} {}", F,
             c_.target_layer_ids.size(), dtype_name(features.dtype), shape_str(features.shape));
  const int64_t n = features.shape[0];
  KILN_CHECK(ctx.length + n <= ctx.capacity, "context of {} rows would exceed its capacity {}", ctx.length + n,
             ctx.capacity);
  if (n == 0) return;
  // fc then hidden_norm: [n, L * H] -> [n, H], the features every draft layer reads as its context.
  OwnedTensor x = scratch(n, H);
  be_.linear({features.f32(), 0, w_.fc.t.data, w_.fc.t.dtype, x.f32(), 0, n, H, F});
  be_.rms_norm({x.f32(), 0, w_.hidden_norm.t.data, w_.hidden_norm.t.dtype, x.f32(), 0, n, H,
                static_cast<float>(c_.layers.rms_norm_eps)});
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), static_cast<int32_t>(ctx.length));
  const OwnedTensor p = ints(pos);  // [n]: positions, also the pool rows (row j holds position j)
  for (int64_t l = 0; l < c_.layers.num_hidden_layers; ++l)
    context_rows(l, x.f32(), n, p.t.as<int32_t>(), ctx.pools[static_cast<size_t>(l)].t.data, ctx.dtype);
  ctx.length += n;
}

void BlockDrafterModel::context_rows(int64_t l, const float* x, int64_t n, const int32_t* pos, void* pool,
                                     DType pool_dtype) {
  const BlockDrafterLayer& w = w_.layers[static_cast<size_t>(l)];
  const ModelConfig& m = c_.layers;
  const int64_t H = m.hidden_size, r = m.kv_lora_rank, rope = m.qk_rope_head_dim, row = m.kv_row_dim();
  // No input_layernorm here: DeepSpec projects the context features as fc + hidden_norm left them.
  OwnedTensor kva = scratch(n, row);  // [n, kv_lora + rope]: c_kv ‖ k_pe
  ops::LinearParams proj{x, 0, w.kv_a.t.data, w.kv_a.t.dtype, kva.f32(), 0, n, row, H};
  be_.linear(proj);
  be_.rms_norm({kva.f32(), row, w.kv_a_norm.t.data, w.kv_a_norm.t.dtype, kva.f32(), row, n, r,
                static_cast<float>(m.rms_norm_eps)});
  be_.rope({kva.f32() + r, n, 1, row, rope, rope, pos, inv_freq_.f32(), rope_factor_, m.rope_interleave});
  be_.kv_scatter({kva.f32(), pos, pool, pool_dtype, n, row});
}

BlockDrafterModel::Step BlockDrafterModel::upload_step(const BlockDrafterContext& ctx, int32_t anchor) {
  const int64_t B = c_.block_size, a = ctx.length;
  KILN_CHECK(anchor >= 0 && anchor < c_.vocab(), "anchor token {} is outside the vocabulary of {}", anchor, c_.vocab());
  KILN_CHECK(!ctx.pools.empty() || c_.layers.num_hidden_layers == 0, "the context has no pools (new_context)");
  Step st;
  st.num_blocks = ctx.pools.empty() ? 1 : ctx.pools[0].t.shape[0] / kBlock;
  std::vector<int32_t> v;
  v.push_back(anchor);
  for (int64_t k = 1; k < B; ++k) v.push_back(static_cast<int32_t>(c_.mask_token_id));
  for (int64_t k = 0; k < B; ++k) v.push_back(static_cast<int32_t>(a + k));
  for (int64_t k = 0; k <= B; ++k) v.push_back(static_cast<int32_t>(k));
  for (int64_t k = 0; k < B; ++k) v.push_back(static_cast<int32_t>(a + B));
  for (int64_t k = 0; k < B; ++k)
    for (int64_t b = 0; b < st.num_blocks; ++b) v.push_back(static_cast<int32_t>(b));
  st.idx = ints(v);
  const int32_t* base = st.idx.t.as<int32_t>();
  st.ids = base, st.pos = base + B, st.cu_q = base + 2 * B, st.kv_lens = base + 3 * B + 1;
  st.table = base + 4 * B + 1;
  return st;
}

void BlockDrafterModel::backbone(BlockDrafterContext& ctx, int32_t anchor, float* h, float* base) {
  const ModelConfig& m = c_.layers;
  const int64_t B = c_.block_size, H = m.hidden_size, V = m.vocab_size;
  const Step st = upload_step(ctx, anchor);
  OwnedTensor x = scratch(B, H), y = scratch(B, H);  // [B, H]: the residual stream, ping-ponged
  be_.embedding({st.ids, w_.embed.t.data, w_.embed.t.dtype, x.f32(), B, V, H});
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    attention(l, x.f32(), ctx, st, y.f32());
    mlp(l, y.f32(), x.f32());
  }
  be_.rms_norm({x.f32(), 0, w_.norm.t.data, w_.norm.t.dtype, h, 0, B, H, static_cast<float>(m.rms_norm_eps)});
  be_.linear({h, 0, w_.lm_head.t.data, w_.lm_head.t.dtype, base, 0, B, V, H});
}

void BlockDrafterModel::attention(int64_t l, const float* x, const BlockDrafterContext& ctx, const Step& st,
                                  float* out) {
  const BlockDrafterLayer& w = w_.layers[static_cast<size_t>(l)];
  const ModelConfig& m = c_.layers;
  const int64_t B = c_.block_size, H = m.hidden_size, nh = m.num_attention_heads, nope = m.qk_nope_head_dim,
                rope = m.qk_rope_head_dim, qk = m.qk_head_dim(), vd = m.v_head_dim, r = m.kv_lora_rank,
                row = m.kv_row_dim();
  const float eps = static_cast<float>(m.rms_norm_eps);
  // Projections of input_layernorm(x): q [B, nh, qk] (q_nope ‖ q_pe per head) and kva [B, row].
  auto normed = [&](const Weight& wt, float* y, int64_t n) {
    ops::LinearParams p{x, 0, wt.t.data, wt.t.dtype, y, 0, B, n, H};
    p.norm_weight = w.input_norm.t.data, p.norm_weight_dtype = w.input_norm.t.dtype, p.norm_eps = eps;
    be_.linear(p);
  };
  OwnedTensor q = scratch(B, nh * qk), q_a;
  if (m.q_lora_rank > 0) {
    q_a = scratch(B, m.q_lora_rank);
    normed(w.q_a, q_a.f32(), m.q_lora_rank);
    be_.rms_norm({q_a.f32(), 0, w.q_a_norm.t.data, w.q_a_norm.t.dtype, q_a.f32(), 0, B, m.q_lora_rank, eps});
    be_.linear({q_a.f32(), 0, w.q_b.t.data, w.q_b.t.dtype, q.f32(), 0, B, nh * qk, m.q_lora_rank});
  } else {
    normed(w.q_a, q.f32(), nh * qk);
  }
  OwnedTensor kva = scratch(B, row);
  normed(w.kv_a, kva.f32(), row);
  // The block's own latent rows go into the pool right after the context (rows a .. a + B - 1),
  // and q is folded through W_uk beside its roped q_pe: qa [B, nh, kv_lora + rope].
  OwnedTensor qa = scratch(B, nh * row);
  void* pool = ctx.pools[static_cast<size_t>(l)].t.data;
  be_.mla_prepare({.q_in = q.f32() + nope,
                   .q_in_stride = nh * qk,
                   .q_in_head_stride = qk,
                   .q_out = qa.f32() + r,
                   .q_out_stride = nh * row,
                   .q_out_head_stride = row,
                   .num_heads = nh,
                   .kva = kva.f32(),
                   .kva_stride = row,
                   .norm_weight = w.kv_a_norm.t.data,
                   .norm_weight_dtype = w.kv_a_norm.t.dtype,
                   .eps = eps,
                   .positions = st.pos,
                   .inv_freq = inv_freq_.f32(),
                   .attention_factor = rope_factor_,
                   .interleaved = m.rope_interleave,
                   .slots = st.pos,
                   .pool = pool,
                   .pool_dtype = ctx.dtype,
                   .num_tokens = B,
                   .kv_lora = r,
                   .rope_dim = rope,
                   .q_nope = q.f32(),
                   .w_uk = w.w_uk_t.t.data,
                   .w_uk_dtype = w.w_uk_t.t.dtype,
                   .nope_dim = nope,
                   .q_lat = qa.f32()});
  // Every block row is a one-query sequence over the same a + B rows: the absorbed form's causal
  // rule (a query sees the rows up to its own) then lets each row see the whole block, i.e. the
  // block attends non-causally, while context rows past the anchor do not exist in the pool.
  OwnedTensor lat = scratch(B, nh * r);  // [B, nh, kv_lora]
  const ops::PagedKv paged{pool, ctx.dtype, st.table, st.kv_lens, kBlock, st.num_blocks};
  be_.mla_absorbed({qa.f32(), paged, st.cu_q, B, B, lat.f32(), nh, r, rope, scale_});
  // v[h] = W_uv[h] · lat[h] (a view of kv_b's rows), then o_proj with the residual added.
  const DType kt = w.kv_b.t.dtype;
  const void* wuv = static_cast<const char*>(w.kv_b.t.data) + static_cast<size_t>(nope * r) * dtype_size(kt);
  OwnedTensor o = scratch(B, nh * vd);  // [B, nh, v]
  const ops::LinearHeadsParams uv{lat.f32(), nh * r, r, wuv, (nope + vd) * r, kt, o.f32(), nh * vd, vd, nh, B, vd, r};
  ops::LinearParams op{o.f32(), 0, w.o_proj.t.data, w.o_proj.t.dtype, out, 0, B, H, nh * vd};
  op.add = x;
  be_.heads_then_linear(uv, op);
}

void BlockDrafterModel::mlp(int64_t l, const float* x, float* out) {
  const BlockDrafterLayer& w = w_.layers[static_cast<size_t>(l)];
  const int64_t B = c_.block_size, H = c_.hidden(), I = w.gate_up.t.shape[0] / 2;
  OwnedTensor gu = scratch(B, 2 * I), act = scratch(B, I);  // [B, 2I] gate ‖ up, [B, I]
  ops::LinearParams gate_up{x, 0, w.gate_up.t.data, w.gate_up.t.dtype, gu.f32(), 0, B, 2 * I, H};
  gate_up.norm_weight = w.post_attn_norm.t.data, gate_up.norm_weight_dtype = w.post_attn_norm.t.dtype;
  gate_up.norm_eps = static_cast<float>(c_.layers.rms_norm_eps);
  be_.linear(gate_up);
  be_.swiglu({gu.f32(), act.f32(), B, I});
  ops::LinearParams down{act.f32(), 0, w.down.t.data, w.down.t.dtype, out, 0, B, H, I};
  down.add = x;
  be_.linear(down);
}

void BlockDrafterModel::argmax(const float* logits, int64_t rows, int32_t* tokens) {
  const int64_t B = c_.block_size;
  const float* f = sample_f32_.f32();
  const auto* u = sample_u64_.t.as<uint64_t>();
  OwnedTensor logprob = scratch(rows, 1);
  ops::SampleParams p{};
  p.logits = logits, p.logits_stride = 0, p.rows = rows, p.vocab = c_.vocab();
  p.temperature = f, p.top_p = f + B, p.min_p = f + 2 * B, p.repetition = f + 3 * B, p.presence = f + 4 * B;
  p.frequency = f + 5 * B, p.top_k = sample_i32_.t.as<int32_t>(), p.seed = u, p.counter = u + B;
  p.num_top = 0, p.token = tokens, p.logprob = logprob.f32();
  be_.sample(p);
}

BlockDraft BlockDrafterModel::propose(BlockDrafterContext& ctx, int32_t anchor) {
  const int64_t B = c_.block_size, H = c_.hidden(), V = c_.vocab(), R = c_.markov_rank;
  OwnedTensor h = scratch(B, H), base = scratch(B, V);
  backbone(ctx, anchor, h.f32(), base.f32());
  std::vector<int32_t> prev(static_cast<size_t>(B + 1), 0);
  prev[0] = anchor;
  OwnedTensor toks = ints(prev);  // [B + 1]: the anchor, then each position's draft
  int32_t* t = toks.t.as<int32_t>();
  if (R == 0) {
    argmax(base.f32(), B, t + 1);
    return finish(h, base, base.f32(), t + 1, nullptr);
  }
  // Sequential over the block: position k's logits need the token drafted at k - 1.
  OwnedTensor e = scratch(B, R), logits = scratch(B, V);  // [B, r] Markov rows, [B, V]
  for (int64_t k = 0; k < B; ++k) {
    be_.embedding({t + k, w_.markov_w1.t.data, w_.markov_w1.t.dtype, e.f32() + k * R, 1, V, R});
    ops::LinearParams bias{
        e.f32() + k * R, 0, w_.markov_w2.t.data, w_.markov_w2.t.dtype, logits.f32() + k * V, 0, 1, V, R};
    bias.add = base.f32() + k * V;
    be_.linear(bias);
    argmax(logits.f32() + k * V, 1, t + k + 1);
  }
  return finish(h, base, logits.f32(), t + 1, e.f32());
}

BlockDraft BlockDrafterModel::score(BlockDrafterContext& ctx, std::span<const int32_t> prev) {
  const int64_t B = c_.block_size, H = c_.hidden(), V = c_.vocab(), R = c_.markov_rank;
  KILN_CHECK(static_cast<int64_t>(prev.size()) == B, "score needs {} previous tokens (the anchor first), got {}", B,
             prev.size());
  for (int32_t id : prev) KILN_CHECK(id >= 0 && id < V, "previous token {} is outside the vocabulary of {}", id, V);
  OwnedTensor h = scratch(B, H), base = scratch(B, V);
  backbone(ctx, prev[0], h.f32(), base.f32());
  OwnedTensor p = ints(prev), toks = ints(std::vector<int32_t>(static_cast<size_t>(B), 0));
  if (R == 0) {
    argmax(base.f32(), B, toks.t.as<int32_t>());
    return finish(h, base, base.f32(), toks.t.as<int32_t>(), nullptr);
  }
  OwnedTensor e = scratch(B, R), logits = scratch(B, V);
  be_.embedding({p.t.as<int32_t>(), w_.markov_w1.t.data, w_.markov_w1.t.dtype, e.f32(), B, V, R});
  ops::LinearParams bias{e.f32(), 0, w_.markov_w2.t.data, w_.markov_w2.t.dtype, logits.f32(), 0, B, V, R};
  bias.add = base.f32();
  be_.linear(bias);
  argmax(logits.f32(), B, toks.t.as<int32_t>());
  return finish(h, base, logits.f32(), toks.t.as<int32_t>(), e.f32());
}

std::vector<float> BlockDrafterModel::confidence(const float* h, const float* e) {
  const int64_t B = c_.block_size, H = c_.hidden(), R = c_.confidence_head_with_markov ? c_.markov_rank : 0;
  const int64_t in = H + R + 1;                           // [h ; W1[prev] ; 1]
  OwnedTensor feats = scratch(B, in), z = scratch(B, 1);  // [B, in], [B, 1]
  be_.copy({h, H, feats.f32(), in, B, H});
  if (R > 0) be_.copy({e, R, feats.f32() + H, in, B, R});
  be_.copy({ones_.f32(), 1, feats.f32() + H + R, in, B, 1, B});
  be_.linear({feats.f32(), 0, w_.confidence.t.data, w_.confidence.t.dtype, z.f32(), 0, B, 1, in});
  std::vector<float> out(static_cast<size_t>(B));
  be_.download(out.data(), z.t);
  // The sigmoid runs here: B values, read by the host scheduler anyway.
  for (float& v : out) v = 1.0f / (1.0f + std::exp(-v));
  return out;
}

BlockDraft BlockDrafterModel::finish(const OwnedTensor& h, const OwnedTensor& base, const float* logits,
                                     const int32_t* tokens, const float* e) {
  const int64_t B = c_.block_size, V = c_.vocab();
  BlockDraft d;
  d.block_size = B, d.vocab = V;
  d.tokens.resize(static_cast<size_t>(B));
  d.logits.resize(static_cast<size_t>(B * V));
  d.base_logits.resize(static_cast<size_t>(B * V));
  const Device dev = base.t.device;
  be_.download(d.tokens.data(), Tensor{const_cast<int32_t*>(tokens), DType::I32, {B}, dev});
  be_.download(d.logits.data(), Tensor{const_cast<float*>(logits), DType::F32, {B, V}, dev});
  be_.download(d.base_logits.data(), base.t);
  if (c_.enable_confidence_head) d.confidence = confidence(h.f32(), e);
  return d;
}

}  // namespace kiln::spec
