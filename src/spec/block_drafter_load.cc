// BlockDrafterModel's config and checkpoint: DeepSpec's DSpark config.json fields on top of the
// target family's, and its tensor names (the draft model's own module names, no "model." prefix).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "model/host_weight.h"
#include "model/safetensors.h"
#include "spec/block_drafter_model.h"

namespace kiln::spec {
namespace {

using json = nlohmann::json;

template <typename T>
T get_field(const json& j, const char* key, const std::string& src) {
  auto it = j.find(key);
  KILN_CHECK(it != j.end() && !it->is_null(), "{}: a DSpark draft config needs field \"{}\"", src, key);
  try {
    return it->get<T>();
  } catch (const std::exception& e) {
    fail("{}: field \"{}\" has an invalid value {}: {}", src, key, it->dump(), e.what());
  }
}

template <typename T>
T get_field(const json& j, const char* key, const std::string& src, T fallback) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? fallback : get_field<T>(j, key, src);
}

// Reads the checkpoint's plain tensors (f32 / bf16 / f16) by name, checking shapes; remembers
// which it read so that a tensor nobody asked for (a misspelt name) is an error too.
class TensorReader {
 public:
  TensorReader(const Checkpoint& ckpt, ops::Backend& be) : ckpt_(ckpt), be_(be) {}

  HostWeight host(const std::string& name, const Shape& shape) {
    const SafetensorsEntry* e = ckpt_.find(name);
    KILN_CHECK(e != nullptr, "{}: missing tensor \"{}\" (expected shape {})", ckpt_.dir(), name, shape_str(shape));
    KILN_CHECK(e->shape == shape, "{}: tensor \"{}\" has shape {} but the config expects {}", e->file, name,
               shape_str(e->shape), shape_str(shape));
    KILN_CHECK(e->dtype == DType::F32 || e->dtype == DType::BF16 || e->dtype == DType::F16,
               "{}: tensor \"{}\" has dtype {}; the block drafter loads F32, BF16 or F16", e->file, name,
               dtype_name(e->dtype));
    used_.insert(name);
    HostWeight h;
    h.n = shape[0];
    h.k = shape.size() > 1 ? shape[1] : 1;
    h.dense.resize(static_cast<size_t>(shape_numel(shape)));
    convert_to_f32(e->dtype, e->data, h.dense.data(), h.dense.size());
    return h;
  }
  Weight weight(const std::string& name, const Shape& shape) { return upload_weight(be_, name, host(name, shape)); }
  OwnedTensor plain(const std::string& name, const Shape& shape) {
    return upload_plain(be_, name, host(name, shape).dense, shape, be_.weight_dtype());
  }
  void ignore(const std::string& name) { used_.insert(name); }
  void check_all_used() const {
    for (const auto& [name, e] : ckpt_.tensors())
      KILN_CHECK(used_.count(name), "{}: unexpected tensor \"{}\" (shape {}) is not part of this DSpark draft", e->file,
                 name, shape_str(e->shape));
  }

 private:
  const Checkpoint& ckpt_;
  ops::Backend& be_;
  std::set<std::string> used_;
};

}  // namespace

BlockDrafterConfig parse_block_drafter_config(const json& j, const std::string& src) {
  BlockDrafterConfig c;
  c.layers = parse_model_config(j, src);
  const ModelConfig& m = c.layers;
  c.num_target_layers = get_field<int64_t>(j, "num_target_layers", src);
  c.target_layer_ids = get_field<std::vector<int64_t>>(j, "target_layer_ids", src);
  c.block_size = get_field<int64_t>(j, "block_size", src);
  c.mask_token_id = get_field<int64_t>(j, "mask_token_id", src);
  c.markov_rank = get_field<int64_t>(j, "markov_rank", src, int64_t{0});
  c.enable_confidence_head = get_field<bool>(j, "enable_confidence_head", src, false);
  KILN_CHECK(c.num_target_layers > 0, "{}: field \"num_target_layers\" must be positive, got {}", src,
             c.num_target_layers);
  KILN_CHECK(!c.target_layer_ids.empty(), "{}: field \"target_layer_ids\" must not be empty", src);
  for (size_t i = 0; i < c.target_layer_ids.size(); ++i) {
    const int64_t id = c.target_layer_ids[i];
    // -1 is the embedding output, i the residual stream after target layer i (before any norm).
    KILN_CHECK(id >= -1 && id < c.num_target_layers, "{}: target_layer_ids[{}] = {} is outside {{-1}} and [0, {})", src,
               i, id, c.num_target_layers);
    KILN_CHECK(i == 0 || id > c.target_layer_ids[i - 1], "{}: target_layer_ids must be strictly increasing", src);
  }
  KILN_CHECK(c.block_size >= 1 && c.block_size <= 64, "{}: field \"block_size\" must be in [1, 64], got {}", src,
             c.block_size);
  KILN_CHECK(c.mask_token_id >= 0 && c.mask_token_id < m.vocab_size,
             "{}: field \"mask_token_id\" = {} is outside the vocabulary of {}", src, c.mask_token_id, m.vocab_size);
  KILN_CHECK(c.markov_rank >= 0, "{}: field \"markov_rank\" must be >= 0, got {}", src, c.markov_rank);
  if (c.markov_rank > 0) {
    c.markov_head_type = get_field<std::string>(j, "markov_head_type", src, std::string("vanilla"));
    // DeepSpec also has "gated" and "rnn" heads; the published recipe uses vanilla.
    KILN_CHECK(c.markov_head_type == "vanilla", "{}: markov_head_type \"{}\" is not supported (only \"vanilla\")", src,
               c.markov_head_type);
  }
  if (c.enable_confidence_head) {
    c.confidence_head_with_markov = get_field<bool>(j, "confidence_head_with_markov", src);
    KILN_CHECK(!c.confidence_head_with_markov || c.markov_rank > 0,
               "{}: confidence_head_with_markov needs markov_rank > 0", src);
  }
  for (int64_t l = 0; l < m.num_hidden_layers; ++l)
    KILN_CHECK(!m.is_moe_layer(l),
               "{}: draft layer {} would be MoE (first_k_dense_replace {}); the block drafter's layers are "
               "dense",
               src, l, m.first_k_dense_replace);
  KILN_CHECK(!m.fp8 && !m.int4, "{}: quantized DSpark drafts are not supported", src);
  return c;
}

BlockDrafterConfig load_block_drafter_config(const std::string& path) {
  std::ifstream f(path);
  KILN_CHECK(f.good(), "cannot open {}", path);
  json j;
  try {
    j = json::parse(f);
  } catch (const std::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
  return parse_block_drafter_config(j, path);
}

std::unique_ptr<BlockDrafterModel> BlockDrafterModel::load(const std::string& dir, ops::Backend& be,
                                                           const ModelWeights* target) {
  BlockDrafterConfig c = load_block_drafter_config((std::filesystem::path(dir) / "config.json").string());
  const ModelConfig& m = c.layers;
  const int64_t H = m.hidden_size, V = m.vocab_size, nh = m.num_attention_heads, qk = m.qk_head_dim(),
                r = m.kv_lora_rank, nope = m.qk_nope_head_dim, vd = m.v_head_dim, I = m.intermediate_size;
  Checkpoint ckpt(dir);
  TensorReader rd(ckpt, be);
  BlockDrafterWeights w;
  if (target) {
    KILN_CHECK(target->embed.t.shape == (Shape{V, H}) && target->lm_head.t.shape == (Shape{V, H}),
               "{}: the draft's vocabulary x hidden {} x {} differs from the target's embedding {}", dir, V, H,
               shape_str(target->embed.t.shape));
    w.embed = target->embed, w.lm_head = target->lm_head;
    rd.ignore("embed_tokens.weight"), rd.ignore("lm_head.weight");  // DeepSpec saves frozen copies
  } else {
    w.embed = rd.plain("embed_tokens.weight", {V, H});
    w.lm_head = rd.plain("lm_head.weight", {V, H});
  }
  w.fc = rd.weight("fc.weight", {H, c.feature_dim()});
  w.hidden_norm = rd.plain("hidden_norm.weight", {H});
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    BlockDrafterLayer L;
    L.input_norm = rd.plain(p + "input_layernorm.weight", {H});
    L.post_attn_norm = rd.plain(p + "post_attention_layernorm.weight", {H});
    if (m.q_lora_rank > 0) {
      L.q_a = rd.weight(p + "self_attn.q_a_proj.weight", {m.q_lora_rank, H});
      L.q_a_norm = rd.plain(p + "self_attn.q_a_layernorm.weight", {m.q_lora_rank});
      L.q_b = rd.weight(p + "self_attn.q_b_proj.weight", {nh * qk, m.q_lora_rank});
    } else {
      L.q_a = rd.weight(p + "self_attn.q_proj.weight", {nh * qk, H});
    }
    L.kv_a = rd.weight(p + "self_attn.kv_a_proj_with_mqa.weight", {m.kv_row_dim(), H});
    L.kv_a_norm = rd.plain(p + "self_attn.kv_a_layernorm.weight", {r});
    const HostWeight kv_b = rd.host(p + "self_attn.kv_b_proj.weight", {nh * (nope + vd), r});
    L.w_uk_t =
        upload_plain(be, p + "W_uk^T", w_uk_transpose(kv_b.dense, nh, nope, vd, r), {nh, r, nope}, be.weight_dtype());
    L.kv_b = upload_weight(be, p + "self_attn.kv_b_proj.weight", kv_b);
    L.o_proj = rd.weight(p + "self_attn.o_proj.weight", {H, nh * vd});
    L.gate_up = upload_weight(
        be, p + "mlp.gate_up",
        concat_rows({rd.host(p + "mlp.gate_proj.weight", {I, H}), rd.host(p + "mlp.up_proj.weight", {I, H})}));
    L.down = rd.weight(p + "mlp.down_proj.weight", {H, I});
    w.layers.push_back(std::move(L));
  }
  w.norm = rd.plain("norm.weight", {H});
  if (c.markov_rank > 0) {
    w.markov_w1 = rd.plain("markov_head.markov_w1.weight", {V, c.markov_rank});
    w.markov_w2 = rd.weight("markov_head.markov_w2.weight", {V, c.markov_rank});
  }
  if (c.enable_confidence_head) {
    const int64_t in = H + (c.confidence_head_with_markov ? c.markov_rank : 0);
    HostWeight proj = rd.host("confidence_head.proj.weight", {1, in});
    const HostWeight bias = rd.host("confidence_head.proj.bias", {1});
    proj.dense.push_back(bias.dense[0]);  // the bias is the weight of a constant-1 feature
    proj.k = in + 1;
    w.confidence = upload_weight(be, "confidence_head.proj", proj);
  }
  rd.check_all_used();
  return std::make_unique<BlockDrafterModel>(std::move(c), std::move(w), be);
}

}  // namespace kiln::spec
