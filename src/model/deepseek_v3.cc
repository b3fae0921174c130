#include "model/deepseek_v3.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/kv_fp8.h"
#include "core/log.h"
#include "dist/communicator.h"
#include "model/rank_group.h"
#include "model/step_inputs.h"

namespace kiln {

DeepseekV3Model::DeepseekV3Model(ModelConfig config, ModelWeights weights, ops::Backend& backend)
    : DeepseekV3Model(std::move(config), std::move(weights), backend, ModelShard{}) {}

DeepseekV3Model::DeepseekV3Model(ModelConfig config, ModelWeights weights, ops::Backend& backend, ModelShard shard)
    : c_(std::move(config)),
      w_(std::move(weights)),
      be_(backend),
      shard_(shard),
      nh_(shard.heads > 0 ? shard.heads : c_.num_attention_heads),
      kv_dtype_(backend.kv_dtype()) {
  std::vector<double> inv = c_.rope_inv_freq();
  std::vector<float> invf(inv.begin(), inv.end());
  inv_freq_ = be_.alloc(DType::F32, {static_cast<int64_t>(invf.size())});
  be_.upload(inv_freq_.t, invf.data());
  rope_factor_ = static_cast<float>(c_.rope_attention_factor());
  scale_ = static_cast<float>(c_.softmax_scale());
}

std::unique_ptr<DeepseekV3Model> DeepseekV3Model::load(const std::string& dir, ops::Backend& backend,
                                                       WeightQuant quant) {
  ModelConfig c = load_model_config((std::filesystem::path(dir) / "config.json").string());
  Checkpoint ckpt(dir);
  ModelWeights w = load_weights(c, ckpt, backend, quant);
  return std::make_unique<DeepseekV3Model>(std::move(c), std::move(w), backend);
}

void DeepseekV3Model::set_kv_dtype(DType t) {
  KILN_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F8E4M3,
             "the KV cache must be f32, bf16 or fp8_e4m3, not {}", dtype_name(t));
  // Only the CPU reference reads the FP8 rows so far. Refuse rather than fall back to another
  // cache type or run kernels no GPU has checked against the reference.
  KILN_CHECK(t != DType::F8E4M3 || be_.device() == Device::CPU,
             "--kv-cache-dtype fp8_e4m3: the {} kernels for the FP8 latent KV cache are not built yet (the CPU "
             "backend runs it); use --kv-cache-dtype bf16 or f32 here",
             be_.name());
  kv_dtype_ = t;
  if (group_)
    for (auto& peer : group_->peers) peer->set_kv_dtype(t);
}

LatentKvPool DeepseekV3Model::new_pool(int64_t num_blocks, int64_t block_size) const {
  KILN_CHECK(num_blocks > 0 && block_size > 0, "KV pool needs positive blocks and block size, got {} x {}", num_blocks,
             block_size);
  LatentKvPool p;
  p.num_blocks = num_blocks;
  p.block_size = block_size;
  p.row_dim = c_.kv_row_dim();
  p.kv_lora = c_.kv_lora_rank;
  p.dtype = kv_dtype_;
  const int64_t spare = shard_.dcp > 1 ? 1 : 0;  // DCP: the row other ranks' tokens are written to
  const int64_t rows = num_blocks * block_size + spare;
  for (int64_t l = 0; l < c_.num_hidden_layers; ++l)
    p.layers.push_back(p.dtype == DType::F8E4M3
                           ? be_.alloc(DType::U8, {rows, kv_fp8_layout(p.kv_lora, p.row_dim - p.kv_lora).row_bytes})
                           : be_.alloc(p.dtype, {rows, p.row_dim}));
  if (group_) {
    p.peers = std::make_shared<std::vector<LatentKvPool>>();
    for (auto& peer : group_->peers) p.peers->push_back(peer->new_pool(num_blocks, block_size));
    if (group_->remote) p.remote = group_->remote->new_pool(p);
  }
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

int64_t DeepseekV3Model::capture_decode_graphs() {
  if (!graphs_) return 0;
  LatentKvPool& pool = *graphs_->pool;
  for (int64_t b = 1; b <= graphs_->max_batch; b = DecodeGraphs::bucket(b) + 1) {
    const int64_t B = DecodeGraphs::bucket(b);
    ForwardBatch fb;  // B one-token sequences at position 0, every one in slot 0
    fb.tokens.assign(static_cast<size_t>(B), 0);
    fb.positions.assign(static_cast<size_t>(B), 0);
    fb.slot_mapping.assign(static_cast<size_t>(B), 0);
    fb.kv_lens.assign(static_cast<size_t>(B), 1);
    fb.max_blocks = 1;
    fb.block_tables.assign(static_cast<size_t>(B), 0);
    for (int64_t i = 0; i <= B; ++i) fb.cu_q.push_back(static_cast<int32_t>(i));
    for (int64_t i = 0; i < B; ++i) fb.logit_rows.push_back(static_cast<int32_t>(i));
    forward_logits(fb, pool, MlaForm::Absorbed);
  }
  be_.synchronize();
  int64_t n = 0;
  for (const auto& [size, graph] : graphs_->captured) n += graph != nullptr;
  return n;
}

void DeepseekV3Model::disable_decode_graphs(const LatentKvPool* pool) {
  if (!pool || (graphs_ && graphs_->pool == pool)) graphs_.reset();
  if (group_)
    for (size_t i = 0; i < group_->peers.size(); ++i)
      group_->peers[i]->disable_decode_graphs(pool && pool->peers ? &(*pool->peers)[i] : nullptr);
}

void DeepseekV3Model::attach_group(std::unique_ptr<RankGroup> group) {
  // One process drives ranks first_rank.. of the group; rank 0's process alone has every rank
  // unless the others are remote.
  KILN_CHECK(group && shard_.rank == group->first_rank && group->first_rank + group->world_size() <= shard_.world &&
                 (group->first_rank > 0 || group->remote || group->world_size() == shard_.world),
             "internal: a rank group of {} ranks for rank {} of {}", group ? group->world_size() : 0, shard_.rank,
             shard_.world);
  group_ = std::move(group);
}

int DeepseekV3Model::world_size() const {
  return shard_.world;
}

std::vector<ops::Backend*> DeepseekV3Model::rank_backends() const {
  std::vector<ops::Backend*> out{&be_};
  if (group_)
    for (const auto& b : group_->backends) out.push_back(b.get());
  return out;
}

void DeepseekV3Model::all_reduce(float* buf, int64_t n) {
  if (shard_.comm) shard_.comm->all_reduce(buf, buf, static_cast<size_t>(n), DType::F32);
}

DeepseekV3Model::~DeepseekV3Model() = default;

void DeepseekV3Model::enable_decode_graphs(LatentKvPool& pool, int64_t max_batch, int64_t max_blocks) {
  if (group_ && pool.peers)
    for (size_t i = 0; i < group_->peers.size(); ++i)
      group_->peers[i]->enable_decode_graphs((*pool.peers)[i], max_batch, max_blocks);
  if (!be_.supports_graphs() || max_batch <= 0) return;
  graphs_ = std::make_unique<DecodeGraphs>();
  graphs_->max_batch = DecodeGraphs::bucket(max_batch);
  graphs_->max_blocks = max_blocks;
  graphs_->pool = &pool;
  const int64_t B = graphs_->max_batch;
  graphs_->inputs = be_.alloc(DType::I32, {StepInputLayout(B, B, max_blocks).total});
  graphs_->logits = scratch(B, c_.vocab_size);
}

std::vector<float> DeepseekV3Model::forward(const ForwardBatch& batch, LatentKvPool& pool, MlaForm form) {
  const Tensor logits = forward_logits(batch, pool, form);
  std::vector<float> out(static_cast<size_t>(logits.numel()));
  if (!out.empty()) be_.download(out.data(), logits);
  return out;
}

Tensor DeepseekV3Model::forward_logits(const ForwardBatch& batch, LatentKvPool& pool, MlaForm form) {
  last_hidden_ = {};
  if (!group_) return forward_local(batch, pool, form);
  // Input embeddings live on rank 0's device only (the MTP layer runs unsplit).
  KILN_CHECK(!batch.input_embeds, "input embeddings are not supported on a split model");
  // Every rank runs the same step (SPMD); rank 0's logits are the answer. A malformed batch is
  // refused here, before any rank starts, so that it cannot fail on some ranks mid-collective.
  KILN_CHECK(pool.peers && pool.peers->size() == group_->peers.size(),
             "a KV pool of a split model must come from its new_pool (one pool per rank)");
  check_batch(batch, pool);
  if (group_->remote) group_->remote->step(batch, pool, static_cast<int>(form));
  Tensor out;
  group_->run([&](int r) {
    if (r == 0)
      out = forward_local(batch, pool, form);
    else
      group_->peers[static_cast<size_t>(r - 1)]->forward_local(batch, (*pool.peers)[static_cast<size_t>(r - 1)], form);
  });
  return out;
}

Tensor DeepseekV3Model::forward_local(const ForwardBatch& batch, LatentKvPool& pool, MlaForm form) {
  const int64_t rows = static_cast<int64_t>(batch.logit_rows.size()), V = c_.vocab_size;
  for (int32_t r : batch.logit_rows)
    KILN_CHECK(r >= 0 && r < batch.num_tokens(), "logit row {} is outside the batch of {} tokens", r,
               batch.num_tokens());
  if (graphs_ && graph_eligible(batch, pool, form)) {
    const int64_t Bp = DecodeGraphs::bucket(batch.num_seqs());
    auto [it, fresh] = graphs_->captured.try_emplace(Bp);
    if (fresh || it->second) {  // sizes that could not be captured take the eager path below
      StepInputs in = upload_inputs(batch, pool, MlaForm::Absorbed, Bp, &graphs_->inputs);
      float* out = graphs_->logits.f32();
      if (fresh) {
        // First sight of this size: run it for real, then record the same work for next time.
        compute(in, pool, nullptr, in.T, out);
        it->second = capture(in, pool, out);
      } else {
        be_.replay(it->second);
      }
      last_logits_ = {};
      return Tensor{out, DType::F32, {rows, V}, graphs_->logits.t.device};
    }
  }
  StepInputs in = upload_inputs(batch, pool, form, 0, nullptr);
  last_logits_ = scratch(rows, V);
  compute(in, pool, in.logit_rows.data(), rows, last_logits_.f32());
  return last_logits_.t;
}

bool DeepseekV3Model::graph_eligible(const ForwardBatch& batch, const LatentKvPool& pool, MlaForm form) const {
  const int64_t B = batch.num_seqs();
  if (&pool != graphs_->pool || shard_.dcp > 1 || shard_.ep_alltoall || !batch.hidden_rows.empty() ||
      batch.input_embeds || form == MlaForm::Expanded || B > graphs_->max_batch ||
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
    compute(in, pool, nullptr, in.T, logits);
    auto graph = be_.end_capture();
    spdlog::debug("captured a CUDA graph for decode steps of {} sequences", in.B);
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
void DeepseekV3Model::compute(const StepInputs& in, LatentKvPool& pool, const int32_t* logit_rows, int64_t rows,
                              float* logits) {
  const int64_t T = in.T, H = c_.hidden_size, V = c_.vocab_size;
  // The residual stream is x + pending: x (the embeddings) is never written inside the layers, and
  // pending sums every sub-layer's output so far. Each sub-layer normalises x + pending inside its
  // first op and adds pending to its output inside its last, so no layer runs a separate norm or
  // add. ya and ym (attention, FFN) alternate so that no op reads the buffer it writes.
  OwnedTensor x = scratch(T, H), ya = scratch(T, H), ym = scratch(T, H);  // [T, H] each
  ops::EmbeddingParams embed{in.ids.t.as<int32_t>(), w_.embed.t.data, w_.embed.t.dtype, x.f32(), T, V, H};
  if (in.input_embeds) {  // the caller's inputs, each sequence's rows moved to its reordered place
    for (const auto& [src, dst, n] : in.embed_runs)
      be_.copy({in.input_embeds + src * H, H, x.f32() + dst * H, H, n, H});
  } else if (shard_.sharded()) {  // vocabulary parallel: each rank looks up its rows, zeros elsewhere; summed
    embed.vocab = shard_.vocab_rows, embed.vocab_begin = shard_.vocab_begin, embed.zero_outside = true;
    be_.embedding(embed);
    all_reduce(x.f32(), T * H);
  } else {
    be_.embedding(embed);
  }
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const float* pending = nullptr;  // [T, H], not yet added to x (null: nothing)
  const std::vector<int32_t>& taps = in.hidden_taps;
  if (!in.hidden_rows.empty())  // [hidden rows, taps, H]
    last_hidden_ =
        be_.alloc(DType::F32, {static_cast<int64_t>(in.hidden_rows.size()), static_cast<int64_t>(taps.size()), H});
  for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
    attention(l, x.f32(), pending, ya.f32(), in, pool);
    ffn(l, x.f32(), ya.f32(), ym.f32(), T);
    pending = ym.f32();
    if (!in.hidden_rows.empty())
      for (size_t i = 0; i < taps.size(); ++i)
        if (taps[i] == l) tap_hidden(in, x.f32(), pending, static_cast<int64_t>(i), false);
  }
  if (!in.hidden_rows.empty())
    for (size_t i = 0; i < taps.size(); ++i)
      if (taps[i] == kHiddenFinalNorm) tap_hidden(in, x.f32(), pending, static_cast<int64_t>(i), true);
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
  if (!shard_.sharded()) {
    be_.linear({sel.f32(), 0, w_.lm_head.t.data, w_.lm_head.t.dtype, logits, 0, rows, V, H});
    return;
  }
  // Vocabulary parallel: each rank's logits for its rows (padded to one width), gathered side by side.
  const int64_t per = shard_.vocab_per_rank, world = shard_.world;
  OwnedTensor local = scratch(rows, per), all = scratch(world * rows, per);  // [rows, per], [world, rows, per]
  be_.linear({sel.f32(), 0, w_.lm_head.t.data, w_.lm_head.t.dtype, local.f32(), 0, rows, per, H});
  shard_.comm->all_gather(local.f32(), all.f32(), static_cast<size_t>(rows * per), DType::F32);
  for (int64_t r = 0; r < world; ++r)
    if (const int64_t cols = std::min(per, V - r * per); cols > 0)
      be_.copy({all.f32() + r * rows * per, per, logits + r * per, V, rows, cols});
}

void DeepseekV3Model::tap_hidden(const StepInputs& in, const float* x, const float* pending, int64_t tap, bool norm) {
  const int64_t H = c_.hidden_size, R = static_cast<int64_t>(in.hidden_rows.size());
  const int64_t ntaps = last_hidden_.t.shape[1];
  // The rows of x and of pending gathered ([R, H] each; one copy per run of consecutive rows),
  // summed (and normed) into column `tap` of the output.
  OwnedTensor xr = scratch(R, H), pr = scratch(R, H);
  for (int64_t i = 0, n = 1; i < R; i += n) {
    const int64_t r = in.hidden_rows[static_cast<size_t>(i)];
    for (n = 1; i + n < R && in.hidden_rows[static_cast<size_t>(i + n)] == r + n;) ++n;
    be_.copy({x + r * H, H, xr.f32() + i * H, H, n, H});
    be_.copy({pending + r * H, H, pr.f32() + i * H, H, n, H});
  }
  float* out = last_hidden_.f32() + tap * H;  // rows ntaps * H apart
  if (norm) {
    ops::RmsNormParams p{xr.f32(),
                         0,
                         w_.final_norm.t.data,
                         w_.final_norm.t.dtype,
                         out,
                         ntaps * H,
                         R,
                         H,
                         static_cast<float>(c_.rms_norm_eps)};
    p.residual = pr.f32();
    be_.rms_norm(p);
    return;
  }
  be_.add({xr.f32(), pr.f32(), xr.f32(), R * H});
  be_.copy({xr.f32(), H, out, ntaps * H, R, H});
}

void DeepseekV3Model::ffn(int64_t l, const float* x, const float* pending, float* out, int64_t T) {
  const LayerWeights& w = w_.layers[static_cast<size_t>(l)];
  const int64_t H = c_.hidden_size;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  if (!w.moe) {  // dense SwiGLU MLP: post_attn_norm inside gate_up, pending added inside down
    const int64_t inter = w.mlp_gate_up.t.shape[0] / 2;
    OwnedTensor gu = scratch(T, 2 * inter), act = scratch(T, inter);
    ops::LinearParams gate_up{x, 0, w.mlp_gate_up.t.data, w.mlp_gate_up.t.dtype, gu.f32(), 0, T, 2 * inter, H};
    gate_up.w_scales = w.mlp_gate_up.scales();
    gate_up.norm_weight = w.post_attn_norm.t.data, gate_up.norm_weight_dtype = w.post_attn_norm.t.dtype;
    gate_up.norm_eps = eps, gate_up.norm_residual = pending;
    be_.linear(gate_up);
    be_.swiglu({gu.f32(), act.f32(), T, inter});
    ops::LinearParams down{act.f32(), 0, w.mlp_down.t.data, w.mlp_down.t.dtype, out, 0, T, H, inter};
    down.w_scales = w.mlp_down.scales();
    down.add = shard_.rank == 0 ? pending : nullptr;  // split: rank 0 adds the residual, the sum the rest
    be_.linear(down);
    all_reduce(out, T * H);
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
  if (shard_.ep_alltoall) return moe_alltoall(l, h.f32(), ids.t, wts.t, pending, out, T);
  // Expert parallel: the router ran replicated over every expert; this rank keeps its own.
  const int64_t local_experts = shard_.experts > 0 ? shard_.experts : E;
  if (local_experts != E) be_.expert_slice({ids.t.as<int32_t>(), wts.f32(), T * k, shard_.expert_begin, local_experts});
  // The shared experts ride in the same op: decode streams every expert's weights in one pass.
  const bool shared = c_.n_shared_experts > 0;
  ops::MoeParams moe{h.f32(),
                     ids.t.as<int32_t>(),
                     wts.f32(),
                     w.experts_gate_up.t.data,
                     w.experts_down.t.data,
                     w.experts_gate_up.t.dtype,
                     out,
                     T,
                     H,
                     w.experts_gate_up.t.shape[1] / 2,  // this rank's slice of moe_intermediate_size
                     local_experts,
                     k};
  moe.w_gate_up_scales = w.experts_gate_up.scales(), moe.w_down_scales = w.experts_down.scales();
  if (shared) {
    moe.w_shared_gate_up = w.shared_gate_up.t.data, moe.w_shared_down = w.shared_down.t.data;
    moe.shared_inter = w.shared_gate_up.t.shape[0] / 2;
    // Kimi K2-Thinking keeps the shared experts bf16 beside INT4 routed ones.
    KILN_CHECK(w.shared_gate_up.t.dtype == w.shared_down.t.dtype,
               "shared expert gate_up and down dtypes differ: {}, {}", dtype_name(w.shared_gate_up.t.dtype),
               dtype_name(w.shared_down.t.dtype));
    if (w.shared_gate_up.t.dtype != w.experts_gate_up.t.dtype) moe.w_shared_dtype = w.shared_gate_up.t.dtype;
    moe.w_shared_gate_up_scales = w.shared_gate_up.scales(), moe.w_shared_down_scales = w.shared_down.scales();
  }
  moe.add = shard_.rank == 0 ? pending : nullptr;  // out = experts + pending (summed over ranks when split)
  be_.moe(moe);
  all_reduce(out, T * H);
}

}  // namespace kiln
