// Plain parameter structs of every op. Pointers, sizes and strides only; every field carries its
// shape. Activations are f32 on the CPU backend; weights carry their dtype (`*_dtype`).
// Row strides are in elements; a stride of 0 means "contiguous".
#pragma once

#include <cstdint>
#include <optional>

#include "core/dtype.h"

namespace kiln::ops {

// The scales of a quantized weight (data null: the weight is plain w_dtype values, no scales).
// Element (r, c) of an [n, k] weight W of dtype w_dtype decodes as
//   F8E4M3: e4m3(code[r * k + c]) * s(r, c)   (DeepSeek-V3 FP8: 128 x 128 blocks, `weight_scale_inv`
//           is the multiplier despite its name)
//   I4X8:   int4_from_word(word[r * ceil(k / 8) + c / 8], c % 8) * s(r, c)   (compressed-tensors
//           pack-quantized, symmetric, as Kimi K2-Thinking ships it: int32 words of eight values
//           along k, value j in bits 4j..4j+3 stored as nibble - 8, rows padded to whole words;
//           `weight_scale` [n, k / group], group 32, so block_n 1 and block_k 32)
// with s(r, c) = data[(r / block_n) * ceil(k / block_k) + c / block_k], a row-major grid of
// [ceil(n / block_n), ceil(k / block_k)] scales of `dtype` (F32 or BF16). A fused weight (gate rows
// then up rows, q_a then kv_a) whose parts do not start on a block_n boundary can still be expressed
// with block_n 1 and its scale rows repeated. A view starting at weight row r0 (a head of kv_b)
// offsets data by (r0 / block_n) rows of scales; r0 must be a multiple of block_n.
// The CPU reference dequantizes exactly (f32) and computes as for f32 weights. CUDA takes F8E4M3
// with F32 scales and block_k a multiple of 16, I4X8 with BF16 or F32 scales, block_k a multiple of 8.
struct WeightScales {
  const void* data = nullptr;  // [ceil(n / block_n), ceil(k / block_k)] (per expert: [E, ...] contiguous)
  DType dtype = DType::F32;
  int64_t block_n = 0, block_k = 0;
  bool quantized() const { return data != nullptr; }
};

struct EmbeddingParams {
  const int32_t* ids;  // [num_tokens]
  const void* table;   // [vocab, hidden]: the rows of ids [vocab_begin, vocab_begin + vocab)
  DType table_dtype;
  float* out;  // [num_tokens, hidden]
  int64_t num_tokens, vocab, hidden;
  // A vocabulary-parallel rank's slice of the table: id i reads row i - vocab_begin, and ids
  // outside the slice give zero rows (another rank holds them; the ranks' rows are then summed).
  int64_t vocab_begin = 0;
  bool zero_outside = false;
};

struct RmsNormParams {
  const float* x;  // [rows, dim], rows x_stride apart
  int64_t x_stride;
  const void* weight;  // [dim]
  DType weight_dtype;
  float* out;  // [rows, dim], rows out_stride apart (may alias x)
  int64_t out_stride;
  int64_t rows, dim;
  float eps;
  // Optional fused residual add (one pass instead of add + norm): when set, x + residual is what
  // gets normalised, and it is also written to `sum` when that is set (null: not kept).
  const float* residual = nullptr;  // [rows, dim], rows x_stride apart
  float* sum = nullptr;             // [rows, dim], rows x_stride apart (may alias x)
};

// y = x · wᵀ
struct LinearParams {
  const float* x;  // [m, k], rows x_stride apart
  int64_t x_stride;
  const void* w;  // [n, k] row-major
  DType w_dtype;
  float* y;  // [m, n], rows y_stride apart
  int64_t y_stride;
  int64_t m, n, k;
  // Optional input norm (a layer's RMSNorm as part of the projection that consumes it; CUDA runs
  // it as its own kernel, which the decode GEMV after it overlaps): when norm_weight is set, the op multiplies by
  // rms_norm(x + norm_residual) ⊙ norm_weight instead of x, with RmsNormParams's math (mean of
  // squares over k, rsqrt(mean + eps)). Neither x nor norm_residual is written.
  const void* norm_weight = nullptr;  // [k]
  DType norm_weight_dtype = DType::F32;
  float norm_eps = 0.0f;
  const float* norm_residual = nullptr;  // [m, k], rows x_stride apart (null: none)
  // Optional addend (the residual stream joining a sub-layer's output): y = x · wᵀ + add. Must not
  // overlap y.
  const float* add = nullptr;  // [m, n], rows y_stride apart
  // x, as passed (before any input norm, which ignores this), holds bf16 values (rows gathered from
  // a bf16 cache): a backend that feeds f32 activations to bf16 tensor cores as hi + lo parts may
  // skip the lo part, which is zero. Results are then the same up to summation order; x that is
  // not bf16 gets rounded on CUDA (the GEMVs and f32 weights ignore the hint).
  bool x_bf16 = false;
  // Scales of a quantized w (F8E4M3 codes or I4X8 words, see WeightScales); default: none.
  WeightScales w_scales = {};
};

// Per head h: y[:, h, :] = x[:, h, :] · W[h]ᵀ, every head in one call (the absorbed form's W_uk
// and W_uv folds).
struct LinearHeadsParams {
  const float* x;  // [m, heads, k] at x + t * x_stride + h * x_head_stride (x_stride 0: heads * k)
  int64_t x_stride, x_head_stride;
  const void* w;  // head h: [n, k] row-major at w + h * w_head_stride (elements of w_dtype: I4X8 words)
  int64_t w_head_stride;
  DType w_dtype;
  float* y;  // [m, heads, n] at y + t * y_stride + h * y_head_stride (y_stride 0: heads * n)
  int64_t y_stride, y_head_stride;
  int64_t heads, m, n, k;
  // Scales of a quantized w (WeightScales): head h's grid at w_scales.data + h * w_scale_head_stride
  // (elements of w_scales.dtype). Default: none.
  WeightScales w_scales = {};
  int64_t w_scale_head_stride = 0;
};

// out[i] = a[i] + b[i]
struct AddParams {
  const float* a;  // [n]
  const float* b;  // [n]
  float* out;      // [n] (may alias a or b)
  int64_t n;
};

// Copies a [rows, cols] block between strided rows; destination row r reads source row
// r / src_repeat (src_repeat > 1 broadcasts each source row to src_repeat destination rows).
struct CopyParams {
  const float* src;  // [rows / src_repeat, cols], rows src_stride apart
  int64_t src_stride;
  float* dst;  // [rows, cols], rows dst_stride apart
  int64_t dst_stride;
  int64_t rows, cols;
  int64_t src_repeat = 1;
};

// ids[i] = src[from[i]] where from[i] >= 0; other ids stay. The overlapped engine loop feeds a
// step the tokens the step before it sampled, still on the device, without a round trip.
struct TakeTokensParams {
  int32_t* ids;         // [n]
  const int32_t* from;  // [n]: a row of src, or -1
  const int32_t* src;   // [rows of the earlier step's samples]
  int64_t n;
};

// silu(gate) * up, with gate and up side by side in one row.
struct SwigluParams {
  const float* gate_up;  // [rows, 2 * inter]: gate columns then up columns
  float* out;            // [rows, inter]
  int64_t rows, inter;
};

// Rotary embedding of the rot_dim-wide slice of every head, in place.
// interleaved: pairs (2i, 2i+1) rotate by frequency i (DeepSeek-V3 / Kimi checkpoints);
// otherwise NeoX halves (i, i + rot_dim/2).
struct RopeParams {
  float* x;  // [num_tokens, num_heads, rot_dim] at x + t*token_stride + h*head_stride
  int64_t num_tokens, num_heads, token_stride, head_stride, rot_dim;
  const int32_t* positions;  // [num_tokens]
  const float* inv_freq;     // [rot_dim / 2]
  float attention_factor;    // YaRN's multiplier on cos and sin
  bool interleaved;
};

// Sequences of a batch: query rows of sequence b are [cu_q[b], cu_q[b+1]); its keys/values are
// [cu_kv[b], cu_kv[b+1]). Queries are the last (q_len) positions of the kv span (causal suffix).
struct VarlenSeqs {
  const int32_t* cu_q;   // [num_seqs + 1]
  const int32_t* cu_kv;  // [num_seqs + 1]
  int64_t num_seqs;
};

// Expanded MLA (prefill form): per-head k_nope and v straight from the kv_b_proj output, the shared
// roped k_pe straight from the gathered latent rows; q·k over qk_dim = nope_dim + rope_dim. Key j of
// head h is (kv_b[j, h, :nope_dim] ‖ k_pe[j, :]), its value kv_b[j, h, nope_dim : nope_dim + v_dim].
struct MlaExpandedParams {
  const float* q;     // [total_q, num_heads, qk_dim]  (q_nope ‖ roped q_pe), rows q_stride apart
  const float* kv_b;  // [total_kv, num_heads, nope_dim + v_dim]: per head k_nope ‖ v (the kv_b_proj output),
                      // rows kv_b_stride apart
  const float* k_pe;  // [total_kv, rope_dim] shared by every head (roped), rows k_pe_stride apart
  float* out;         // [total_q, num_heads, v_dim]
  VarlenSeqs seqs;
  int64_t total_q;   // cu_q[num_seqs], known on the host
  int64_t total_kv;  // must equal cu_kv[num_seqs], known on the host
  int64_t num_heads, qk_dim, v_dim;
  int64_t nope_dim;  // k_nope's width in kv_b; rope_dim = qk_dim - nope_dim is k_pe's
  float scale;
  int64_t q_stride = 0;     // rows of q this far apart (0: num_heads * qk_dim), e.g. a view of a fused projection
  int64_t kv_b_stride = 0;  // rows of kv_b this far apart (0: num_heads * (nope_dim + v_dim))
  int64_t k_pe_stride = 0;  // rows of k_pe this far apart (0: rope_dim), e.g. the k_pe columns of latent rows
};

// The paged latent KV cache of one layer as attention reads it: row j of sequence b lives in
// slot block_table[b][j / block_size] * block_size + j % block_size of the pool. The pool holds
// Backend::kv_dtype() values (F32 on the CPU, BF16 on CUDA) or, with pool_dtype F8E4M3, rows in
// the FP8 layout of core/kv_fp8.h (c_kv as e4m3 with one f32 scale per 128 values, k_pe in bf16;
// the CPU reference only). A sequence with kv_len 0 (a padding row of a captured batch) reads
// nothing: its block-table row need not be valid.
struct PagedKv {
  const void* pool;            // [num_slots, kv_lora + rope] of pool_dtype (F8E4M3: [num_slots, row_bytes] bytes)
  DType pool_dtype;            // F32, BF16 or F8E4M3
  const int32_t* block_table;  // [num_seqs, max_blocks]
  const int32_t* kv_lens;      // [num_seqs]: context length including this step's tokens
  int64_t block_size, max_blocks;
  int64_t kv_lora = 0;  // F8E4M3 pools: the quantized c_kv width (the row's rest is k_pe); else unused
};

// Absorbed MLA (decode form): one shared 576-wide KV head, q folded through W_uk. Reads the paged
// cache directly. Query rows of sequence b are [cu_q[b], cu_q[b+1]), the last positions of its
// context (several per sequence for speculative verification): query i of q_len sees the first
// kv_len - q_len + i + 1 rows. A sequence with kv_len 0 (padding) gets zero outputs.
struct MlaAbsorbedParams {
  const float* q;  // [total_q, num_heads, kv_lora + rope]  (q_nope·W_uk ‖ roped q_pe)
  PagedKv kv;
  const int32_t* cu_q;  // [num_seqs + 1]
  int64_t num_seqs;
  int64_t total_q;  // cu_q[num_seqs], known on the host
  float* out;       // [total_q, num_heads, kv_lora]  (latent; W_uv folds it to v later)
  int64_t num_heads, kv_lora, rope_dim;
  float scale;
  // Optional: each query's log-sum-exp of its scaled scores (-inf for a sequence with no keys), so
  // that attention over parts of a context (decode context parallelism) can be merged
  // (AttentionMergeParams). The CPU reference writes it; CUDA refuses it for now.
  float* lse = nullptr;  // [total_q, num_heads]
};

// Merges attention outputs over disjoint parts of the keys: out = Σ_p exp(lse[p] - L) · parts[p]
// with L = log Σ_p exp(lse[p]), per row; rows whose parts all have lse -inf get zeros.
struct AttentionMergeParams {
  const float* parts;  // [num_parts, rows, dim]
  const float* lse;    // [num_parts, rows]
  float* out;          // [rows, dim]
  int64_t num_parts, rows, dim;
};

// Writes new latent rows into their pool slots; a BF16 pool stores them rounded to nearest even,
// an F8E4M3 pool quantizes them (core/kv_fp8.h).
struct KvScatterParams {
  const float* rows;     // [num_tokens, row_dim]
  const int32_t* slots;  // [num_tokens]
  void* pool;            // [num_slots, row_dim] of pool_dtype (F8E4M3: [num_slots, row_bytes] bytes)
  DType pool_dtype;      // F32, BF16 or F8E4M3
  int64_t num_tokens, row_dim;
  int64_t kv_lora = 0;  // F8E4M3 pools: the quantized c_kv width (PagedKv::kv_lora)
};

// Copies every sequence's context rows out of the pool into one contiguous f32 array (the expanded
// form's input; BF16 pools widen exactly, F8E4M3 pools dequantize as every read does): sequence b's rows land at
// [cu_kv[b], cu_kv[b+1]).
struct KvGatherParams {
  PagedKv kv;
  const int32_t* cu_kv;  // [num_seqs + 1]
  int64_t num_seqs, row_dim;
  int64_t total_rows;  // cu_kv[num_seqs], known on the host
  float* out;          // [total_kv, row_dim]
};

// The MLA attention prologue after the projections, in one op (it replaces rope of q_pe,
// rms_norm + rope of the latent row, kv_scatter and the absorbed form's q_pe copy). Per new
// token t, exactly as those ops compute it:
//   q_out[t, h, :] = rope(q_in[t, h, :]) for every head h;
//   pool[slots[t]] = rms_norm(kva[t, :kv_lora]) * norm_weight ‖ rope(kva[t, kv_lora:]),
// stored as kv_scatter stores (bf16: round to nearest even). kva itself is left as projected.
// Strides are explicit (0 is not "contiguous" here).
// Optionally (w_uk set) the absorbed form's W_uk fold runs in the same op, so a decode layer's
// prologue is one launch: for every token t and head h
//   q_lat[t, h, :] = w_uk[h] · q_nope[t, h, :]   (w_uk[h]: [kv_lora, nope_dim]),
// exactly linear_heads({q_nope, q_in_stride, q_in_head_stride, w_uk, kv_lora * nope_dim, w_uk_dtype,
// q_lat, q_out_stride, q_out_head_stride, num_heads, num_tokens, kv_lora, nope_dim}): q_nope shares
// q_in's strides and q_lat q_out's (the absorbed form writes q_lat ‖ roped q_pe side by side);
// q_lat must not overlap q_in, q_nope or q_out.
struct MlaPrepareParams {
  const float* q_in;  // [num_tokens, num_heads, rope] at q_in + t*q_in_stride + h*q_in_head_stride
  int64_t q_in_stride, q_in_head_stride;
  float* q_out;  // [num_tokens, num_heads, rope] likewise; may be q_in with the same strides (in place)
  int64_t q_out_stride, q_out_head_stride;
  int64_t num_heads;
  const float* kva;  // [num_tokens, kv_lora + rope], rows kva_stride apart: c_kv ‖ k_pe as projected
  int64_t kva_stride;
  const void* norm_weight;  // [kv_lora]: kv_a_layernorm
  DType norm_weight_dtype;
  float eps;
  const int32_t* positions;  // [num_tokens]
  const float* inv_freq;     // [rope / 2]
  float attention_factor;    // YaRN's multiplier on cos and sin
  bool interleaved;          // pairs (2i, 2i+1), else NeoX halves (RopeParams)
  const int32_t* slots;      // [num_tokens]: pool row of each token
  void* pool;                // [num_slots, kv_lora + rope] of pool_dtype (F8E4M3: the kv_fp8.h rows)
  DType pool_dtype;          // F32, BF16 or F8E4M3 (the CPU reference only)
  int64_t num_tokens, kv_lora, rope_dim;
  // The optional W_uk fold (absent while w_uk is null).
  const float* q_nope = nullptr;   // [num_tokens, num_heads, nope_dim] at q_nope + t*q_in_stride + h*q_in_head_stride
  const void* w_uk = nullptr;      // [num_heads, kv_lora, nope_dim] row-major (the model's w_uk_t)
  DType w_uk_dtype = DType::BF16;  // BF16 or F32
  int64_t nope_dim = 0;
  float* q_lat = nullptr;  // [num_tokens, num_heads, kv_lora] at q_lat + t*q_out_stride + h*q_out_head_stride
};

// Grouped top-k routing (DESIGN.md §4).
struct RouterParams {
  const float* logits;  // [num_tokens, num_experts]: x · gateᵀ in f32 (unused when `x` is set)
  const float* bias;    // [num_experts]: e_score_correction_bias (choice only)
  int32_t* topk_ids;    // [num_tokens, top_k]
  float* topk_weights;  // [num_tokens, top_k]
  int64_t num_tokens, num_experts, top_k, n_group, topk_group;
  bool norm_topk_prob;
  float routed_scaling_factor;
  // Optional gate projection in the same op (decode routes in one launch on CUDA): when `x` is
  // set, gate_logits = x · gate_weightᵀ is computed first and routing reads it instead of `logits`.
  const float* x = nullptr;            // [num_tokens, hidden]
  const float* gate_weight = nullptr;  // [num_experts, hidden] f32
  float* gate_logits = nullptr;        // [num_tokens, num_experts] written
  int64_t hidden = 0;
  // Optional input norm of the fused gate (the post-attention RMSNorm inside the routing op): when
  // norm_weight is set, the gate reads rms_norm(x + norm_residual) ⊙ norm_weight (RmsNormParams's
  // math) and writes it to normed_x, the experts' input. normed_x must not overlap x or
  // norm_residual; neither of those is written.
  const void* norm_weight = nullptr;  // [hidden]
  DType norm_weight_dtype = DType::F32;
  float norm_eps = 0.0f;
  const float* norm_residual = nullptr;  // [num_tokens, hidden] (null: none)
  float* normed_x = nullptr;             // [num_tokens, hidden] written
};

// Routed experts: out[t] = Σ_j w[t,j] · down_e(silu(gate_e x) * up_e x), e = topk_ids[t,j]
// (plus the shared experts when given).
struct MoeParams {
  const float* x;             // [num_tokens, hidden]
  const int32_t* topk_ids;    // [num_tokens, top_k]
  const float* topk_weights;  // [num_tokens, top_k]
  const void* w_gate_up;      // [num_experts, 2 * inter, hidden]: gate rows then up rows (I4X8: hidden / 8 words)
  const void* w_down;         // [num_experts, hidden, inter] (I4X8: inter / 8 words a row)
  DType w_dtype;
  float* out;  // [num_tokens, hidden] (overwritten)
  int64_t num_tokens, hidden, inter, num_experts, top_k;
  // Optional shared experts, added with weight 1: out[t] += down_s(silu(gate_s x) * up_s x). Their
  // width is n_shared_experts * inter; one op runs both so decode streams all weights in one pass.
  const void* w_shared_gate_up = nullptr;  // [2 * shared_inter, hidden]: gate rows then up rows
  const void* w_shared_down = nullptr;     // [hidden, shared_inter]
  int64_t shared_inter = 0;
  // Optional addend (the residual stream joining the FFN's output): out[t] += add[t]. Must not
  // overlap out.
  const float* add = nullptr;  // [num_tokens, hidden]
  // Quantized experts (WeightScales; default none): one scale grid per expert, contiguous, e.g.
  // gate/up [num_experts, ceil(2 * inter / block_n), ceil(hidden / block_k)] and down
  // [num_experts, ceil(hidden / block_n), ceil(inter / block_k)].
  WeightScales w_gate_up_scales = {}, w_down_scales = {};
  // The shared experts' dtype when it differs from the routed ones' (Kimi K2-Thinking keeps them
  // bf16 beside INT4 experts); nullopt: w_dtype. Their scales when quantized (no expert dimension).
  std::optional<DType> w_shared_dtype = std::nullopt;
  WeightScales w_shared_gate_up_scales = {}, w_shared_down_scales = {};
  DType shared_dtype() const { return w_shared_dtype.value_or(w_dtype); }
};

// Expert parallelism: keeps the routed choices of this rank's experts [begin, begin + count), in
// place. A chosen expert inside the range becomes its local index (id - begin); one outside gets
// weight 0 and local index 0, so moe() over the local experts adds nothing for it.
struct ExpertSliceParams {
  int32_t* topk_ids;    // [n]
  float* topk_weights;  // [n]
  int64_t n, begin, count;
};

// Row-wise log-softmax.
struct LogSoftmaxParams {
  const float* logits;  // [rows, vocab]
  float* out;           // [rows, vocab] (may alias logits)
  int64_t rows, vocab;
};

// Token choice for rows of logits, per row: raw log-probabilities (what `logprob` and the top list
// report), then penalties on a copy, then greedy argmax (temperature <= 0) or a draw after
// temperature -> top-k -> top-p -> min-p, each renormalising what it keeps. Cuts follow the total
// order (penalised logit desc, token id asc), so ties cut identically on every backend; the draw
// is an inverse CDF over the kept tokens in id order with u = sample_uniform(seed, counter)
// (ops/sampling_rng.h): a row's token depends on its seed and counter only, never on the batch.
struct SampleParams {
  const float* logits;  // [rows, vocab], rows logits_stride apart (0: contiguous); read-only
  int64_t logits_stride;
  int64_t rows, vocab;
  // Per row, on the backend. Off values: temperature <= 0 (greedy), top_k <= 0 or >= vocab,
  // top_p >= 1, min_p <= 0, repetition 1, presence 0, frequency 0.
  const float* temperature;  // [rows]
  const int32_t* top_k;      // [rows]
  const float* top_p;        // [rows]: in (0, 1]
  const float* min_p;        // [rows]: in [0, 1], relative to the most likely kept token
  const float* repetition;   // [rows]: > 0
  const float* presence;     // [rows]
  const float* frequency;    // [rows]
  const uint64_t* seed;      // [rows]: the request's seed
  const uint64_t* counter;   // [rows]: index of this draw in the request (tokens generated so far)
  // Penalty tokens in CSR form: row r's entries are [pen_offsets[r], pen_offsets[r+1]). An entry is
  // a DISTINCT token seen in the row's prompt or output, with its number of occurrences in the
  // output: repetition applies to every entry, presence and frequency to entries with count > 0
  // (so count 0 is the "prompt only" flag). Rows whose penalties are off may have no entries;
  // pen_offsets null: no penalties in the whole batch.
  const int32_t* pen_offsets;  // [rows + 1]
  const int32_t* pen_ids;      // [pen_offsets[rows]]
  const int32_t* pen_counts;   // [pen_offsets[rows]]: occurrences in the output (>= 0)
  int64_t num_top;             // 0..20 top logprobs per row (rows wanting fewer ignore the rest)
  int32_t* token;              // [rows] out
  float* logprob;              // [rows] out: log P(token) under the raw (unpenalised) distribution
  int32_t* top_ids;            // [rows, num_top] out: most likely first, lowest id on ties; -1 past vocab
  float* top_logprobs;         // [rows, num_top] out: -inf past vocab
};
inline constexpr int64_t kMaxTopLogprobs = 20;

}  // namespace kiln::ops
