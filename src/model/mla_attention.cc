// DeepseekV3Model::attention: one MLA layer over a step whose sequences are ordered by form
// (StepInputs): decode rows in the absorbed form over the paged latent cache, prompt chunks in the
// expanded form over their own context only, each part writing its own rows of the output.
#include <algorithm>

#include "core/error.h"
#include "dist/communicator.h"
#include "model/step_inputs.h"
#include "ops/quant.h"

namespace kiln {

void DeepseekV3Model::attention(int64_t l, const float* x, const float* pending, float* out, const StepInputs& in,
                                LatentKvPool& pool) {
  const LayerWeights& w = w_.layers[static_cast<size_t>(l)];
  const int64_t T = in.T, H = c_.hidden_size, nh = nh_, nope = c_.qk_nope_head_dim, rope = c_.qk_rope_head_dim,
                qk = c_.qk_head_dim(), vd = c_.v_head_dim, r = c_.kv_lora_rank, row = c_.kv_row_dim();
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const bool dcp = shard_.dcp > 1;  // this rank holds every dcp-th token's latent row only

  // One projection of x feeds both q (or q LoRA's q_a) and the latent row: qkv [T, nq + row].
  const int64_t nq = c_.q_lora_rank > 0 ? c_.q_lora_rank : nh * qk, ld = nq + row;  // this rank's q_proj rows
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
                     .slots = (dcp ? in.dcp_slots : in.slots).t.as<int32_t>() + t0,
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
    p.add = pending && shard_.rank == 0 ? pending + t0 * H : nullptr;  // split: rank 0 adds, the sum the rest
    p.w_scales = w.o_proj.scales();
    return p;
  };

  // The absorbed part, tokens [0, Ta): q folded through W_uk (q_lat) with the roped q_pe beside it,
  // attention over the cached 576-wide rows, then W_uv and o_proj in one op.
  if (const int64_t Ta = in.Ta; Ta > 0) {
    OwnedTensor qa = scratch(Ta, nh * row);  // [Ta, nh, kv_lora + rope]: q_lat ‖ q_pe
    prepare(0, Ta, qa.f32() + r, nh * row, row, qa.f32());
    OwnedTensor lat = scratch(Ta, nh * r);  // [Ta, nh, kv_lora], attention in the latent space
    if (dcp)
      absorbed_dcp(qa.f32(), lat.f32(), in, pool, l);
    else
      be_.mla_absorbed(
          {qa.f32(), in.paged(pool, l), in.cu_q.t.as<int32_t>(), in.Ba, Ta, lat.f32(), nh, r, rope, scale_});
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
    if (dcp)
      gather_dcp(kv.f32(), in, pool, l);
    else
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
  all_reduce(out, T * H);  // the heads' partial o_proj sums (a no-op on one rank)
}

// Decode context parallelism, absorbed part: every rank's queries [Ta, nh, row] go to every rank,
// each attends over its own rows of the context (with the log-sum-exp of each query's scores),
// the partial outputs go back to their heads' rank and merge there. lat [Ta, nh, kv_lora].
void DeepseekV3Model::absorbed_dcp(const float* qa, float* lat, const StepInputs& in, LatentKvPool& pool, int64_t l) {
  const int64_t W = shard_.world, Ta = in.Ta, nh = nh_, r = c_.kv_lora_rank, row = c_.kv_row_dim();
  const size_t nq = static_cast<size_t>(Ta * nh * row), nout = static_cast<size_t>(Ta * nh * r),
               nlse = static_cast<size_t>(Ta * nh);
  OwnedTensor q_all = scratch(W * Ta, nh * row);  // [W, Ta, nh, row]: rank s's queries at block s
  shard_.comm->all_gather(qa, q_all.f32(), nq, DType::F32);
  OwnedTensor part = scratch(W * Ta, nh * r), lse = scratch(W * Ta, nh);  // [W, Ta, nh, r], [W, Ta, nh]
  for (int64_t s = 0; s < W; ++s) {
    ops::MlaAbsorbedParams p{q_all.f32() + s * nq,
                             in.paged(pool, l, 0, true),
                             in.cu_q.t.as<int32_t>(),
                             in.Ba,
                             Ta,
                             part.f32() + s * nout,
                             nh,
                             r,
                             c_.qk_rope_head_dim,
                             scale_};
    p.lse = lse.f32() + s * nlse;
    be_.mla_absorbed(p);
  }
  OwnedTensor mine = scratch(W * Ta, nh * r), mine_lse = scratch(W * Ta, nh);  // every rank's part of my heads
  const std::vector<size_t> out_counts(static_cast<size_t>(W), nout), lse_counts(static_cast<size_t>(W), nlse);
  shard_.comm->all_to_all(part.f32(), out_counts, mine.f32(), out_counts, DType::F32);
  shard_.comm->all_to_all(lse.f32(), lse_counts, mine_lse.f32(), lse_counts, DType::F32);
  be_.attention_merge({mine.f32(), mine_lse.f32(), lat, W, Ta * nh, r});
}

// Decode context parallelism, expanded part: each rank gathers its own rows of every expanded
// sequence's context, the ranks' rows are all-gathered (each rank's block padded to the largest)
// and put back in position order (position p is row p / dcp of rank p % dcp). kv [ctx, row].
void DeepseekV3Model::gather_dcp(float* kv, const StepInputs& in, LatentKvPool& pool, int64_t l) {
  const int64_t W = shard_.dcp, row = c_.kv_row_dim(), Bx = in.B - in.Ba;
  std::vector<int64_t> total(static_cast<size_t>(W), 0);
  for (int32_t len : in.x_kv_lens)
    for (int64_t s = 0; s < W; ++s) total[static_cast<size_t>(s)] += dcp_rows(len, s, W);
  const int64_t most = std::max<int64_t>(1, *std::max_element(total.begin(), total.end()));
  OwnedTensor own = scratch(most, row), all = scratch(W * most, row);  // [most, row], [W, most, row]
  be_.kv_gather({in.paged(pool, l, in.Ba, true), in.dcp_cu_kv_x.t.as<int32_t>(), Bx, row,
                 total[static_cast<size_t>(shard_.dcp_rank)], own.f32()});
  shard_.comm->all_gather(own.f32(), all.f32(), static_cast<size_t>(most * row), DType::F32);
  std::vector<int64_t> at(static_cast<size_t>(W), 0);  // each rank's rows of the sequences so far
  int64_t ctx0 = 0;
  for (int32_t len : in.x_kv_lens) {
    for (int64_t s = 0; s < W; ++s) {
      const int64_t n = dcp_rows(len, s, W);
      if (n > 0)
        be_.copy(
            {all.f32() + (s * most + at[static_cast<size_t>(s)]) * row, row, kv + (ctx0 + s) * row, W * row, n, row});
      at[static_cast<size_t>(s)] += n;
    }
    ctx0 += len;
  }
}

}  // namespace kiln
