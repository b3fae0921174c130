// MLA attention in both forms. Both are the same softmax(q·kᵀ·scale)·v over a causal suffix; the
// absorbed form attends over the shared latent rows (DESIGN.md §4).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/kv_fp8.h"
#include "ops/cpu/cpu_ops.h"

namespace kiln::ops::cpu {
namespace {

// Softmax over scores[0..n) in place (f32 with a max shift, as the references do).
void softmax_inplace(float* s, int64_t n) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, s[j]);
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < n; ++j) s[j] *= inv;
}

void check_seqs(const VarlenSeqs& s) {
  for (int64_t b = 0; b < s.num_seqs; ++b) {
    const int32_t q_len = s.cu_q[b + 1] - s.cu_q[b], kv_len = s.cu_kv[b + 1] - s.cu_kv[b];
    KILN_CHECK(q_len >= 0 && kv_len >= q_len, "attention: sequence {} has {} queries but only {} keys", b, q_len,
               kv_len);
  }
}

}  // namespace

void mla_expanded(const MlaExpandedParams& p) {
  check_seqs(p.seqs);
  const int64_t nope = p.nope_dim, rope = p.qk_dim - p.nope_dim, width = nope + p.v_dim;  // width: one head of kv_b
  KILN_CHECK(nope >= 0 && rope >= 0, "mla_expanded: nope_dim {} outside qk_dim {}", nope, p.qk_dim);
  const int64_t n = p.seqs.num_seqs;
  KILN_CHECK(n == 0 || (p.seqs.cu_q[n] == p.total_q && p.seqs.cu_kv[n] == p.total_kv),
             "mla_expanded: total_q {} / total_kv {} disagree with cu_q / cu_kv ({} / {})", p.total_q, p.total_kv,
             n ? p.seqs.cu_q[n] : 0, n ? p.seqs.cu_kv[n] : 0);
  const int64_t qs = p.q_stride ? p.q_stride : p.num_heads * p.qk_dim;
  const int64_t kvbs = p.kv_b_stride ? p.kv_b_stride : p.num_heads * width;
  const int64_t kps = p.k_pe_stride ? p.k_pe_stride : rope;
  for (int64_t b = 0; b < p.seqs.num_seqs; ++b) {
    const int64_t q0 = p.seqs.cu_q[b], q_len = p.seqs.cu_q[b + 1] - q0;
    const int64_t kv0 = p.seqs.cu_kv[b], kv_len = p.seqs.cu_kv[b + 1] - kv0;
#pragma omp parallel for collapse(2) if (q_len * p.num_heads > 8)
    for (int64_t i = 0; i < q_len; ++i) {
      for (int64_t h = 0; h < p.num_heads; ++h) {
        const int64_t visible = kv_len - q_len + i + 1;  // causal: keys up to this query's position
        std::vector<float> s(static_cast<size_t>(visible));
        const float* q = p.q + (q0 + i) * qs + h * p.qk_dim;
        for (int64_t j = 0; j < visible; ++j) {
          const float* k_nope = p.kv_b + (kv0 + j) * kvbs + h * width;
          const float* k_pe = p.k_pe + (kv0 + j) * kps;
          float dot = 0;
          for (int64_t d = 0; d < nope; ++d) dot += q[d] * k_nope[d];
          for (int64_t d = 0; d < rope; ++d) dot += q[nope + d] * k_pe[d];
          s[static_cast<size_t>(j)] = dot * p.scale;
        }
        softmax_inplace(s.data(), visible);
        float* o = p.out + ((q0 + i) * p.num_heads + h) * p.v_dim;
        for (int64_t d = 0; d < p.v_dim; ++d) o[d] = 0;
        for (int64_t j = 0; j < visible; ++j) {
          const float* v = p.kv_b + (kv0 + j) * kvbs + h * width + nope;
          const float w = s[static_cast<size_t>(j)];
          for (int64_t d = 0; d < p.v_dim; ++d) o[d] += w * v[d];
        }
      }
    }
  }
}

namespace {

int64_t pool_slot(const PagedKv& kv, int64_t seq, int64_t j) {
  const int32_t block = kv.block_table[seq * kv.max_blocks + j / kv.block_size];
  return static_cast<int64_t>(block) * kv.block_size + j % kv.block_size;
}

// The FP8 row layout of a pool whose rows are `row` values, c_kv the first kv_lora of them.
KvFp8Layout fp8_layout(int64_t kv_lora, int64_t row, const char* op) {
  KILN_CHECK(kv_lora > 0 && kv_lora <= row, "{}: an F8E4M3 KV pool needs its c_kv width (kv_lora {} of a {}-value row)",
             op, kv_lora, row);
  return kv_fp8_layout(kv_lora, row - kv_lora);
}

// Row j of sequence `seq`, widened to f32 into `dst` (exact for F32 and BF16 pools; an F8E4M3
// pool's row dequantizes to the very values every other read of it sees).
void load_row(const PagedKv& kv, int64_t seq, int64_t j, int64_t row, float* dst) {
  const int64_t slot = pool_slot(kv, seq, j);
  if (kv.pool_dtype == DType::F32) {
    std::copy_n(static_cast<const float*>(kv.pool) + slot * row, row, dst);
  } else if (kv.pool_dtype == DType::BF16) {
    const uint16_t* src = static_cast<const uint16_t*>(kv.pool) + slot * row;
    for (int64_t d = 0; d < row; ++d) dst[d] = bf16_to_f32(src[d]);
  } else {
    const KvFp8Layout l = fp8_layout(kv.kv_lora, row, "KV read");
    kv_fp8_dequantize_row(l, static_cast<const uint8_t*>(kv.pool) + slot * l.row_bytes, dst);
  }
}

void check_pool(DType t, const char* op) {
  KILN_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F8E4M3,
             "{}: the KV pool must be F32, BF16 or F8E4M3, not {}", op, dtype_name(t));
}

}  // namespace

void mla_absorbed(const MlaAbsorbedParams& p) {
  check_pool(p.kv.pool_dtype, "mla_absorbed");
  const int64_t row = p.kv_lora + p.rope_dim;
  PagedKv cache = p.kv;  // the op knows the c_kv width an F8E4M3 row splits at
  KILN_CHECK(cache.kv_lora == 0 || cache.kv_lora == p.kv_lora, "mla_absorbed: the pool's kv_lora {} is not the op's {}",
             cache.kv_lora, p.kv_lora);
  cache.kv_lora = p.kv_lora;
  std::vector<float> ctx;  // the sequence's rows in f32, widened once for every query and head
  for (int64_t b = 0; b < p.num_seqs; ++b) {
    const int64_t q0 = p.cu_q[b], q_len = p.cu_q[b + 1] - q0, kv_len = p.kv.kv_lens[b];
    if (kv_len == 0) {  // a padding sequence: zeros, and its block table is never read
      std::fill(p.out + q0 * p.num_heads * p.kv_lora, p.out + (q0 + q_len) * p.num_heads * p.kv_lora, 0.0f);
      if (p.lse)
        std::fill(p.lse + q0 * p.num_heads, p.lse + (q0 + q_len) * p.num_heads,
                  -std::numeric_limits<float>::infinity());
      continue;
    }
    KILN_CHECK(q_len >= 0 && kv_len >= q_len, "attention: sequence {} has {} queries but only {} keys", b, q_len,
               kv_len);
    ctx.resize(static_cast<size_t>(kv_len * row));
    for (int64_t j = 0; j < kv_len; ++j) load_row(cache, b, j, row, ctx.data() + j * row);
#pragma omp parallel for collapse(2) if (q_len * p.num_heads > 8)
    for (int64_t i = 0; i < q_len; ++i) {
      for (int64_t h = 0; h < p.num_heads; ++h) {
        const int64_t visible = kv_len - q_len + i + 1;
        std::vector<float> s(static_cast<size_t>(visible));
        const float* q = p.q + ((q0 + i) * p.num_heads + h) * row;
        for (int64_t j = 0; j < visible; ++j) {
          const float* kv = ctx.data() + j * row;
          float dot = 0;
          for (int64_t d = 0; d < row; ++d) dot += q[d] * kv[d];  // q_lat·c_kv + q_pe·k_pe
          s[static_cast<size_t>(j)] = dot * p.scale;
        }
        if (p.lse) {  // log Σ exp(s), before softmax_inplace turns the scores into weights
          const float top = *std::max_element(s.begin(), s.end());
          double total = 0;
          for (float v : s) total += std::exp(static_cast<double>(v - top));
          p.lse[(q0 + i) * p.num_heads + h] = top + static_cast<float>(std::log(total));
        }
        softmax_inplace(s.data(), visible);
        float* o = p.out + ((q0 + i) * p.num_heads + h) * p.kv_lora;
        for (int64_t d = 0; d < p.kv_lora; ++d) o[d] = 0;
        for (int64_t j = 0; j < visible; ++j) {
          const float* c = ctx.data() + j * row;  // values are the c_kv part of each row
          const float w = s[static_cast<size_t>(j)];
          for (int64_t d = 0; d < p.kv_lora; ++d) o[d] += w * c[d];
        }
      }
    }
  }
}

void kv_scatter(const KvScatterParams& p) {
  check_pool(p.pool_dtype, "kv_scatter");
  const bool fp8 = p.pool_dtype == DType::F8E4M3;
  const KvFp8Layout l = fp8 ? fp8_layout(p.kv_lora, p.row_dim, "kv_scatter") : KvFp8Layout{};
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const float* src = p.rows + t * p.row_dim;
    const int64_t slot = p.slots[t];
    if (p.pool_dtype == DType::F32) {
      std::copy_n(src, p.row_dim, static_cast<float*>(p.pool) + slot * p.row_dim);
    } else if (p.pool_dtype == DType::BF16) {
      uint16_t* dst = static_cast<uint16_t*>(p.pool) + slot * p.row_dim;
      for (int64_t d = 0; d < p.row_dim; ++d) dst[d] = f32_to_bf16(src[d]);  // round to nearest even
    } else {
      kv_fp8_quantize_row(l, src, static_cast<uint8_t*>(p.pool) + slot * l.row_bytes);
    }
  }
}

void kv_gather(const KvGatherParams& p) {
  check_pool(p.kv.pool_dtype, "kv_gather");
  for (int64_t b = 0; b < p.num_seqs; ++b) {
    const int64_t n = p.cu_kv[b + 1] - p.cu_kv[b];
    KILN_CHECK(n == p.kv.kv_lens[b], "kv_gather: sequence {} spans {} rows but has {} cached", b, n, p.kv.kv_lens[b]);
    for (int64_t j = 0; j < n; ++j) load_row(p.kv, b, j, p.row_dim, p.out + (p.cu_kv[b] + j) * p.row_dim);
  }
}

void mla_prepare(const MlaPrepareParams& p) {
  const int64_t T = p.num_tokens, row = p.kv_lora + p.rope_dim;
  if (p.w_uk)  // the W_uk fold: the very linear_heads call it stands for
    linear_heads({p.q_nope, p.q_in_stride, p.q_in_head_stride, p.w_uk, p.kv_lora * p.nope_dim, p.w_uk_dtype, p.q_lat,
                  p.q_out_stride, p.q_out_head_stride, p.num_heads, T, p.kv_lora, p.nope_dim});
  if (p.q_out != p.q_in)
    for (int64_t t = 0; t < T; ++t)
      copy({p.q_in + t * p.q_in_stride, p.q_in_head_stride, p.q_out + t * p.q_out_stride, p.q_out_head_stride,
            p.num_heads, p.rope_dim});
  rope({p.q_out, T, p.num_heads, p.q_out_stride, p.q_out_head_stride, p.rope_dim, p.positions, p.inv_freq,
        p.attention_factor, p.interleaved});
  std::vector<float> rows(static_cast<size_t>(T * row));  // [T, row]: the new latent rows in f32
  rms_norm({p.kva, p.kva_stride, p.norm_weight, p.norm_weight_dtype, rows.data(), row, T, p.kv_lora, p.eps});
  copy({p.kva + p.kv_lora, p.kva_stride, rows.data() + p.kv_lora, row, T, p.rope_dim});
  rope({rows.data() + p.kv_lora, T, 1, row, 0, p.rope_dim, p.positions, p.inv_freq, p.attention_factor, p.interleaved});
  kv_scatter({rows.data(), p.slots, p.pool, p.pool_dtype, T, row, p.kv_lora});
}

}  // namespace kiln::ops::cpu
