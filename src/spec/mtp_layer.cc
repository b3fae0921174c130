#include "spec/mtp_layer.h"

#include <filesystem>

#include "core/error.h"

namespace kiln::spec {

MtpLayer::MtpLayer(const std::string& dir, const ModelConfig& target, ops::Backend& be, int64_t index) {
  const ModelConfig c = load_model_config((std::filesystem::path(dir) / "config.json").string());
  KILN_CHECK(c.num_nextn_predict_layers > 0, "{}: config.json has no MTP layer (num_nextn_predict_layers is 0)", dir);
  KILN_CHECK(c.hidden_size == target.hidden_size && c.vocab_size == target.vocab_size &&
                 c.num_hidden_layers == target.num_hidden_layers,
             "{}: its MTP layer belongs to another model (hidden {}, vocabulary {}, {} layers; the target has {}, {}, "
             "{})",
             dir, c.hidden_size, c.vocab_size, c.num_hidden_layers, target.hidden_size, target.vocab_size,
             target.num_hidden_layers);
  Checkpoint ckpt(dir);
  w_ = load_mtp_weights(c, ckpt, be, index);
  // The layer alone: layer 0 of a one-layer model, MoE or dense as the checkpoint's layer is.
  ModelConfig one = c;
  one.num_hidden_layers = 1;
  one.num_nextn_predict_layers = 0;
  one.first_k_dense_replace = w_.layer.moe ? 0 : 1;
  ModelWeights mw;
  mw.embed = w_.embed;  // unused: the inputs come in as h'
  mw.layers.push_back(std::move(w_.layer));
  mw.final_norm = w_.head_norm;
  mw.lm_head = w_.head;
  layer_ = std::make_unique<DeepseekV3Model>(std::move(one), std::move(mw), be);
}

MtpLayer::~MtpLayer() = default;

std::vector<float> MtpLayer::forward(const ForwardBatch& batch, std::span<const float> h, LatentKvPool& pool,
                                     std::vector<float>& normed) {
  ops::Backend& be = backend();
  const int64_t T = batch.num_tokens(), H = config().hidden_size, V = config().vocab_size;
  const float eps = static_cast<float>(config().rms_norm_eps);
  KILN_CHECK(static_cast<int64_t>(h.size()) == T * H, "internal: MTP step of {} rows with {} hidden values", T,
             h.size());
  for (int32_t id : batch.tokens) KILN_CHECK(id >= 0 && id < V, "MTP: token {} is outside the vocabulary", id);
  OwnedTensor ids = be.alloc(DType::I32, {T}), e = be.alloc(DType::F32, {T, H}), hb = be.alloc(DType::F32, {T, H});
  OwnedTensor cat = be.alloc(DType::F32, {T, 2 * H}), x = be.alloc(DType::F32, {T, H});
  be.upload(ids.t, batch.tokens.data());
  be.upload(hb.t, h.data());
  be.embedding({ids.t.as<int32_t>(), w_.embed.t.data, w_.embed.t.dtype, e.f32(), T, V, H});
  // [T, 2H] = [enorm(embed(x[t+1])) ; hnorm(h[t])], then eh_proj: [T, H].
  be.rms_norm({e.f32(), 0, w_.enorm.t.data, w_.enorm.t.dtype, cat.f32(), 2 * H, T, H, eps});
  be.rms_norm({hb.f32(), 0, w_.hnorm.t.data, w_.hnorm.t.dtype, cat.f32() + H, 2 * H, T, H, eps});
  ops::LinearParams proj{cat.f32(), 0, w_.eh_proj.t.data, w_.eh_proj.t.dtype, x.f32(), 0, T, H, 2 * H};
  proj.w_scales = w_.eh_proj.scales();
  be.linear(proj);
  ForwardBatch b = batch;
  b.input_embeds = x.f32();
  b.hidden_rows = batch.logit_rows;
  b.hidden_taps = {kHiddenFinalNorm};
  std::vector<float> logits = layer_->forward(b, pool);  // [rows, V]
  const Tensor hs = layer_->hidden_states();             // [rows, 1, H]
  normed.resize(static_cast<size_t>(hs.numel()));
  if (!normed.empty()) be.download(normed.data(), hs);
  return logits;
}

}  // namespace kiln::spec
