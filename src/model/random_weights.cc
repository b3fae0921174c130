// random_weights(): weights of the right shapes for benchmarks of shapes we have no checkpoint for,
// plain (filled on the backend itself) or quantized as FP8 / INT4 checkpoints ship them.
#include <cmath>

#include "core/error.h"
#include "core/log.h"
#include "model/host_weight.h"
#include "model/weights.h"
#include "ops/quant.h"

namespace kiln {
namespace {

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class RandomFiller {
 public:
  RandomFiller(ops::Backend& be, uint64_t seed) : be_(be), seed_(seed) {
    // e4m3 codes of uniform(-1, 1): a random byte picks one, so codes cost one hash per 8 weights.
    for (int i = 0; i < 256; ++i) fp8_table_[i] = f32_to_fp8e4m3((static_cast<float>(i) - 127.5f) / 128.0f);
  }
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
  // `experts` (0: one matrix) projections [n, k] of about unit output variance, as `dtype` stores
  // them: F8E4M3 with 128 x 128 blocks, I4X8 with bf16 scales per 32 inputs, else plain.
  Weight projection(int64_t experts, int64_t n, int64_t k, DType dtype) {
    const int64_t E = std::max<int64_t>(experts, 1);
    if (dtype != DType::F8E4M3 && dtype != DType::I4X8)
      return matrix(experts > 0 ? Shape{E, n, k} : Shape{n, k}, be_.weight_dtype());
    HostWeight h;
    h.n = n;
    h.k = k;
    h.dtype = dtype;
    const bool fp8 = dtype == DType::F8E4M3;
    h.block_n = fp8 ? 128 : 1;
    h.block_k = fp8 ? 128 : 32;
    h.scale_dtype = fp8 ? DType::F32 : DType::BF16;
    // uniform(-1, 1) codes have variance 1/3; int4 values uniform in [-8, 7] have 21.25 about -0.5.
    const float s = fp8 ? std::sqrt(3.0f / static_cast<float>(k)) : 1.0f / std::sqrt(21.25f * static_cast<float>(k));
    h.scale.assign(static_cast<size_t>(E * h.grid_n() * h.grid_k()), bf16_to_f32(f32_to_bf16(s)));
    h.codes.resize(static_cast<size_t>(E * ops::weight_elems(dtype, n, k)) * dtype_size(dtype));
    const uint64_t seed = ++seed_ * 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < h.codes.size(); i += 8) {
      uint64_t r = mix64(seed + i);
      for (size_t j = i; j < std::min(i + 8, h.codes.size()); ++j, r >>= 8)
        h.codes[j] = fp8 ? fp8_table_[r & 0xff] : static_cast<uint8_t>(r & 0xff);
    }
    return upload_weight(be_, "random weight", h, experts);
  }

 private:
  ops::Backend& be_;
  uint64_t seed_;
  uint8_t fp8_table_[256];
};

}  // namespace

ModelWeights random_weights(const ModelConfig& c, ops::Backend& be, uint64_t seed, WeightQuant quant) {
  RandomFiller f(be, seed);
  const DType wd = be.weight_dtype();
  // Which projections are stored quantized, as the checkpoints of that format ship them.
  const DType dense_q = quant == WeightQuant::Fp8 ? DType::F8E4M3 : wd;
  const DType expert_q = quant == WeightQuant::Fp8           ? DType::F8E4M3
                         : quant == WeightQuant::Int4Experts ? DType::I4X8
                                                             : wd;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, nope = c.qk_nope_head_dim, vd = c.v_head_dim,
                r = c.kv_lora_rank;
  ModelWeights w;
  w.embed = f.matrix({c.vocab_size, H}, wd);
  Progress progress("random weights", static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights lw;
    lw.input_norm = f.constant(H, 1.0f);
    lw.post_attn_norm = f.constant(H, 1.0f);
    lw.qkv_a = f.projection(0, qkv_a_q_rows(c) + c.kv_row_dim(), H, dense_q);  // q_a_proj or q_proj, then kv_a
    if (c.q_lora_rank > 0) {
      lw.q_a_norm = f.constant(c.q_lora_rank, 1.0f);
      lw.q_b = f.projection(0, nh * c.qk_head_dim(), c.q_lora_rank, dense_q);
    }
    lw.kv_a_norm = f.constant(r, 1.0f);
    // kv_b is small: make it on the host so W_uk^T is the exact transpose of the values kv_b holds.
    OwnedTensor kvb_f32 = f.matrix({nh * (nope + vd), r}, DType::F32);
    HostWeight kv_b;
    kv_b.n = nh * (nope + vd);
    kv_b.k = r;
    kv_b.dense.resize(static_cast<size_t>(kvb_f32.t.numel()));
    be.download(kv_b.dense.data(), kvb_f32.t);
    if (quant == WeightQuant::Fp8) {
      kv_b = quantize_fp8(kv_b);
      if (nope % kv_b.block_n != 0 || vd % kv_b.block_n != 0) kv_b = with_unit_block_rows(std::move(kv_b));
    } else if (wd == DType::BF16) {
      for (float& v : kv_b.dense) v = bf16_to_f32(f32_to_bf16(v));  // W_uk^T as kv_b will hold it
    }
    const std::vector<float> kv = dequantize(kv_b);
    std::vector<float> uk_t(static_cast<size_t>(nh * r * nope));
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < nope; ++i)
        for (int64_t j = 0; j < r; ++j)
          uk_t[static_cast<size_t>((h * r + j) * nope + i)] = kv[static_cast<size_t>((h * (nope + vd) + i) * r + j)];
    lw.kv_b = upload_weight(be, "kv_b", kv_b);
    lw.w_uk_t = upload_plain(be, "W_uk^T", uk_t, {nh, r, nope}, wd);
    lw.o_proj = f.projection(0, H, nh * vd, dense_q);
    lw.moe = c.is_moe_layer(l);
    if (!lw.moe) {
      lw.mlp_gate_up = f.projection(0, 2 * c.intermediate_size, H, dense_q);
      lw.mlp_down = f.projection(0, H, c.intermediate_size, dense_q);
    } else {
      const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size;
      lw.router = f.matrix({E, H}, DType::F32);
      lw.router_bias = f.constant(E, 0.0f);
      lw.experts_gate_up = f.projection(E, 2 * I, H, expert_q);
      lw.experts_down = f.projection(E, H, I, expert_q);
      if (c.n_shared_experts > 0) {
        const int64_t S = I * c.n_shared_experts;
        lw.shared_gate_up = f.projection(0, 2 * S, H, dense_q);
        lw.shared_down = f.projection(0, H, S, dense_q);
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
