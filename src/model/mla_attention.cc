// DeepseekV3Model::attention: one MLA layer over a step whose sequences are ordered by form
// (StepInputs): decode rows in the absorbed form over the paged latent cache, prompt chunks in the
// expanded form over their own context only, each part writing its own rows of the output.
#include "core/error.h"
#include "model/step_inputs.h"
#include "ops/quant.h"

namespace kiln {

void DeepseekV3Model::attention(int64_t l, const float* x, const float* pending, float* out, const StepInputs& in,
                                LatentKvPool& pool) {
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
  qkv_a.w_scales = w.qkv_a.scales();
  be_.linear(qkv_a);

  // q [T, nh, qk]: q_nope ‖ q_pe per head, rows q_stride apart (a view of qkv without q LoRA).
  float* q = qkv.f32();
  int64_t q_stride = ld;
  OwnedTensor q_b_out;
  if (c_.q_lora_rank > 0) {
    float* q_a = qkv.f32();  // [T, q_lora], rows ld apart
    be_.rms_norm({q_a, ld, w.q_a_norm.t.data, w.q_a_norm.t.dtype, q_a, ld, T, c_.q_lora_rank, eps});
    q_b_out = scratch(T, nh * qk);
    ops::LinearParams q_b{q_a, ld, w.q_b.t.data, w.q_b.t.dtype, q_b_out.f32(), 0, T, nh * qk, c_.q_lora_rank};
    q_b.w_scales = w.q_b.scales();
    be_.linear(q_b);
    q = q_b_out.f32();
    q_stride = nh * qk;
  }

  // One op, over tokens [t0, t0 + n), ropes q_pe into q_pe_out and writes the new latent rows
  // (normalised c_kv ‖ roped k_pe) to their pool slots; qkv's kv part stays as projected. Given
  // q_lat (the absorbed form) it also folds W_uk into q there: q_lat[h] = W_uk[h]ᵀ q_nope[h], rows
  // as q_pe_out's.
  auto prepare = [&](int64_t t0, int64_t n, float* q_pe_out, int64_t out_stride, int64_t out_head_stride,
                     float* q_lat) {
    be_.mla_prepare({.q_in = q + t0 * q_stride + nope,
                     .q_in_stride = q_stride,
                     .q_in_head_stride = qk,
                     .q_out = q_pe_out,
                     .q_out_stride = out_stride,
                     .q_out_head_stride = out_head_stride,
                     .num_heads = nh,
                     .kva = qkv.f32() + t0 * ld + nq,
                     .kva_stride = ld,
                     .norm_weight = w.kv_a_norm.t.data,
                     .norm_weight_dtype = w.kv_a_norm.t.dtype,
                     .eps = eps,
                     .positions = in.pos.t.as<int32_t>() + t0,
                     .inv_freq = inv_freq_.f32(),
                     .attention_factor = rope_factor_,
                     .interleaved = c_.rope_interleave,
                     .slots = in.slots.t.as<int32_t>() + t0,
                     .pool = pool.layers[static_cast<size_t>(l)].t.data,
                     .pool_dtype = pool.dtype,
                     .num_tokens = n,
                     .kv_lora = r,
                     .rope_dim = rope,
                     .q_nope = q + t0 * q_stride,
                     .w_uk = q_lat ? w.w_uk_t.t.data : nullptr,
                     .w_uk_dtype = w.w_uk_t.t.dtype,
                     .nope_dim = nope,
                     .q_lat = q_lat});
  };

  OwnedTensor o = scratch(T, nh * vd);  // [T, nh, v]
  // out rows [t0, t0 + n) = o_proj(o rows) + pending rows.
  auto o_proj = [&](int64_t t0, int64_t n) {
    ops::LinearParams p{o.f32() + t0 * nh * vd, 0, w.o_proj.t.data, w.o_proj.t.dtype, out + t0 * H, 0, n, H, nh * vd};
    p.add = pending ? pending + t0 * H : nullptr;
    p.w_scales = w.o_proj.scales();
    return p;
  };

  // The absorbed part, tokens [0, Ta): q folded through W_uk (q_lat) with the roped q_pe beside it,
  // attention over the cached 576-wide rows, then W_uv and o_proj in one op.
  if (const int64_t Ta = in.Ta; Ta > 0) {
    OwnedTensor qa = scratch(Ta, nh * row);  // [Ta, nh, kv_lora + rope]: q_lat ‖ q_pe
    prepare(0, Ta, qa.f32() + r, nh * row, row, qa.f32());
    OwnedTensor lat = scratch(Ta, nh * r);  // [Ta, nh, kv_lora], attention in the latent space
    be_.mla_absorbed({qa.f32(), in.paged(pool, l), in.cu_q.t.as<int32_t>(), in.Ba, Ta, lat.f32(), nh, r, rope, scale_});
    // v[h] = W_uv[h] · lat[h], then o_proj: one op (one launch on CUDA for a single stream). W_uv[h]
    // is a view of kv_b's rows; a quantized kv_b's scale rows start on every head's (weights.h).
    const DType kt = w.kv_b.t.dtype;
    const int64_t row_elems = ops::weight_row_elems(kt, r);  // kv_b's row stride in elements of kt
    const void* wuv = static_cast<const char*>(w.kv_b.t.data) + static_cast<size_t>(nope * row_elems) * dtype_size(kt);
    ops::LinearHeadsParams uv{lat.f32(), nh * r, r,  wuv, (nope + vd) * row_elems, kt, o.f32(), nh * vd, vd,
                              nh,        Ta,     vd, r};
    if (w.kv_b.quantized()) {
      const ops::WeightScales s = w.kv_b.scales();
      const int64_t grid_k = (r + s.block_k - 1) / s.block_k;
      uv.w_scales = s;
      uv.w_scales.data =
          static_cast<const char*>(s.data) + static_cast<size_t>(nope / s.block_n * grid_k) * dtype_size(s.dtype);
      uv.w_scale_head_stride = (nope + vd) / s.block_n * grid_k;
    }
    be_.heads_then_linear(uv, o_proj(0, Ta));
  }

  // The expanded part, tokens [Ta, T): each sequence's context (cached prefix and this chunk)
  // gathered and up-projected through kv_b_proj, attention per head.
  if (const int64_t t0 = in.Ta, Tx = T - in.Ta; Tx > 0) {
    const int64_t Bx = in.B - in.Ba, ctx = in.total_kv_x;
    prepare(t0, Tx, q + t0 * q_stride + nope, q_stride, qk, nullptr);  // q_pe roped in place; no fold
    const ops::PagedKv paged = in.paged(pool, l, in.Ba);
    OwnedTensor kv = scratch(ctx, row);  // [ctx, row]: the part's context rows, contiguous
    be_.kv_gather({paged, in.cu_kv_x.t.as<int32_t>(), Bx, row, ctx, kv.f32()});
    OwnedTensor kvb = scratch(ctx, nh * (nope + vd));  // [ctx, nh, nope + v]: per head k_nope ‖ v
    ops::LinearParams kv_b{kv.f32(), row, w.kv_b.t.data, w.kv_b.t.dtype, kvb.f32(), 0, ctx, nh * (nope + vd), r};
    kv_b.x_bf16 = pool.dtype == DType::BF16;  // the latent rows as cached
    kv_b.w_scales = w.kv_b.scales();
    be_.linear(kv_b);
    // Attention reads k_nope and v from kvb and the shared roped k_pe from kv's last rope columns.
    be_.mla_expanded({.q = q + t0 * q_stride,
                      .kv_b = kvb.f32(),     // [ctx, nh, nope + v]
                      .k_pe = kv.f32() + r,  // [ctx, rope], rows `row` apart
                      .out = o.f32() + t0 * nh * vd,
                      .seqs = {in.cu_q_x.t.as<int32_t>(), in.cu_kv_x.t.as<int32_t>(), Bx},
                      .total_q = Tx,
                      .total_kv = ctx,
                      .num_heads = nh,
                      .qk_dim = qk,
                      .v_dim = vd,
                      .nope_dim = nope,
                      .scale = scale_,
                      .q_stride = q_stride,
                      .kv_b_stride = nh * (nope + vd),
                      .k_pe_stride = row});
    be_.linear(o_proj(t0, Tx));
  }
}

}  // namespace kiln
