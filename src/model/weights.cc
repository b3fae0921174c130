#include "model/weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "model/host_weight.h"
#include "model/weight_layout.h"
#include "ops/quant.h"

namespace kiln {
namespace {

constexpr const char* kScaleSuffix = "_scale_inv";
// compressed-tensors pack-quantized: `X.weight` ships as these three (docs/quantization.md).
constexpr const char* kPackedSuffixes[] = {"_packed", "_scale", "_shape"};

int64_t ceil_div(int64_t a, int64_t b) {
  return a == 0 ? 0 : (a - 1) / b + 1;  // no overflow
}

// Weights and FP8 scales are floating point; an integer tensor in their place is a corrupt file.
void require_float(const SafetensorsEntry& e) {
  const DType t = e.dtype;
  KILN_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F8E4M3,
             "{}: tensor \"{}\" has dtype {}; weights are F32, BF16, F16 or F8_E4M3", e.file, e.name, dtype_name(t));
}

std::vector<float> widen(const SafetensorsEntry& e) {
  std::vector<float> out(static_cast<size_t>(shape_numel(e.shape)));
  convert_to_f32(e.dtype, e.data, out.data(), out.size());
  return out;
}

// Scales as shipped, widened; the backend keeps bf16 ones as bf16 (exact), others as f32.
void read_scales(const SafetensorsEntry& s, HostWeight& w) {
  KILN_CHECK(s.dtype == DType::F32 || s.dtype == DType::BF16 || s.dtype == DType::F16,
             "{}: scale tensor \"{}\" has dtype {}; scales are F32, BF16 or F16", s.file, s.name, dtype_name(s.dtype));
  w.scale = widen(s);
  w.scale_dtype = s.dtype == DType::BF16 ? DType::BF16 : DType::F32;
}

// An FP8 projection: e4m3 codes kept as they are, weight_scale_inv one f32 per block.
HostWeight read_fp8(const ModelConfig& c, const Checkpoint& ckpt, const SafetensorsEntry& e) {
  const std::string sname = e.name + kScaleSuffix;
  const SafetensorsEntry* s = ckpt.find(sname);
  KILN_CHECK(s != nullptr, "{}: FP8 tensor \"{}\" has no \"{}\"", e.file, e.name, sname);
  KILN_CHECK(e.shape.size() == 2, "{}: FP8 tensor \"{}\" must be 2-D, has shape {}", e.file, e.name,
             shape_str(e.shape));
  HostWeight w;
  w.n = e.shape[0];
  w.k = e.shape[1];
  w.dtype = DType::F8E4M3;
  w.block_n = c.fp8 ? c.fp8->block_n : 128;
  w.block_k = c.fp8 ? c.fp8->block_k : 128;
  const Shape want = {ceil_div(w.n, w.block_n), ceil_div(w.k, w.block_k)};
  KILN_CHECK(s->shape == want, "{}: tensor \"{}\" has shape {} but {} x {} blocks of {} need {}", s->file, sname,
             shape_str(s->shape), w.block_n, w.block_k, shape_str(e.shape), shape_str(want));
  const auto* p = static_cast<const uint8_t*>(e.data);
  w.codes.assign(p, p + e.nbytes);
  read_scales(*s, w);
  return w;
}

// A compressed-tensors INT4 projection `base.weight`: the packed int32 words kept as they are.
HostWeight read_int4(const ModelConfig& c, const Checkpoint& ckpt, const std::string& base, const Shape& shape) {
  const SafetensorsEntry* p = ckpt.find(base + ".weight_packed");
  const SafetensorsEntry* s = ckpt.find(base + ".weight_scale");
  const SafetensorsEntry* sh = ckpt.find(base + ".weight_shape");
  KILN_CHECK(c.int4.has_value(),
             "{}: \"{}.weight_packed\" is INT4 pack-quantized but config.json has no "
             "compressed-tensors quantization_config",
             p->file, base);
  KILN_CHECK(s != nullptr && sh != nullptr,
             "{}: \"{}.weight_packed\" needs \"{}.weight_scale\" and "
             "\"{}.weight_shape\" beside it",
             p->file, base, base, base);
  HostWeight w;
  w.n = shape[0];
  w.k = shape[1];
  w.dtype = DType::I4X8;
  w.block_n = 1;
  w.block_k = c.int4->group_size;
  KILN_CHECK(sh->dtype == DType::I32 || sh->dtype == DType::I64, "{}: \"{}\" must be I32 or I64, has {}", sh->file,
             sh->name, dtype_name(sh->dtype));
  KILN_CHECK(sh->shape == Shape{2}, "{}: \"{}\" must hold 2 values, has shape {}", sh->file, sh->name,
             shape_str(sh->shape));
  Shape stored(2);
  for (size_t i = 0; i < 2; ++i) {  // memcpy: safetensors data need not be aligned
    if (sh->dtype == DType::I32) {
      int32_t v;
      std::memcpy(&v, static_cast<const char*>(sh->data) + 4 * i, 4);
      stored[i] = v;
    } else {
      std::memcpy(&stored[i], static_cast<const char*>(sh->data) + 8 * i, 8);
    }
  }
  KILN_CHECK(stored == shape, "{}: \"{}\" says {} but the config expects {}", sh->file, sh->name, shape_str(stored),
             shape_str(shape));
  const Shape packed = {w.n, ceil_div(w.k, 8)};
  KILN_CHECK(p->dtype == DType::I32, "{}: \"{}\" must be I32 (eight int4 a word), has {}", p->file, p->name,
             dtype_name(p->dtype));
  KILN_CHECK(p->shape == packed, "{}: \"{}\" has shape {} but a {} weight packs to {}", p->file, p->name,
             shape_str(p->shape), shape_str(shape), shape_str(packed));
  const Shape grid = {w.n, ceil_div(w.k, w.block_k)};
  KILN_CHECK(s->shape == grid, "{}: \"{}\" has shape {} but groups of {} over {} need {}", s->file, s->name,
             shape_str(s->shape), w.block_k, shape_str(shape), shape_str(grid));
  const auto* b = static_cast<const uint8_t*>(p->data);
  w.codes.assign(b, b + p->nbytes);
  read_scales(*s, w);
  return w;
}

// Projections a plain checkpoint gets in FP8 under --quantization fp8: those DeepSeek-V3 ships in FP8.
bool fp8_online(const WeightSpec& w) {
  return w.matrix && !w.mtp && w.role != WeightRole::LmHead && w.role != WeightRole::Embedding &&
         w.role != WeightRole::Router;
}

class Loader {
 public:
  // `mtp`: this loader reads the NextN layers (its progress counts their bytes, not the main model's).
  Loader(const ModelConfig& c, const Checkpoint& ckpt, ops::Backend& be, WeightQuant quant, bool mtp = false)
      : c_(c), ckpt_(ckpt), be_(be), quant_(quant), mtp_(mtp) {
    KILN_CHECK(quant == WeightQuant::None || quant == WeightQuant::Fp8,
               "internal: loading a checkpoint quantizes to fp8 or not at all");
    KILN_CHECK(quant == WeightQuant::None || (!c.fp8 && !c.int4),
               "{}: --quantization fp8 quantizes a bf16/f32 checkpoint; this one ships quantized already ({})",
               ckpt.dir(), c.fp8 ? "fp8" : "compressed-tensors int4");
    for (const auto& w : weight_layout(c)) specs_.emplace(w.name, w);
    check_unexpected();
    check_ignore_list();
  }

  // One plain tensor (norms, embedding, lm_head) in the backend's weight dtype.
  OwnedTensor get(const std::string& name) { return upload(name, host(name), spec(name).shape); }

  // A plain tensor widened to f32 on the host (quantized ones dequantized).
  std::vector<float> host(const std::string& name) { return dequantize(weight(name)); }

  // A projection as shipped (FP8 codes, INT4 words or plain f32), FP8-quantized under --quantization fp8.
  HostWeight weight(const std::string& name) {
    const WeightSpec& w = spec(name);
    HostWeight h;
    const std::string base = name.ends_with(".weight") ? name.substr(0, name.size() - 7) : name;
    if (const SafetensorsEntry* e = ckpt_.find(name)) {
      KILN_CHECK(ckpt_.find(base + ".weight_packed") == nullptr, "{}: \"{}\" ships both plain and packed (\"{}\")",
                 e->file, name, base + ".weight_packed");
      KILN_CHECK(e->shape == w.shape, "{}: tensor \"{}\" has shape {} but the config expects {}", e->file, name,
                 shape_str(e->shape), shape_str(w.shape));
      require_float(*e);
      if (e->dtype == DType::F8E4M3) {
        h = read_fp8(c_, ckpt_, *e);
      } else {
        h.dense = widen(*e);
        h.n = w.shape[0];
        h.k = w.shape.size() > 1 ? w.shape[1] : 1;
      }
      progress_.advance(e->nbytes);
    } else {
      const SafetensorsEntry* p = ckpt_.find(base + ".weight_packed");
      KILN_CHECK(p != nullptr && w.shape.size() == 2, "{}: missing tensor \"{}\" (expected shape {})", ckpt_.dir(),
                 name, shape_str(w.shape));
      h = read_int4(c_, ckpt_, base, w.shape);
      progress_.advance(p->nbytes);
    }
    if (quant_ == WeightQuant::Fp8 && fp8_online(w) && !h.quantized()) h = quantize_fp8(h);
    return h;
  }

  OwnedTensor upload(const std::string& what, const std::vector<float>& v, Shape shape, bool force_f32 = false) {
    return upload_plain(be_, what, v, std::move(shape), force_f32 ? DType::F32 : be_.weight_dtype());
  }
  Weight upload(const std::string& what, const HostWeight& h, int64_t experts = 0) {
    return upload_weight(be_, what, h, experts);
  }

  const WeightSpec& spec(const std::string& name) const { return specs_.at(name); }
  void finish() { progress_.finish(); }

 private:
  // The weight a checkpoint tensor belongs to: itself, or the `.weight` whose scale / packing it is.
  std::string base_of(const std::string& name) const {
    if (name.ends_with(kScaleSuffix)) return name.substr(0, name.size() - std::strlen(kScaleSuffix));
    for (const char* suffix : kPackedSuffixes)
      if (name.ends_with(std::string(".weight") + suffix)) return name.substr(0, name.size() - std::strlen(suffix));
    return name;
  }

  void check_unexpected() {
    size_t total = 0;
    for (const auto& [name, e] : ckpt_.tensors()) {
      auto it = specs_.find(name);
      if (it == specs_.end()) it = specs_.find(base_of(name));
      KILN_CHECK(it != specs_.end(), "{}: unexpected tensor \"{}\" (shape {}) is not part of this config's model",
                 e->file, name, shape_str(e->shape));
      if (it->second.mtp == mtp_) total += e->nbytes;
    }
    progress_ = Progress((mtp_ ? "loading the MTP layer of " : "loading ") + ckpt_.dir(), total);
  }

  // A module the config's ignore list names exactly must ship unquantized ("re:" patterns are not
  // evaluated: the tensors themselves say what is packed).
  void check_ignore_list() const {
    if (!c_.int4) return;
    for (const std::string& m : c_.int4->ignore) {
      if (m.starts_with("re:")) continue;
      const SafetensorsEntry* p = ckpt_.find(m + ".weight_packed");
      KILN_CHECK(p == nullptr, "{}: \"{}\" is packed INT4 but quantization_config.ignore lists \"{}\" as unquantized",
                 p ? p->file : ckpt_.dir(), m + ".weight_packed", m);
    }
  }

  const ModelConfig& c_;
  const Checkpoint& ckpt_;
  ops::Backend& be_;
  WeightQuant quant_;
  bool mtp_;
  std::map<std::string, WeightSpec> specs_;
  Progress progress_{"", 0};
};

// A quantized kv_b whose scale rows do not start on every head's W_uk and W_uv gets one scale row
// per weight row, so the absorbed form's per-head view of W_uv finds its scales.
HostWeight head_aligned_kv_b(const ModelConfig& c, HostWeight kv_b) {
  if (kv_b.quantized() && (c.qk_nope_head_dim % kv_b.block_n != 0 || c.v_head_dim % kv_b.block_n != 0))
    return with_unit_block_rows(std::move(kv_b));
  return kv_b;
}

void load_layer(const ModelConfig& c, int64_t l, Loader& ld, LayerWeights& w) {
  const std::string p = fmt::format("model.layers.{}.", l);
  const int64_t nh = c.num_attention_heads, r = c.kv_lora_rank;
  w.input_norm = ld.get(p + "input_layernorm.weight");
  w.post_attn_norm = ld.get(p + "post_attention_layernorm.weight");
  const std::string q_name = p + (c.q_lora_rank > 0 ? "self_attn.q_a_proj.weight" : "self_attn.q_proj.weight");
  w.qkv_a = ld.upload(q_name + " + kv_a_proj_with_mqa",
                      concat_rows({ld.weight(q_name), ld.weight(p + "self_attn.kv_a_proj_with_mqa.weight")}));
  if (c.q_lora_rank > 0) {
    w.q_a_norm = ld.get(p + "self_attn.q_a_layernorm.weight");
    w.q_b = ld.upload(p + "self_attn.q_b_proj.weight", ld.weight(p + "self_attn.q_b_proj.weight"));
  }
  w.kv_a_norm = ld.get(p + "self_attn.kv_a_layernorm.weight");
  const std::string kvb = p + "self_attn.kv_b_proj.weight";
  HostWeight kv_b = head_aligned_kv_b(c, ld.weight(kvb));
  // W_uk^T comes from the values the expanded form multiplies by, so both forms compute one model.
  w.w_uk_t = ld.upload(kvb + " (W_uk^T)", w_uk_transpose(dequantize(kv_b), nh, c.qk_nope_head_dim, c.v_head_dim, r),
                       {nh, r, c.qk_nope_head_dim});
  w.kv_b = ld.upload(kvb, kv_b);
  w.o_proj = ld.upload(p + "self_attn.o_proj.weight", ld.weight(p + "self_attn.o_proj.weight"));
  w.moe = c.is_moe_layer(l);
  if (!w.moe) {
    w.mlp_gate_up = ld.upload(
        p + "mlp.gate_up", concat_rows({ld.weight(p + "mlp.gate_proj.weight"), ld.weight(p + "mlp.up_proj.weight")}));
    w.mlp_down = ld.upload(p + "mlp.down_proj.weight", ld.weight(p + "mlp.down_proj.weight"));
    return;
  }
  const int64_t E = c.n_routed_experts;
  w.router = ld.upload(p + "mlp.gate.weight", ld.host(p + "mlp.gate.weight"), {E, c.hidden_size}, true);
  w.router_bias =
      ld.upload(p + "mlp.gate.e_score_correction_bias", ld.host(p + "mlp.gate.e_score_correction_bias"), {E}, true);
  std::vector<HostWeight> gu, dn;
  for (int64_t e = 0; e < E; ++e) {
    const std::string ep = p + fmt::format("mlp.experts.{}.", e);
    gu.push_back(concat_rows({ld.weight(ep + "gate_proj.weight"), ld.weight(ep + "up_proj.weight")}));
    dn.push_back(ld.weight(ep + "down_proj.weight"));
  }
  w.experts_gate_up = ld.upload(p + "mlp.experts (gate_up)", stack_experts(std::move(gu)), E);
  w.experts_down = ld.upload(p + "mlp.experts (down)", stack_experts(std::move(dn)), E);
  if (c.n_shared_experts > 0) {
    const std::string sp = p + "mlp.shared_experts.";
    w.shared_gate_up =
        ld.upload(sp + "gate_up", concat_rows({ld.weight(sp + "gate_proj.weight"), ld.weight(sp + "up_proj.weight")}));
    w.shared_down = ld.upload(sp + "down_proj.weight", ld.weight(sp + "down_proj.weight"));
  }
}

}  // namespace

MtpWeights load_mtp_weights(const ModelConfig& c, const Checkpoint& ckpt, ops::Backend& be, int64_t index) {
  KILN_CHECK(index >= 0 && index < c.num_nextn_predict_layers,
             "{}: MTP layer {} asked, but config.json has num_nextn_predict_layers {}", ckpt.dir(), index,
             c.num_nextn_predict_layers);
  Loader ld(c, ckpt, be, WeightQuant::None, true);
  const int64_t l = c.num_hidden_layers + index;
  const std::string p = fmt::format("model.layers.{}.", l);
  MtpWeights w;
  w.embed = ld.get(p + "embed_tokens.weight");
  w.enorm = ld.get(p + "enorm.weight");
  w.hnorm = ld.get(p + "hnorm.weight");
  w.eh_proj = ld.upload(p + "eh_proj.weight", ld.weight(p + "eh_proj.weight"));
  load_layer(c, l, ld, w.layer);
  w.head_norm = ld.get(p + "shared_head.norm.weight");
  w.head = ld.get(p + "shared_head.head.weight");
  ld.finish();
  return w;
}

std::vector<float> w_uk_transpose(const std::vector<float>& kv_b, int64_t heads, int64_t nope, int64_t v, int64_t r) {
  std::vector<float> uk_t(static_cast<size_t>(heads * r * nope));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < nope; ++i)
      for (int64_t j = 0; j < r; ++j)
        uk_t[static_cast<size_t>((h * r + j) * nope + i)] = kv_b[static_cast<size_t>((h * (nope + v) + i) * r + j)];
  return uk_t;
}

WeightQuant parse_weight_quant(const std::string& s, const std::string& flag) {
  if (s == "none" || s == "auto" || s == "bf16") return WeightQuant::None;
  if (s == "fp8") return WeightQuant::Fp8;
  if (s == "int4") return WeightQuant::Int4Experts;
  fail("{} must be none, fp8 or int4, got \"{}\"", flag, s);
}

ModelWeights load_weights(const ModelConfig& c, const Checkpoint& ckpt, ops::Backend& be, WeightQuant quant) {
  Loader ld(c, ckpt, be, quant);
  ModelWeights w;
  w.embed = ld.get("model.embed_tokens.weight");
  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) load_layer(c, l, ld, w.layers[static_cast<size_t>(l)]);
  w.final_norm = ld.get("model.norm.weight");
  w.lm_head = c.tie_word_embeddings ? w.embed : ld.get("lm_head.weight");
  ld.finish();
  return w;
}

}  // namespace kiln
