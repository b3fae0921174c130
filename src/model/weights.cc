#include "model/weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "model/weight_layout.h"

namespace kiln {
namespace {

constexpr const char* kScaleSuffix = "_scale_inv";

// Weights and FP8 scales are floating point; an integer tensor in their place is a corrupt file.
void require_float(const SafetensorsEntry& e) {
  const DType t = e.dtype;
  KILN_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F8E4M3,
             "{}: tensor \"{}\" has dtype {}; weights are F32, BF16, F16 or F8_E4M3", e.file, e.name, dtype_name(t));
}

// Widens one checkpoint tensor to f32 on the host, dequantising FP8 blocks.
std::vector<float> read_f32(const ModelConfig& c, const Checkpoint& ckpt, const SafetensorsEntry& e) {
  require_float(e);
  std::vector<float> out(static_cast<size_t>(shape_numel(e.shape)));
  convert_to_f32(e.dtype, e.data, out.data(), out.size());
  if (e.dtype != DType::F8E4M3) return out;
  const std::string sname = e.name + kScaleSuffix;
  const SafetensorsEntry* s = ckpt.find(sname);
  KILN_CHECK(s != nullptr, "{}: FP8 tensor \"{}\" has no \"{}\"", e.file, e.name, sname);
  KILN_CHECK(e.shape.size() == 2, "{}: FP8 tensor \"{}\" must be 2-D, has shape {}", e.file, e.name,
             shape_str(e.shape));
  const int64_t bn = c.fp8 ? c.fp8->block_n : 128, bk = c.fp8 ? c.fp8->block_k : 128;
  const int64_t n = e.shape[0], k = e.shape[1];
  auto blocks = [](int64_t len, int64_t block) { return len == 0 ? 0 : (len - 1) / block + 1; };  // no overflow
  const Shape want = {blocks(n, bn), blocks(k, bk)};
  KILN_CHECK(s->shape == want, "{}: tensor \"{}\" has shape {} but {} x {} blocks of {} need {}", s->file, sname,
             shape_str(s->shape), bn, bk, shape_str(e.shape), shape_str(want));
  require_float(*s);
  std::vector<float> scale(static_cast<size_t>(shape_numel(s->shape)));
  convert_to_f32(s->dtype, s->data, scale.data(), scale.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j)
      out[static_cast<size_t>(i * k + j)] *= scale[static_cast<size_t>((i / bn) * want[1] + j / bk)];
  return out;
}

class Loader {
 public:
  Loader(const ModelConfig& c, const Checkpoint& ckpt, ops::Backend& be) : c_(c), ckpt_(ckpt), be_(be) {
    for (const auto& w : weight_layout(c)) specs_.emplace(w.name, w);
    check_unexpected();
  }

  // One tensor as stored, converted to the backend's weight dtype.
  OwnedTensor get(const std::string& name) { return upload(name, host(name), spec(name).shape); }

  std::vector<float> host(const std::string& name) {
    const SafetensorsEntry& e = entry(name);
    auto v = read_f32(c_, ckpt_, e);
    progress_.advance(e.nbytes);
    return v;
  }

  OwnedTensor upload(const std::string& what, const std::vector<float>& v, Shape shape, bool force_f32 = false) {
    const DType dt = force_f32 ? DType::F32 : be_.weight_dtype();
    OwnedTensor t = be_.alloc(dt, std::move(shape));
    KILN_CHECK(static_cast<size_t>(t.t.numel()) == v.size(), "internal: {} size mismatch", what);
    if (dt == DType::F32) {
      be_.upload(t.t, v.data());
    } else {
      KILN_CHECK(dt == DType::BF16, "internal: unsupported weight dtype {}", dtype_name(dt));
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
      be_.upload(t.t, h.data());
    }
    return t;
  }

  const WeightSpec& spec(const std::string& name) const { return specs_.at(name); }
  void finish() { progress_.finish(); }

 private:
  const SafetensorsEntry& entry(const std::string& name) {
    const WeightSpec& w = spec(name);
    const SafetensorsEntry* e = ckpt_.find(name);
    KILN_CHECK(e != nullptr, "{}: missing tensor \"{}\" (expected shape {})", ckpt_.dir(), name, shape_str(w.shape));
    KILN_CHECK(e->shape == w.shape, "{}: tensor \"{}\" has shape {} but the config expects {}", e->file, name,
               shape_str(e->shape), shape_str(w.shape));
    return *e;
  }

  void check_unexpected() {
    size_t total = 0;
    for (const auto& [name, e] : ckpt_.tensors()) {
      std::string base = name;
      if (base.size() > std::strlen(kScaleSuffix) && base.ends_with(kScaleSuffix))
        base.resize(base.size() - std::strlen(kScaleSuffix));
      auto it = specs_.find(base);
      KILN_CHECK(it != specs_.end(), "{}: unexpected tensor \"{}\" (shape {}) is not part of this config's model",
                 e->file, name, shape_str(e->shape));
      if (!it->second.mtp) total += e->nbytes;
    }
    progress_ = Progress("loading " + ckpt_.dir(), total);
  }

  const ModelConfig& c_;
  const Checkpoint& ckpt_;
  ops::Backend& be_;
  std::map<std::string, WeightSpec> specs_;
  Progress progress_{"", 0};
};

// Stacks matrices row-wise (gate over up, q over kv_a) into one host array.
std::vector<float> concat(std::vector<float> a, const std::vector<float>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void load_layer(const ModelConfig& c, int64_t l, Loader& ld, LayerWeights& w) {
  const std::string p = fmt::format("model.layers.{}.", l);
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, nope = c.qk_nope_head_dim, vd = c.v_head_dim,
                r = c.kv_lora_rank;
  w.input_norm = ld.get(p + "input_layernorm.weight");
  w.post_attn_norm = ld.get(p + "post_attention_layernorm.weight");
  const std::string q_name = p + (c.q_lora_rank > 0 ? "self_attn.q_a_proj.weight" : "self_attn.q_proj.weight");
  w.qkv_a = ld.upload(q_name + " + kv_a_proj_with_mqa",
                      concat(ld.host(q_name), ld.host(p + "self_attn.kv_a_proj_with_mqa.weight")),
                      {qkv_a_q_rows(c) + c.kv_row_dim(), H});
  if (c.q_lora_rank > 0) {
    w.q_a_norm = ld.get(p + "self_attn.q_a_layernorm.weight");
    w.q_b = ld.get(p + "self_attn.q_b_proj.weight");
  }
  w.kv_a_norm = ld.get(p + "self_attn.kv_a_layernorm.weight");
  const std::string kvb = p + "self_attn.kv_b_proj.weight";
  std::vector<float> kv_b = ld.host(kvb);
  std::vector<float> uk_t(static_cast<size_t>(nh * r * nope));
  for (int64_t h = 0; h < nh; ++h)
    for (int64_t i = 0; i < nope; ++i)
      for (int64_t j = 0; j < r; ++j)
        uk_t[static_cast<size_t>((h * r + j) * nope + i)] = kv_b[static_cast<size_t>((h * (nope + vd) + i) * r + j)];
  w.kv_b = ld.upload(kvb, kv_b, ld.spec(kvb).shape);
  w.w_uk_t = ld.upload(kvb + " (W_uk^T)", uk_t, {nh, r, nope});
  w.o_proj = ld.get(p + "self_attn.o_proj.weight");
  w.moe = c.is_moe_layer(l);
  if (!w.moe) {
    w.mlp_gate_up =
        ld.upload(p + "mlp.gate_up", concat(ld.host(p + "mlp.gate_proj.weight"), ld.host(p + "mlp.up_proj.weight")),
                  {2 * c.intermediate_size, H});
    w.mlp_down = ld.get(p + "mlp.down_proj.weight");
    return;
  }
  const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size;
  w.router = ld.upload(p + "mlp.gate.weight", ld.host(p + "mlp.gate.weight"), {E, H}, true);
  w.router_bias =
      ld.upload(p + "mlp.gate.e_score_correction_bias", ld.host(p + "mlp.gate.e_score_correction_bias"), {E}, true);
  std::vector<float> gu, dn;
  gu.reserve(static_cast<size_t>(E * 2 * I * H));
  dn.reserve(static_cast<size_t>(E * H * I));
  for (int64_t e = 0; e < E; ++e) {
    const std::string ep = p + fmt::format("mlp.experts.{}.", e);
    auto g = ld.host(ep + "gate_proj.weight");
    auto u = ld.host(ep + "up_proj.weight");
    auto d = ld.host(ep + "down_proj.weight");
    gu.insert(gu.end(), g.begin(), g.end());
    gu.insert(gu.end(), u.begin(), u.end());
    dn.insert(dn.end(), d.begin(), d.end());
  }
  w.experts_gate_up = ld.upload(p + "mlp.experts (gate_up)", gu, {E, 2 * I, H});
  w.experts_down = ld.upload(p + "mlp.experts (down)", dn, {E, H, I});
  if (c.n_shared_experts > 0) {
    const int64_t S = I * c.n_shared_experts;
    const std::string sp = p + "mlp.shared_experts.";
    w.shared_gate_up =
        ld.upload(sp + "gate_up", concat(ld.host(sp + "gate_proj.weight"), ld.host(sp + "up_proj.weight")), {2 * S, H});
    w.shared_down = ld.get(sp + "down_proj.weight");
  }
}

}  // namespace

ModelWeights load_weights(const ModelConfig& c, const Checkpoint& ckpt, ops::Backend& be) {
  Loader ld(c, ckpt, be);
  ModelWeights w;
  w.embed = ld.get("model.embed_tokens.weight");
  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) load_layer(c, l, ld, w.layers[static_cast<size_t>(l)]);
  w.final_norm = ld.get("model.norm.weight");
  w.lm_head = c.tie_word_embeddings ? w.embed : ld.get("lm_head.weight");
  ld.finish();
  return w;
}

namespace {

class RandomFiller {
 public:
  RandomFiller(ops::Backend& be, uint64_t seed) : be_(be), seed_(seed) {}
  // A projection [rows, cols]: uniform(±sqrt(3 / cols)) so outputs have about unit variance.
  OwnedTensor matrix(Shape shape, DType dt) {
    OwnedTensor t = be_.alloc(dt, shape);
    be_.fill_random(t.t, ++seed_, std::sqrt(3.0f / static_cast<float>(shape.back())));
    return t;
  }
  OwnedTensor constant(int64_t n, float v) {
    OwnedTensor t = be_.alloc(DType::F32, {n});
    std::vector<float> h(static_cast<size_t>(n), v);
    be_.upload(t.t, h.data());
    return t;
  }

 private:
  ops::Backend& be_;
  uint64_t seed_;
};

}  // namespace

ModelWeights random_weights(const ModelConfig& c, ops::Backend& be, uint64_t seed) {
  RandomFiller f(be, seed);
  const DType wd = be.weight_dtype();
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, nope = c.qk_nope_head_dim, vd = c.v_head_dim,
                r = c.kv_lora_rank;
  ModelWeights w;
  w.embed = f.matrix({c.vocab_size, H}, wd);
  Progress progress("random weights", static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights lw;
    lw.input_norm = f.constant(H, 1.0f);
    lw.post_attn_norm = f.constant(H, 1.0f);
    lw.qkv_a = f.matrix({qkv_a_q_rows(c) + c.kv_row_dim(), H}, wd);  // q_a_proj or q_proj, then kv_a
    if (c.q_lora_rank > 0) {
      lw.q_a_norm = f.constant(c.q_lora_rank, 1.0f);
      lw.q_b = f.matrix({nh * c.qk_head_dim(), c.q_lora_rank}, wd);
    }
    lw.kv_a_norm = f.constant(r, 1.0f);
    // kv_b is small: make it on the host so W_uk^T is its exact transpose.
    OwnedTensor kvb_f32 = f.matrix({nh * (nope + vd), r}, DType::F32);
    std::vector<float> kv_b(static_cast<size_t>(kvb_f32.t.numel()));
    be.download(kv_b.data(), kvb_f32.t);
    std::vector<float> uk_t(static_cast<size_t>(nh * r * nope));
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < nope; ++i)
        for (int64_t j = 0; j < r; ++j)
          uk_t[static_cast<size_t>((h * r + j) * nope + i)] = kv_b[static_cast<size_t>((h * (nope + vd) + i) * r + j)];
    auto to_backend = [&](const std::vector<float>& v, Shape shape) {
      OwnedTensor t = be.alloc(wd, std::move(shape));
      if (wd == DType::F32) {
        be.upload(t.t, v.data());
      } else {
        std::vector<uint16_t> hb(v.size());
        for (size_t i = 0; i < v.size(); ++i) hb[i] = f32_to_bf16(v[i]);
        be.upload(t.t, hb.data());
      }
      return t;
    };
    lw.kv_b = to_backend(kv_b, {nh * (nope + vd), r});
    lw.w_uk_t = to_backend(uk_t, {nh, r, nope});
    lw.o_proj = f.matrix({H, nh * vd}, wd);
    lw.moe = c.is_moe_layer(l);
    if (!lw.moe) {
      lw.mlp_gate_up = f.matrix({2 * c.intermediate_size, H}, wd);
      lw.mlp_down = f.matrix({H, c.intermediate_size}, wd);
    } else {
      const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size;
      lw.router = f.matrix({E, H}, DType::F32);
      lw.router_bias = f.constant(E, 0.0f);
      lw.experts_gate_up = f.matrix({E, 2 * I, H}, wd);
      lw.experts_down = f.matrix({E, H, I}, wd);
      if (c.n_shared_experts > 0) {
        const int64_t S = I * c.n_shared_experts;
        lw.shared_gate_up = f.matrix({2 * S, H}, wd);
        lw.shared_down = f.matrix({H, S}, wd);
      }
    }
    w.layers.push_back(std::move(lw));
    progress.advance();
  }
  progress.finish();
  w.final_norm = f.constant(H, 1.0f);
  w.lm_head = c.tie_word_embeddings ? w.embed : f.matrix({c.vocab_size, H}, wd);
  return w;
}

}  // namespace kiln
