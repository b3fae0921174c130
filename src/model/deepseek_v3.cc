#include "model/deepseek_v3.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/log.h"

namespace kiln {

DeepseekV3Model::DeepseekV3Model(ModelConfig config, ModelWeights weights, ops::Backend& backend)
    : c_(std::move(config)), w_(std::move(weights)), be_(backend), kv_dtype_(backend.kv_dtype()) {
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

void DeepseekV3Model::set_kv_dtype(DType t) {
  KILN_CHECK(t == DType::F32 || t == DType::BF16, "the KV cache must be f32 or bf16, not {}", dtype_name(t));
  kv_dtype_ = t;
}

LatentKvPool DeepseekV3Model::new_pool(int64_t num_blocks, int64_t block_size) const {
  KILN_CHECK(num_blocks > 0 && block_size > 0, "KV pool needs positive blocks and block size, got {} x {}", num_blocks,
             block_size);
  LatentKvPool p;
  p.num_blocks = num_blocks;
  p.block_size = block_size;
  p.row_dim = c_.kv_row_dim();
  p.dtype = kv_dtype_;
  for (int64_t l = 0; l < c_.num_hidden_layers; ++l)
    p.layers.push_back(be_.alloc(p.dtype, {num_blocks * block_size, p.row_dim}));
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

// The batch's index arrays on the backend: views into one buffer, uploaded in one copy.
struct DeepseekV3Model::StepInputs {
  int64_t T = 0, B = 0, total_kv = 0;
  bool all_single = true;  // every sequence has one new token (a pure decode step)
  OwnedTensor buffer;      // [ids | pos | slots | cu_q | kv_lens | cu_kv | block_tables] int32
  OwnedTensor ids, pos, slots, cu_q, kv_lens, cu_kv, block_tables;
  ops::PagedKv paged(const LatentKvPool& pool, int64_t layer) const {
    return {pool.layers[static_cast<size_t>(layer)].t.data,
            pool.dtype,
            block_tables.t.as<int32_t>(),
            kv_lens.t.as<int32_t>(),
            pool.block_size,
            block_tables.t.shape[1]};
  }
};

// A pure decode step of up to max_batch sequences replayed from a CUDA graph. Batches are
// padded up to a captured size by repeating their last sequence: the copies compute exactly what
// it computes and write the same bits to the same KV slot, so padding needs no kernel support.
struct DeepseekV3Model::DecodeGraphs {
  int64_t max_batch = 0, max_blocks = 0;
  const LatentKvPool* pool = nullptr;                 // the pool the graphs were captured on
  OwnedTensor inputs;                                 // StepInputs buffer laid out for max_batch, max_blocks
  OwnedTensor logits;                                 // [max_batch, vocab]: every graph's output rows
  std::map<int64_t, std::shared_ptr<void>> captured;  // padded batch -> graph (null: not capturable)

  static int64_t bucket(int64_t b) {  // 1, 2, 4, 8, then multiples of 16
    if (b <= 8) return b <= 1 ? 1 : b <= 2 ? 2 : b <= 4 ? 4 : 8;
    return (b + 15) / 16 * 16;
  }
};

void DeepseekV3Model::disable_decode_graphs(const LatentKvPool* pool) {
  if (!pool || (graphs_ && graphs_->pool == pool)) graphs_.reset();
}

namespace {

// Offsets of each array in the packed StepInputs buffer, for T tokens, B sequences and block
// tables `stride` entries wide.
struct InputLayout {
  int64_t ids, pos, slots, cu_q, kv_lens, cu_kv, tables, total;
  InputLayout(int64_t T, int64_t B, int64_t stride)
      : ids(0),
        pos(T),
        slots(2 * T),
        cu_q(3 * T),
        kv_lens(cu_q + B + 1),
        cu_kv(kv_lens + B),
        tables(cu_kv + B + 1),
        total(tables + B * stride) {}
};

}  // namespace

DeepseekV3Model::~DeepseekV3Model() = default;

void DeepseekV3Model::enable_decode_graphs(const LatentKvPool& pool, int64_t max_batch, int64_t max_blocks) {
  if (!be_.supports_graphs() || max_batch <= 0) return;
  graphs_ = std::make_unique<DecodeGraphs>();
  graphs_->max_batch = DecodeGraphs::bucket(max_batch);
  graphs_->max_blocks = max_blocks;
  graphs_->pool = &pool;
  const int64_t B = graphs_->max_batch;
  graphs_->inputs = be_.alloc(DType::I32, {InputLayout(B, B, max_blocks).total});
  graphs_->logits = scratch(B, c_.vocab_size);
}

DeepseekV3Model::StepInputs DeepseekV3Model::upload_inputs(const ForwardBatch& batch, const LatentKvPool& pool,
                                                           int64_t pad_to, OwnedTensor* buffer) {
  const int64_t T = batch.num_tokens(), B = batch.num_seqs(), V = c_.vocab_size;
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
  for (int64_t b = 0; b < B; ++b) {
    const int32_t q_len = batch.cu_q[static_cast<size_t>(b + 1)] - batch.cu_q[static_cast<size_t>(b)];
    KILN_CHECK(q_len >= 1 && batch.kv_lens[static_cast<size_t>(b)] >= q_len &&
                   batch.kv_lens[static_cast<size_t>(b)] <= batch.max_blocks * pool.block_size,
               "malformed ForwardBatch: sequence {} has {} new tokens and {} in context", b, q_len,
               batch.kv_lens[static_cast<size_t>(b)]);
    in.all_single &= q_len == 1;
  }
  // Padding (graphs): sequences B..pad_to-1 repeat the last one. Only pure decode steps pad.
  const int64_t Bp = std::max(pad_to, B), Tp = T + (Bp - B);
  KILN_CHECK(Bp == B || in.all_single, "internal: only decode steps are padded");
  const int64_t stride = buffer ? graphs_->max_blocks : batch.max_blocks;
  KILN_CHECK(batch.max_blocks <= stride, "internal: block tables wider than the graph's");
  const InputLayout lay(buffer ? graphs_->max_batch : Tp, buffer ? graphs_->max_batch : Bp, stride);
  std::vector<int32_t> host(static_cast<size_t>(lay.total), 0);
  auto at = [&](int64_t off, int64_t i) -> int32_t& { return host[static_cast<size_t>(off + i)]; };
  int32_t kv_total = 0;
  for (int64_t b = 0; b < Bp; ++b) {
    const int64_t src = std::min(b, B - 1);
    const auto sb = static_cast<size_t>(src);
    for (int64_t t = batch.cu_q[sb]; t < batch.cu_q[sb + 1]; ++t) {
      const int64_t dst = b < B ? t : T + (b - B);
      at(lay.ids, dst) = batch.tokens[static_cast<size_t>(t)];
      at(lay.pos, dst) = batch.positions[static_cast<size_t>(t)];
      at(lay.slots, dst) = batch.slot_mapping[static_cast<size_t>(t)];
    }
    at(lay.cu_q, b + 1) = b < B ? batch.cu_q[static_cast<size_t>(b + 1)] : static_cast<int32_t>(T + (b - B) + 1);
    at(lay.kv_lens, b) = batch.kv_lens[sb];
    kv_total += batch.kv_lens[sb];
    at(lay.cu_kv, b + 1) = kv_total;
    for (int64_t j = 0; j < batch.max_blocks; ++j)
      at(lay.tables, b * stride + j) = batch.block_tables[static_cast<size_t>(src * batch.max_blocks + j)];
  }
  in.T = Tp;
  in.B = Bp;
  in.total_kv = kv_total;
  if (buffer) {
    in.buffer = *buffer;
  } else {
    in.buffer = be_.alloc(DType::I32, {lay.total});
  }
  be_.upload(in.buffer.t, host.data());
  auto view = [&](int64_t off, Shape shape) {
    OwnedTensor v;
    v.mem = in.buffer.mem;
    v.t = Tensor{in.buffer.t.as<int32_t>() + off, DType::I32, std::move(shape), in.buffer.t.device};
    return v;
  };
  in.ids = view(lay.ids, {Tp});
  in.pos = view(lay.pos, {Tp});
  in.slots = view(lay.slots, {Tp});
  in.cu_q = view(lay.cu_q, {Bp + 1});
  in.kv_lens = view(lay.kv_lens, {Bp});
  in.cu_kv = view(lay.cu_kv, {Bp + 1});
  in.block_tables = view(lay.tables, {Bp, stride});
  return in;
}

std::vector<float> DeepseekV3Model::forward(const ForwardBatch& batch, LatentKvPool& pool, MlaForm form) {
  const Tensor logits = forward_logits(batch, pool, form);
  std::vector<float> out(static_cast<size_t>(logits.numel()));
  if (!out.empty()) be_.download(out.data(), logits);
  return out;
}

Tensor DeepseekV3Model::forward_logits(const ForwardBatch& batch, LatentKvPool& pool, MlaForm form) {
  const int64_t rows = static_cast<int64_t>(batch.logit_rows.size()), V = c_.vocab_size;
  for (int32_t r : batch.logit_rows)
    KILN_CHECK(r >= 0 && r < batch.num_tokens(), "logit row {} is outside the batch of {} tokens", r,
               batch.num_tokens());
  if (graphs_ && graph_eligible(batch, pool, form)) {
    const int64_t Bp = DecodeGraphs::bucket(batch.num_seqs());
    auto [it, fresh] = graphs_->captured.try_emplace(Bp);
    if (fresh || it->second) {  // sizes that could not be captured take the eager path below
      StepInputs in = upload_inputs(batch, pool, Bp, &graphs_->inputs);
      float* out = graphs_->logits.f32();
      if (fresh) {
        // First sight of this size: run it for real, then record the same work for next time.
        compute(in, pool, MlaForm::Absorbed, nullptr, in.T, out);
        it->second = capture(in, pool, out);
      } else {
        be_.replay(it->second);
      }
      last_logits_ = {};
      return Tensor{out, DType::F32, {rows, V}, graphs_->logits.t.device};
    }
  }
  StepInputs in = upload_inputs(batch, pool, 0, nullptr);
  last_logits_ = scratch(rows, V);
  compute(in, pool, form, batch.logit_rows.data(), rows, last_logits_.f32());
  return last_logits_.t;
}

bool DeepseekV3Model::graph_eligible(const ForwardBatch& batch, const LatentKvPool& pool, MlaForm form) const {
  const int64_t B = batch.num_seqs();
  if (&pool != graphs_->pool || form == MlaForm::Expanded || B > graphs_->max_batch ||
      batch.max_blocks > graphs_->max_blocks || batch.num_tokens() != B ||
      static_cast<int64_t>(batch.logit_rows.size()) != B)
    return false;
  for (int64_t i = 0; i < B; ++i)
    if (batch.logit_rows[static_cast<size_t>(i)] != i) return false;
  return true;
}

std::shared_ptr<void> DeepseekV3Model::capture(const StepInputs& in, LatentKvPool& pool, float* logits) {
  be_.begin_capture();
  try {
    compute(in, pool, MlaForm::Absorbed, nullptr, in.T, logits);
    auto graph = be_.end_capture();
    spdlog::info("captured a CUDA graph for decode steps of {} sequences", in.B);
    return graph;
  } catch (const std::exception& e) {
    // An op that syncs with the host cannot be captured; that size keeps running eagerly.
    be_.abort_capture();
    spdlog::warn("decode steps of {} sequences run without a CUDA graph: {}", in.B, e.what());
    return nullptr;
  }
}

// The layers over uploaded inputs; writes the logits of rows logit_rows[0, rows) (of rows 0..rows-1
// when logit_rows is null) to `logits` [rows, vocab]. Uploads and downloads nothing, so a graph
// can record it.
void DeepseekV3Model::compute(const StepInputs& in, LatentKvPool& pool, MlaForm form, const int32_t* logit_rows,
                              int64_t rows, float* logits) {
  const int64_t T = in.T, H = c_.hidden_size, V = c_.vocab_size;
  // The residual stream is x + pending: x (the embeddings) is never written inside the layers, and
  // pending sums every sub-layer's output so far. Each sub-layer normalises x + pending inside its
  // first op and adds pending to its output inside its last, so no layer runs a separate norm or
  // add. ya and ym (attention, FFN) alternate so that no op reads the buffer it writes.
  OwnedTensor x = scratch(T, H), ya = scratch(T, H), ym = scratch(T, H);  // [T, H] each
  be_.embedding({in.ids.t.as<int32_t>(), w_.embed.t.data, w_.embed.t.dtype, x.f32(), T, V, H});
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const float* pending = nullptr;  // [T, H], not yet added to x (null: nothing)
  for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
    attention(l, x.f32(), pending, ya.f32(), in, pool, form);
    ffn(l, x.f32(), ya.f32(), ym.f32(), T);
    pending = ym.f32();
  }
  auto add_and_norm = [&](const OwnedTensor& weight, float* out) {  // x += pending; out = norm(x)
    ops::RmsNormParams n{x.f32(), 0, weight.t.data, weight.t.dtype, out, 0, T, H, eps};
    if (pending) n.residual = pending, n.sum = x.f32();
    be_.rms_norm(n);
    pending = nullptr;
  };

  // Only the requested rows go through the final norm and the vocabulary projection.
  if (rows == 0) return;
  OwnedTensor sel = scratch(rows, H);
  if (!logit_rows) {
    add_and_norm(w_.final_norm, sel.f32());
  } else {
    if (pending) be_.add({x.f32(), pending, x.f32(), T * H});
    // One copy per run of consecutive rows (a decode batch is one run; a prefill chunk one row).
    for (int64_t i = 0, n = 1; i < rows; i += n) {
      for (n = 1; i + n < rows && logit_rows[i + n] == logit_rows[i] + n;) ++n;
      be_.copy({x.f32() + logit_rows[i] * H, H, sel.f32() + i * H, H, n, H});
    }
    be_.rms_norm({sel.f32(), 0, w_.final_norm.t.data, w_.final_norm.t.dtype, sel.f32(), 0, rows, H, eps});
  }
  be_.linear({sel.f32(), 0, w_.lm_head.t.data, w_.lm_head.t.dtype, logits, 0, rows, V, H});
}

void DeepseekV3Model::attention(int64_t l, const float* x, const float* pending, float* out, const StepInputs& in,
                                LatentKvPool& pool, MlaForm form) {
  const LayerWeights& w = w_.layers[static_cast<size_t>(l)];
  const int64_t T = in.T, H = c_.hidden_size, nh = c_.num_attention_heads, nope = c_.qk_nope_head_dim,
                rope = c_.qk_rope_head_dim, qk = c_.qk_head_dim(), vd = c_.v_head_dim, r = c_.kv_lora_rank,
                row = c_.kv_row_dim();
  const float eps = static_cast<float>(c_.rms_norm_eps);

  // One projection of x feeds both q (or q LoRA's q_a) and the latent row: qkv [T, nq + row].
  const int64_t nq = qkv_a_q_rows(c_), ld = nq + row;
  OwnedTensor qkv = scratch(T, ld);
  ops::LinearParams qkv_a{x, 0, w.qkv_a.t.data, w.qkv_a.t.dtype, qkv.f32(), 0, T, ld, H};
  qkv_a.norm_weight = w.input_norm.t.data, qkv_a.norm_weight_dtype = w.input_norm.t.dtype, qkv_a.norm_eps = eps;
  qkv_a.norm_residual = pending;  // projects input_norm(x + pending)
  be_.linear(qkv_a);

  // q [T, nh, qk]: q_nope ‖ q_pe per head, rows q_stride apart (a view of qkv without q LoRA).
  float* q = qkv.f32();
  int64_t q_stride = ld;
  OwnedTensor q_b_out;
  if (c_.q_lora_rank > 0) {
    float* q_a = qkv.f32();  // [T, q_lora], rows ld apart
    be_.rms_norm({q_a, ld, w.q_a_norm.t.data, w.q_a_norm.t.dtype, q_a, ld, T, c_.q_lora_rank, eps});
    q_b_out = scratch(T, nh * qk);
    be_.linear({q_a, ld, w.q_b.t.data, w.q_b.t.dtype, q_b_out.f32(), 0, T, nh * qk, c_.q_lora_rank});
    q = q_b_out.f32();
    q_stride = nh * qk;
  }

  // One op ropes q_pe into q_pe_out and writes the new latent rows (normalised c_kv ‖ roped k_pe)
  // to their pool slots; qkv's kv part stays as projected. Given q_lat (the absorbed form) it also
  // folds W_uk into q there: q_lat[h] = W_uk[h]ᵀ q_nope[h], rows as q_pe_out's.
  auto prepare = [&](float* q_pe_out, int64_t out_stride, int64_t out_head_stride, float* q_lat) {
    be_.mla_prepare({.q_in = q + nope,
                     .q_in_stride = q_stride,
                     .q_in_head_stride = qk,
                     .q_out = q_pe_out,
                     .q_out_stride = out_stride,
                     .q_out_head_stride = out_head_stride,
                     .num_heads = nh,
                     .kva = qkv.f32() + nq,
                     .kva_stride = ld,
                     .norm_weight = w.kv_a_norm.t.data,
                     .norm_weight_dtype = w.kv_a_norm.t.dtype,
                     .eps = eps,
                     .positions = in.pos.t.as<int32_t>(),
                     .inv_freq = inv_freq_.f32(),
                     .attention_factor = rope_factor_,
                     .interleaved = c_.rope_interleave,
                     .slots = in.slots.t.as<int32_t>(),
                     .pool = pool.layers[static_cast<size_t>(l)].t.data,
                     .pool_dtype = pool.dtype,
                     .num_tokens = T,
                     .kv_lora = r,
                     .rope_dim = rope,
                     .q_nope = q,
                     .w_uk = q_lat ? w.w_uk_t.t.data : nullptr,
                     .w_uk_dtype = w.w_uk_t.t.dtype,
                     .nope_dim = nope,
                     .q_lat = q_lat});
  };

  OwnedTensor o = scratch(T, nh * vd);  // [T, nh, v]
  OwnedTensor lat;                      // absorbed form: [T, nh, kv_lora], attention in the latent space
  if (form == MlaForm::Auto) form = in.all_single ? MlaForm::Absorbed : MlaForm::Expanded;
  const ops::PagedKv paged = in.paged(pool, l);

  if (form == MlaForm::Expanded) {
    prepare(q + nope, q_stride, qk, nullptr);  // q_pe roped in place; no fold
    const int64_t ctx = in.total_kv;
    OwnedTensor kv = scratch(ctx, row);  // [total_kv, row]: every sequence's context, contiguous
    be_.kv_gather({paged, in.cu_kv.t.as<int32_t>(), in.B, row, ctx, kv.f32()});
    OwnedTensor kvb = scratch(ctx, nh * (nope + vd));  // [ctx, nh, nope + v]: per head k_nope ‖ v
    ops::LinearParams kv_b{kv.f32(), row, w.kv_b.t.data, w.kv_b.t.dtype, kvb.f32(), 0, ctx, nh * (nope + vd), r};
    kv_b.x_bf16 = pool.dtype == DType::BF16;  // the latent rows as cached
    be_.linear(kv_b);
    // Attention reads k_nope and v from kvb and the shared roped k_pe from kv's last rope columns.
    const ops::VarlenSeqs seqs{in.cu_q.t.as<int32_t>(), in.cu_kv.t.as<int32_t>(), in.B};
    be_.mla_expanded({.q = q,
                      .kv_b = kvb.f32(),     // [ctx, nh, nope + v]
                      .k_pe = kv.f32() + r,  // [ctx, rope], rows `row` apart
                      .out = o.f32(),
                      .seqs = seqs,
                      .total_q = T,
                      .total_kv = ctx,
                      .num_heads = nh,
                      .qk_dim = qk,
                      .v_dim = vd,
                      .nope_dim = nope,
                      .scale = scale_,
                      .q_stride = q_stride,
                      .kv_b_stride = nh * (nope + vd),
                      .k_pe_stride = row});
  } else {
    // q folded through W_uk (q_lat) with the roped q_pe beside it, in the same op as the latent rows.
    OwnedTensor qa = scratch(T, nh * row);  // [T, nh, kv_lora + rope]: q_lat ‖ q_pe
    prepare(qa.f32() + r, nh * row, row, qa.f32());
    lat = scratch(T, nh * r);
    be_.mla_absorbed({qa.f32(), paged, in.cu_q.t.as<int32_t>(), in.B, T, lat.f32(), nh, r, rope, scale_});
  }
  ops::LinearParams o_proj{o.f32(), 0, w.o_proj.t.data, w.o_proj.t.dtype, out, 0, T, H, nh * vd};
  o_proj.add = pending;  // out = attention + pending
  if (form == MlaForm::Expanded) {
    be_.linear(o_proj);
    return;
  }
  // Fold W_uv into the output, v[h] = W_uv[h] · lat[h], then o_proj: one op (one launch on CUDA
  // for a single stream).
  const size_t esz = dtype_size(w.kv_b.t.dtype);
  const void* wuv = static_cast<const char*>(w.kv_b.t.data) + static_cast<size_t>(nope * r) * esz;
  be_.heads_then_linear(
      {lat.f32(), nh * r, r, wuv, (nope + vd) * r, w.kv_b.t.dtype, o.f32(), nh * vd, vd, nh, T, vd, r}, o_proj);
}

void DeepseekV3Model::ffn(int64_t l, const float* x, const float* pending, float* out, int64_t T) {
  const LayerWeights& w = w_.layers[static_cast<size_t>(l)];
  const int64_t H = c_.hidden_size;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  if (!w.moe) {  // dense SwiGLU MLP: post_attn_norm inside gate_up, pending added inside down
    const int64_t inter = w.mlp_gate_up.t.shape[0] / 2;
    OwnedTensor gu = scratch(T, 2 * inter), act = scratch(T, inter);
    ops::LinearParams gate_up{x, 0, w.mlp_gate_up.t.data, w.mlp_gate_up.t.dtype, gu.f32(), 0, T, 2 * inter, H};
    gate_up.norm_weight = w.post_attn_norm.t.data, gate_up.norm_weight_dtype = w.post_attn_norm.t.dtype;
    gate_up.norm_eps = eps, gate_up.norm_residual = pending;
    be_.linear(gate_up);
    be_.swiglu({gu.f32(), act.f32(), T, inter});
    ops::LinearParams down{act.f32(), 0, w.mlp_down.t.data, w.mlp_down.t.dtype, out, 0, T, H, inter};
    down.add = pending;
    be_.linear(down);
    return;
  }
  const int64_t E = c_.n_routed_experts, k = c_.num_experts_per_tok;
  OwnedTensor logits = scratch(T, E);  // [T, E] router logits in f32
  OwnedTensor ids = be_.alloc(DType::I32, {T, k}), wts = scratch(T, k);
  OwnedTensor h = scratch(T, H);  // [T, H]: post_attn_norm(x + pending), the experts' input
  // Norm, gate projection and routing in one op (one launch per decode layer on CUDA).
  ops::RouterParams route{logits.f32(),
                          w.router_bias.f32(),
                          ids.t.as<int32_t>(),
                          wts.f32(),
                          T,
                          E,
                          k,
                          c_.n_group,
                          c_.topk_group,
                          c_.norm_topk_prob,
                          static_cast<float>(c_.routed_scaling_factor)};
  route.x = x, route.gate_weight = w.router.f32(), route.gate_logits = logits.f32(), route.hidden = H;
  route.norm_weight = w.post_attn_norm.t.data, route.norm_weight_dtype = w.post_attn_norm.t.dtype;
  route.norm_eps = eps, route.norm_residual = pending, route.normed_x = h.f32();
  be_.router(route);
  // The shared experts ride in the same op: decode streams every expert's weights in one pass.
  const bool shared = c_.n_shared_experts > 0;
  KILN_CHECK(!shared || w.shared_gate_up.t.dtype == w.experts_gate_up.t.dtype,
             "shared and routed expert weights must share a dtype, got {} and {}", dtype_name(w.shared_gate_up.t.dtype),
             dtype_name(w.experts_gate_up.t.dtype));
  ops::MoeParams moe{h.f32(),
                     ids.t.as<int32_t>(),
                     wts.f32(),
                     w.experts_gate_up.t.data,
                     w.experts_down.t.data,
                     w.experts_gate_up.t.dtype,
                     out,
                     T,
                     H,
                     c_.moe_intermediate_size,
                     E,
                     k};
  if (shared) {
    moe.w_shared_gate_up = w.shared_gate_up.t.data, moe.w_shared_down = w.shared_down.t.data;
    moe.shared_inter = w.shared_gate_up.t.shape[0] / 2;
  }
  moe.add = pending;  // out = experts + pending
  be_.moe(moe);
}

}  // namespace kiln
