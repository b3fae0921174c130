// Pieces of the device-side routed-expert path shared by moe.cu (dispatch, combine), moe_align.cu
// (token permutation), moe_grouped_gemm.cu and moe_wgmma.cu (the two grouped tensor-core GEMMs on
// mma.sync and on wgmma) and moe_cublas.cu (per-expert cuBLASLt GEMMs, the row-wise glue passes
// around them).
//
// Layout: the T·k (token, choice) slots are sorted by expert; each expert's rows are padded up to
// a multiple of the M tile `bm`, so every bm-row tile belongs to one expert. The number of tiles is
// data-dependent, but its bound max_tiles depends only on (T·k, E, bm): grids are sized by the
// bound and CTAs of tiles past the real count (tile_expert = -1) exit at once. Nothing goes back
// to the host, so a layer is one fixed sequence of launches (CUDA-graph capturable) — except on
// the prefill path of moe_cublas.cu, which reads the tile table back and never runs in a capture.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/env.h"
#include "ops/params.h"

namespace kiln::ops::cuda::moe_detail {

// Decode-sized steps (<= moe_gemv_max_tokens() tokens, cuda_ops.h): moe_decode.cu.
void moe_decode(const MoeParams& p, cudaStream_t s);

inline int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

// Σ_e ceil(c_e / bm) over the nz <= min(E, slots) experts that got tokens is at most
// floor((slots + nz·(bm - 1)) / bm), which is also <= ceil(slots / bm) + E.
inline int64_t max_tiles(int64_t slots, int64_t experts, int64_t bm) {
  const int64_t nz = experts < slots ? experts : slots;
  return (slots + nz * (bm - 1)) / bm;
}

struct AlignedLayout {
  int32_t* sorted_slot;  // [max_tiles * bm]: slot (t * top_k + j) of each padded row; -1 = padding
  int32_t* row_of;       // [slots]: padded row each slot landed in; -1 = expert id out of range
  int32_t* tile_expert;  // [max_tiles]: expert owning each bm-row tile; -1 past the real tiles
  int64_t max_tiles, bm;
};

// Builds `l` from topk_ids [slots] on the device: a counting kernel and a scatter kernel (PDL).
void moe_align(const int32_t* topk_ids, int64_t slots, int64_t experts, const AlignedLayout& l, cudaStream_t s);

// Gate/up GEMM with SwiGLU in the epilogue:
//   act[r, j] = silu(x[tok(r)] · Wg[e(r), j]) · (x[tok(r)] · Wu[e(r), j]),  tok(r) = sorted_slot[r] / top_k
// x arrives pre-split, x ≈ x_hi + x_lo (both bf16), and act leaves split the same way: the down GEMM
// consumes exactly the two bf16 parts it would have split an f32 act into, at the same 4 bytes per
// value as f32, so no precision is lost against an f32 act and its operand loads are plain copies.
// split false (bf16 activations): x and act are the hi parts alone.
struct GateUpArgs {
  const __nv_bfloat16* x_split;  // [2][num_tokens][hidden_pad]: hi rows, then lo rows; pad columns 0
  int64_t num_tokens, hidden, hidden_pad, top_k;
  const __nv_bfloat16* w_gate_up;  // [E, 2 * inter, hidden]: gate rows then up rows
  int64_t inter, inter_pad;
  __nv_bfloat16* act_split;  // [2][max_tiles * bm][inter_pad]: hi rows, then lo rows; pad columns 0
  bool split;
};

// Down GEMM: y[r, h] = act[r] · Wd[e(r), h] over every padded row r (padding rows give 0; the wgmma
// kernels leave padding rows of act and y unwritten, as nothing reads them).
struct DownArgs {
  const __nv_bfloat16* act_split;  // [2][max_tiles * bm][inter_pad]
  int64_t inter, inter_pad;
  const __nv_bfloat16* w_down;  // [E, hidden, inter]
  int64_t hidden;
  void* y;  // [max_tiles * bm, hidden]: f32, or bf16 from the wgmma kernels with bf16 activations
  bool split;
};

void moe_gate_up_swiglu(const GateUpArgs& a, const AlignedLayout& l, cudaStream_t s);
void moe_down(const DownArgs& a, const AlignedLayout& l, cudaStream_t s);

// The same two GEMMs on Hopper wgmma (moe_wgmma.cu) for prefill-sized batches: the layout's tiles
// must be 128 rows, hidden and inter multiples of 64 (no pad columns) and the weights 16-byte
// aligned (moe_wgmma_shapes_ok). DownArgs::y is f32 when split, else bf16.
bool moe_wgmma_shapes_ok(int64_t hidden, int64_t inter, const void* w_gate_up, const void* w_down);
void moe_gate_up_swiglu_wgmma(const GateUpArgs& a, const AlignedLayout& l, cudaStream_t s);
void moe_down_wgmma(const DownArgs& a, const AlignedLayout& l, cudaStream_t s);

// Runs `chunk_fn` on consecutive token ranges of p (x, ids, weights, out and add offset to match)
// so that a pass's scratch, fixed_bytes plus per_token_bytes per token, stays under 2 GB
// (KILN_MOE_PASS_BYTES, read per call, so tests can force several passes): Moonlight runs 8k-token
// prefills in one pass, DeepSeek-V3 widths in a few. The KV planner does not see this scratch (it
// is allocated at the first long prompt), hence the bound. Passes are even: no small last one.
template <typename F>
void for_token_chunks(const MoeParams& p, int64_t per_token_bytes, int64_t fixed_bytes, F&& chunk_fn) {
  const int64_t budget = env_int("KILN_MOE_PASS_BYTES", int64_t{2} << 30, 1);
  const int64_t room = fixed_bytes < budget / 2 ? budget - fixed_bytes : budget / 2;
  const int64_t passes = (p.num_tokens * per_token_bytes + room - 1) / room;
  const int64_t chunk = (p.num_tokens + passes - 1) / passes;
  for (int64_t t0 = 0; t0 < p.num_tokens; t0 += chunk) {
    MoeParams c = p;
    c.num_tokens = chunk < p.num_tokens - t0 ? chunk : p.num_tokens - t0;
    c.x = p.x + t0 * p.hidden;
    c.topk_ids = p.topk_ids + t0 * p.top_k;
    c.topk_weights = p.topk_weights + t0 * p.top_k;
    c.out = p.out + t0 * p.hidden;
    if (p.add) c.add = p.add + t0 * p.hidden;
    chunk_fn(c);
  }
}

// The deterministic combine (moe.cu), one CTA per token: out[t, h] = Σ_j w[t, j] · y_j[h] + extra[t, h]
// + add[t, h], j in order, f32 accumulation, y_j = y[row_of[t * top_k + j]] (+ y[row_lo[...]] when
// row_lo is given: moe_cublas.cu's hi and lo halves); row -1 (a dropped slot) adds nothing; extra
// (the shared experts), add (MoeParams::add) and row_lo may be null. y is f32 (the grouped kernels
// with split activations, the split cuBLASLt path) or bf16 (the wgmma and cuBLASLt paths with bf16
// activations: half the bytes read).
void combine(const float* y, const int32_t* row_of, const int32_t* row_lo, const float* w, int64_t T, int64_t top_k,
             int64_t hidden, const float* extra, const float* add, float* out, cudaStream_t s);
void combine(const __nv_bfloat16* y, const int32_t* row_of, const int32_t* row_lo, const float* w, int64_t T,
             int64_t top_k, int64_t hidden, const float* extra, const float* add, float* out, cudaStream_t s);

// Prefill-sized batches outside a capture (moe_cublas.cu): one cuBLASLt GEMM per expert, sized
// on the host. Eligible when the stream is not capturing, the widths are multiples of 64, x is
// 16-byte aligned and the batch has at least KILN_MOE_CUBLAS_MIN_TOKENS tokens.
bool moe_cublas_eligible(const MoeParams& p, cudaStream_t s);
void moe_cublas(const MoeParams& p, Gemm& gemm, cudaStream_t s);

// The shared experts of a prefill-sized batch as one dense SwiGLU MLP (moe.cu), plus p.add when
// set (the down GEMM's C operand): [T, H] in scratch owned here, written on `s` (which may be a
// side stream: read it only after joining) and valid until the next call; null without shared
// experts (p.add then left to the caller). x_parts (may be null): p.x already split
// for the GEMMs as the experts' choice says (Gemm::linear_parts, rows ldx apart), so it is not
// split again. Always on cuBLASLt (no GEMV path): batches of <= 8 tokens come here only when
// KILN_MOE_GEMV_MAX_TOKENS is lowered.
const float* shared_mlp(const MoeParams& p, const __nv_bfloat16* x_parts, int64_t ldx, Gemm& gemm, cudaStream_t s);
// Its scratch per token: out [H] and gate/up [2S] in f32, act [S] and, when it splits x itself
// (own_x: no x_parts), x [H] as bf16 parts (at most 4 bytes a value).
inline int64_t shared_mlp_bytes_per_token(const MoeParams& p, bool own_x) {
  return p.shared_inter > 0 ? 4 * ((own_x ? 2 : 1) * p.hidden + 3 * p.shared_inter) : 0;
}
}  // namespace kiln::ops::cuda::moe_detail
