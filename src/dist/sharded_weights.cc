#include "dist/sharded_weights.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <map>

#include "core/error.h"
#include "dist/weight_shard.h"
#include "model/host_weight.h"

namespace kiln::dist {
namespace {

constexpr const char* kScaleSuffix = "_scale_inv";

void require_float(const SafetensorsEntry& e) {
  const DType t = e.dtype;
  KILN_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F8E4M3,
             "{}: tensor \"{}\" has dtype {}; weights are F32, BF16, F16 or F8_E4M3", e.file, e.name, dtype_name(t));
}

class RankLoader {
 public:
  RankLoader(const ModelConfig& c, const Checkpoint& ckpt, ops::Backend& be, const ParallelLayout& layout, int rank)
      : c_(c), ckpt_(ckpt), be_(be), layout_(layout), rank_(rank) {
    for (const auto& w : weight_layout(c)) specs_.emplace(w.name, w);
    for (const auto& [name, e] : ckpt_.tensors()) {
      std::string base = name;
      if (base.size() > std::strlen(kScaleSuffix) && base.ends_with(kScaleSuffix))
        base.resize(base.size() - std::strlen(kScaleSuffix));
      KILN_CHECK(specs_.count(base), "{}: unexpected tensor \"{}\" (shape {}) is not part of this config's model",
                 e->file, name, shape_str(e->shape));
    }
  }

  // This rank's slice of `name` in f32 on the host, [rows, cols] row-major.
  std::vector<float> host(const std::string& name) {
    const WeightSpec& w = specs_.at(name);
    const SafetensorsEntry* e = ckpt_.find(name);
    KILN_CHECK(e != nullptr, "{}: missing tensor \"{}\" (expected shape {})", ckpt_.dir(), name, shape_str(w.shape));
    KILN_CHECK(e->shape == w.shape, "{}: tensor \"{}\" has shape {} but the config expects {}", e->file, name,
               shape_str(e->shape), shape_str(w.shape));
    require_float(*e);
    const WeightShard s = weight_shard(w, c_, layout_, rank_);
    KILN_CHECK(s.held, "internal: rank {} reads \"{}\", which it does not hold", rank_, name);
    const int64_t n = w.shape[0], k = w.numel() / std::max<int64_t>(1, n);
    const Range rows = s.dim == 0 ? s.range : Range{0, n}, cols = s.dim == 1 ? s.range : Range{0, k};
    const size_t esz = dtype_size(e->dtype), width = static_cast<size_t>(cols.size());
    std::vector<float> out(static_cast<size_t>(rows.size()) * width);
    const char* base = static_cast<const char*>(e->data);
    for (int64_t i = rows.begin; i < rows.end; ++i)
      convert_to_f32(e->dtype, base + static_cast<size_t>(i * k + cols.begin) * esz,
                     out.data() + static_cast<size_t>(i - rows.begin) * width, width);
    if (e->dtype == DType::F8E4M3) dequantise(*e, rows, cols, out);
    return out;
  }

  OwnedTensor upload(const std::vector<float>& v, Shape shape, bool force_f32 = false) {
    return upload_plain(be_, "a rank's slice", v, std::move(shape), force_f32 ? DType::F32 : be_.weight_dtype());
  }
  OwnedTensor get(const std::string& name, Shape shape, bool force_f32 = false) {
    return upload(host(name), std::move(shape), force_f32);
  }

 private:
  // Each value times the scale of the 128 x 128 block (global indices) it lies in.
  void dequantise(const SafetensorsEntry& e, Range rows, Range cols, std::vector<float>& out) {
    const std::string sname = e.name + kScaleSuffix;
    const SafetensorsEntry* s = ckpt_.find(sname);
    KILN_CHECK(s != nullptr, "{}: FP8 tensor \"{}\" has no \"{}\"", e.file, e.name, sname);
    KILN_CHECK(e.shape.size() == 2, "{}: FP8 tensor \"{}\" must be 2-D, has shape {}", e.file, e.name,
               shape_str(e.shape));
    const int64_t bn = c_.fp8 ? c_.fp8->block_n : 128, bk = c_.fp8 ? c_.fp8->block_k : 128;
    auto blocks = [](int64_t len, int64_t block) { return len == 0 ? 0 : (len - 1) / block + 1; };
    const Shape want = {blocks(e.shape[0], bn), blocks(e.shape[1], bk)};
    KILN_CHECK(s->shape == want, "{}: tensor \"{}\" has shape {} but {} x {} blocks of {} need {}", s->file, sname,
               shape_str(s->shape), bn, bk, shape_str(e.shape), shape_str(want));
    require_float(*s);
    std::vector<float> scale(static_cast<size_t>(shape_numel(s->shape)));
    convert_to_f32(s->dtype, s->data, scale.data(), scale.size());
    const int64_t width = cols.size();
    for (int64_t i = rows.begin; i < rows.end; ++i)
      for (int64_t j = cols.begin; j < cols.end; ++j)
        out[static_cast<size_t>((i - rows.begin) * width + (j - cols.begin))] *=
            scale[static_cast<size_t>((i / bn) * want[1] + j / bk)];
  }

  const ModelConfig& c_;
  const Checkpoint& ckpt_;
  ops::Backend& be_;
  const ParallelLayout& layout_;
  int rank_;
  std::map<std::string, WeightSpec> specs_;
};

std::vector<float> concat(std::vector<float> a, const std::vector<float>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Rows [0, rows) of a [per, H] table whose other rows are zero (the last ranks' vocabulary padding).
std::vector<float> pad_rows(std::vector<float> v, int64_t per, int64_t H) {
  v.resize(static_cast<size_t>(per * H), 0.0f);
  return v;
}

void load_rank_layer(const ModelConfig& c, int64_t l, const RankShare& s, RankLoader& ld, LayerWeights& w) {
  const std::string p = fmt::format("model.layers.{}.", l);
  const int64_t H = c.hidden_size, nh = s.heads.size(), nope = c.qk_nope_head_dim, vd = c.v_head_dim,
                r = c.kv_lora_rank;
  w.input_norm = ld.get(p + "input_layernorm.weight", {H});
  w.post_attn_norm = ld.get(p + "post_attention_layernorm.weight", {H});
  const bool lora = c.q_lora_rank > 0;
  const std::string q_name = p + (lora ? "self_attn.q_a_proj.weight" : "self_attn.q_proj.weight");
  const int64_t q_rows = lora ? c.q_lora_rank : nh * c.qk_head_dim();
  w.qkv_a = ld.upload(concat(ld.host(q_name), ld.host(p + "self_attn.kv_a_proj_with_mqa.weight")),
                      {q_rows + c.kv_row_dim(), H});
  if (lora) {
    w.q_a_norm = ld.get(p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank});
    w.q_b = ld.get(p + "self_attn.q_b_proj.weight", {nh * c.qk_head_dim(), c.q_lora_rank});
  }
  w.kv_a_norm = ld.get(p + "self_attn.kv_a_layernorm.weight", {r});
  const std::vector<float> kv_b = ld.host(p + "self_attn.kv_b_proj.weight");
  w.kv_b = ld.upload(kv_b, {nh * (nope + vd), r});
  w.w_uk_t = ld.upload(w_uk_transpose(kv_b, nh, nope, vd, r), {nh, r, nope});
  w.o_proj = ld.get(p + "self_attn.o_proj.weight", {H, nh * vd});
  w.moe = c.is_moe_layer(l);
  if (!w.moe) {
    const int64_t I = s.dense_inter.size();
    w.mlp_gate_up =
        ld.upload(concat(ld.host(p + "mlp.gate_proj.weight"), ld.host(p + "mlp.up_proj.weight")), {2 * I, H});
    w.mlp_down = ld.get(p + "mlp.down_proj.weight", {H, I});
    return;
  }
  const int64_t E = c.n_routed_experts, El = s.experts.size(), I = s.expert_inter.size();
  w.router = ld.get(p + "mlp.gate.weight", {E, H}, true);
  w.router_bias = ld.get(p + "mlp.gate.e_score_correction_bias", {E}, true);
  std::vector<float> gu, dn;
  gu.reserve(static_cast<size_t>(El * 2 * I * H));
  dn.reserve(static_cast<size_t>(El * H * I));
  for (int64_t e = s.experts.begin; e < s.experts.end; ++e) {
    const std::string ep = p + fmt::format("mlp.experts.{}.", e);
    for (const char* part : {"gate_proj.weight", "up_proj.weight"}) {
      const auto v = ld.host(ep + part);
      gu.insert(gu.end(), v.begin(), v.end());
    }
    const auto d = ld.host(ep + "down_proj.weight");
    dn.insert(dn.end(), d.begin(), d.end());
  }
  w.experts_gate_up = ld.upload(gu, {El, 2 * I, H});
  w.experts_down = ld.upload(dn, {El, H, I});
  if (c.n_shared_experts > 0) {
    const int64_t S = s.shared_inter.size();
    const std::string sp = p + "mlp.shared_experts.";
    w.shared_gate_up = ld.upload(concat(ld.host(sp + "gate_proj.weight"), ld.host(sp + "up_proj.weight")), {2 * S, H});
    w.shared_down = ld.get(sp + "down_proj.weight", {H, S});
  }
}

}  // namespace

ModelWeights load_rank_weights(const ModelConfig& c, const Checkpoint& ckpt, ops::Backend& be,
                               const ParallelLayout& layout, int rank) {
  // The ranks read plain slices (an FP8 checkpoint's dequantized); INT4 words are packed along the
  // rows' inputs, which a split cuts, and slicing them is not written yet.
  KILN_CHECK(!c.int4,
             "compressed-tensors INT4 checkpoints cannot be split over ranks yet: serve it on one device "
             "(without --tp / --enable-expert-parallel / --dcp)");
  RankLoader ld(c, ckpt, be, layout, rank);
  const RankShare s = layout.share(rank);
  const int64_t H = c.hidden_size, per = layout.vocab_per_rank();
  ModelWeights w;
  w.embed = ld.upload(pad_rows(ld.host("model.embed_tokens.weight"), per, H), {per, H});
  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) load_rank_layer(c, l, s, ld, w.layers[static_cast<size_t>(l)]);
  w.final_norm = ld.get("model.norm.weight", {H});
  w.lm_head = c.tie_word_embeddings ? w.embed : ld.upload(pad_rows(ld.host("lm_head.weight"), per, H), {per, H});
  return w;
}

ModelWeights random_rank_weights(const ModelConfig& c, ops::Backend& be, const ParallelLayout& layout, int rank,
                                 uint64_t seed) {
  const RankShare s = layout.share(rank);
  const DType wd = be.weight_dtype();
  const int64_t H = c.hidden_size, nh = s.heads.size(), nope = c.qk_nope_head_dim, vd = c.v_head_dim,
                r = c.kv_lora_rank, per = layout.vocab_per_rank();
  seed = seed * 1000003 + static_cast<uint64_t>(rank) * 7919;  // ranks hold different slices
  auto matrix = [&](Shape shape, DType dt) {
    OwnedTensor t = be.alloc(dt, shape);
    be.fill_random(t.t, ++seed, std::sqrt(3.0f / static_cast<float>(shape.back())));
    return t;
  };
  auto constant = [&](int64_t n, float v) {
    OwnedTensor t = be.alloc(DType::F32, {n});
    std::vector<float> h(static_cast<size_t>(n), v);
    be.upload(t.t, h.data());
    return t;
  };
  auto to_backend = [&](const std::vector<float>& v, Shape shape) {
    return upload_plain(be, "a rank's random weights", v, std::move(shape), wd);
  };
  ModelWeights w;
  w.embed = matrix({per, H}, wd);
  const int64_t q_rows = c.q_lora_rank > 0 ? c.q_lora_rank : nh * c.qk_head_dim();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights lw;
    lw.input_norm = constant(H, 1.0f);
    lw.post_attn_norm = constant(H, 1.0f);
    lw.qkv_a = matrix({q_rows + c.kv_row_dim(), H}, wd);
    if (c.q_lora_rank > 0) {
      lw.q_a_norm = constant(c.q_lora_rank, 1.0f);
      lw.q_b = matrix({nh * c.qk_head_dim(), c.q_lora_rank}, wd);
    }
    lw.kv_a_norm = constant(r, 1.0f);
    OwnedTensor kvb_f32 = matrix({nh * (nope + vd), r}, DType::F32);
    std::vector<float> kv_b(static_cast<size_t>(kvb_f32.t.numel()));
    be.download(kv_b.data(), kvb_f32.t);
    lw.kv_b = to_backend(kv_b, {nh * (nope + vd), r});
    lw.w_uk_t = to_backend(w_uk_transpose(kv_b, nh, nope, vd, r), {nh, r, nope});
    lw.o_proj = matrix({H, nh * vd}, wd);
    lw.moe = c.is_moe_layer(l);
    if (!lw.moe) {
      lw.mlp_gate_up = matrix({2 * s.dense_inter.size(), H}, wd);
      lw.mlp_down = matrix({H, s.dense_inter.size()}, wd);
    } else {
      const int64_t El = s.experts.size(), I = s.expert_inter.size();
      lw.router = matrix({c.n_routed_experts, H}, DType::F32);
      lw.router_bias = constant(c.n_routed_experts, 0.0f);
      lw.experts_gate_up = matrix({El, 2 * I, H}, wd);
      lw.experts_down = matrix({El, H, I}, wd);
      if (c.n_shared_experts > 0) {
        lw.shared_gate_up = matrix({2 * s.shared_inter.size(), H}, wd);
        lw.shared_down = matrix({H, s.shared_inter.size()}, wd);
      }
    }
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = constant(H, 1.0f);
  w.lm_head = c.tie_word_embeddings ? w.embed : matrix({per, H}, wd);
  return w;
}

ModelShard model_shard(const ParallelLayout& layout, int rank, Communicator* comm) {
  const ParallelConfig& p = layout.parallel();
  KILN_CHECK(comm != nullptr || p.world_size == 1, "internal: rank {} of {} without a communicator", rank,
             p.world_size);
  const RankShare s = layout.share(rank);
  ModelShard m;
  m.comm = p.world_size > 1 ? comm : nullptr;  // one rank: today's path, no collective
  m.rank = rank;
  m.world = p.world_size;
  if (!m.comm) return m;
  m.heads = s.heads.size();
  m.expert_begin = s.experts.begin;
  m.experts = s.experts.size();
  m.ep_alltoall = p.ep_alltoall && m.experts > 0;
  m.ep = p.ep;
  m.vocab_begin = s.vocab.begin;
  m.vocab_rows = s.vocab.size();
  m.vocab_per_rank = layout.vocab_per_rank();
  KILN_CHECK(p.dcp == 1 || (p.dcp == p.world_size && p.dcp_interleave == 1),
             "--dcp {} with --tp {}: decode context parallelism runs over the whole TP group (--dcp equal to --tp) "
             "for now",
             p.dcp, p.tp);
  m.dcp = p.dcp;
  m.dcp_rank = s.dcp_rank;
  return m;
}

}  // namespace kiln::dist
