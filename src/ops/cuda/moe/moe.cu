// Routed (and shared) experts on the GPU.
//  - Few tokens (decode): moe_decode.cu, two GEMV launches for routed and shared experts.
//  - More: slots sorted by expert into M-tile-aligned groups on the device (moe_align.cu), then two
//    grouped tensor-core GEMMs (moe_grouped_gemm.cu): gate/up with SwiGLU fused, then down; each
//    expert's weights are read once per column block, however many tokens chose it. No host round
//    trip, so captured decode steps of any batch take this path.
//  - Prefill-sized batches (>= KILN_MOE_WGMMA_MIN_TOKENS, widths multiples of 64): the same
//    layout with 128-row tiles on Hopper wgmma kernels (moe_wgmma.cu), SwiGLU fused, no host sync.
//  - One cuBLASLt GEMM per expert (moe_cublas.cu; uncaptured, the expert sizes read back once per
//    layer): what prefill used before the wgmma kernels. The shapes it takes are a subset of theirs,
//    so it runs only when KILN_MOE_WGMMA_MIN_TOKENS is raised past the step: kept as the measured
//    baseline for A/Bs (docs/results.md), not on a default path.
// Both expert kinds multiply activations as Gemm::split_expert_activations says (hi/lo split or
// rounded to bf16: --expert-activation-dtype, by default --activation-dtype's choice).
// The shared experts run as one dense MLP (or inside the decode GEMVs; on the grouped paths on a
// side stream, beside the expert sort and the routed GEMMs) and join in the deterministic
// combine: out[t] = Σ_j w[t,j] · y[row(t,j)] + shared[t] (+ add[t]), j in order; with shared
// experts the add is already in shared[t] (their down GEMM's addend).
// Weights must be bf16 (the CUDA backend's weight dtype).
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/env.h"
#include "ops/cuda/moe/moe_internal.cuh"
#include "ops/cuda/quant/quant_ops.h"

namespace kiln::ops::cuda {
namespace {

// moe_detail::combine (moe_internal.cuh); row -1 is a dropped slot whose expert id was out of range.
// Each thread sums V adjacent columns (16-byte loads of y, extra, add and out; V = 1 for odd widths
// or unaligned pointers), every column in the same order and with the same operations as V = 1.
template <typename Y, int V>
__global__ void combine_kernel(const Y* y, const int32_t* row_of, const int32_t* row_lo, const float* w, int64_t top_k,
                               int64_t hidden, const float* extra, const float* add, float* out) {
  const int64_t t = blockIdx.x;
  for (int64_t h = threadIdx.x * int64_t{V}; h < hidden; h += blockDim.x * int64_t{V}) {
    float acc[V] = {};
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t row = row_of[t * top_k + j];
      if (row < 0) continue;
      const float wj = w[t * top_k + j];
      float v[V];
      load_vec(y + row * hidden + h, v);
      if (row_lo) {
        float lo[V];
        load_vec(y + static_cast<int64_t>(row_lo[t * top_k + j]) * hidden + h, lo);
#pragma unroll
        for (int i = 0; i < V; ++i) v[i] += lo[i];
      }
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] += wj * v[i];
    }
    float e[V];
    if (extra) {
      load_vec(extra + t * hidden + h, e);
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] += e[i];
    }
    if (add) {
      load_vec(add + t * hidden + h, e);
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] += e[i];
    }
    store_vec(out + t * hidden + h, acc);
  }
}

template <typename Y>
void launch_combine(const Y* y, const int32_t* row_of, const int32_t* row_lo, const float* w, int64_t T, int64_t top_k,
                    int64_t hidden, const float* extra, const float* add, float* out, cudaStream_t s) {
  if (T <= 0) return;
  constexpr int V = 16 / sizeof(Y);  // one 16-byte load of y per step
  const auto grid = static_cast<unsigned>(T);
  if (hidden % V == 0 && aligned16(y) && aligned16(out) && (!extra || aligned16(extra)) && (!add || aligned16(add)))
    combine_kernel<Y, V><<<grid, row_threads(hidden / V), 0, s>>>(y, row_of, row_lo, w, top_k, hidden, extra, add, out);
  else
    combine_kernel<Y, 1><<<grid, row_threads(hidden), 0, s>>>(y, row_of, row_lo, w, top_k, hidden, extra, add, out);
}

// M tile per launch shape: small tiles while the expected rows per expert are few (decode batches:
// the step is bound by reading the chosen experts' weights, padding rows only cost compute), 64 rows
// once experts fill them (prefill: tensor-core bound, larger tiles re-read less of A and W).
int64_t choose_bm(int64_t slots, int64_t experts) {
  // A 128-row tile (4 x 2 warps) measured no faster than 64 rows on 8k-token prefills (H200).
  // 32-row tiles from 13 or from 1 row per expert (so that batches of 128-256 read each expert
  // once) measured slower at 128 and 256 streams (session 10: 6,600 vs 6,868-6,998 tok/s at 128).
  const int64_t per_expert = (slots + experts - 1) / experts;
  return per_expert <= 24 ? 16 : per_expert <= 64 ? 32 : 64;
}

// wgmma: the Hopper kernels with 128-row tiles (moe_wgmma.cu), for prefill-sized batches.
void moe_grouped(const MoeParams& p, Gemm& gemm, bool wgmma, cudaStream_t s) {
  using namespace moe_detail;
  const int64_t T = p.num_tokens, k = p.top_k, E = p.num_experts, I = p.inter, H = p.hidden, slots = T * k;
  const int64_t bm = wgmma ? 128 : choose_bm(slots, E), tiles = max_tiles(slots, E, bm), rows = tiles * bm;
  const int64_t H_pad = round_up(H, 8), I_pad = round_up(I, 8);
  KILN_REQUIRE(rows < (int64_t{1} << 31), "moe: " + std::to_string(slots) + " routed slots overflow the row index");
  static GrowOnlyScratch idx_buf, x_buf, act_buf, y_buf;
  int32_t* idx = idx_buf.get<int32_t>(static_cast<size_t>(rows + slots + tiles));
  const AlignedLayout layout{idx, idx + rows, idx + rows + slots, tiles, bm};
  const bool split = gemm.split_expert_activations();
  const int64_t parts = split ? 2 : 1;  // activation parts (hi, lo)
  const bool y_bf16 = wgmma && !split;  // the wgmma down GEMM rounds y to bf16 with bf16 activations
  auto* xs = x_buf.get<__nv_bfloat16>(static_cast<size_t>(parts * T * H_pad));           // [parts][T][H_pad]
  auto* act = act_buf.get<__nv_bfloat16>(static_cast<size_t>(parts * rows * I_pad));     // [parts][rows][I_pad]
  auto* y = y_buf.get<unsigned char>(static_cast<size_t>(rows * H * (y_bf16 ? 2 : 4)));  // [rows, H]
  const auto* wgu = static_cast<const __nv_bfloat16*>(p.w_gate_up);
  const auto* wd = static_cast<const __nv_bfloat16*>(p.w_down);

  // x split once per layer (pad columns 0), so the gate/up GEMM gathers rows of both parts with
  // plain 16-byte copies: each token is read by k experts and by every column block.
  split_bf16(p.x, H, 0, xs, T, H, H_pad, 1, split, s);
  // The shared experts need nothing of the routing: they run on a side stream beside the expert
  // sort and the routed GEMMs, whose small kernels and last waves leave SMs idle. A throw on the
  // way (a launcher's shape check) joins the side stream too, so that a capture under way ends
  // with every stream joined.
  struct JoinOnThrow {
    Gemm& gemm;
    cudaStream_t s;
    bool armed = false;
    ~JoinOnThrow() {
      if (armed) gemm.join_quietly(s);
    }
  } join_on_throw{gemm, s};
  const bool beside = p.shared_inter > 0 && moe_shared_beside();
  const float* shared = nullptr;  // [T, H], p.add included
  if (beside) {
    const cudaStream_t side = gemm.fork(s);
    join_on_throw.armed = true;
    shared = shared_mlp(p, xs, H_pad, gemm, side);
  }
  moe_align(p.topk_ids, slots, E, layout, s);
  const GateUpArgs gate_up{xs, T, H, H_pad, k, wgu, I, I_pad, act, split};
  const DownArgs down{act, I, I_pad, wd, H, y, split};
  if (wgmma) {
    moe_gate_up_swiglu_wgmma(gate_up, layout, s);
    moe_down_wgmma(down, layout, s);
  } else {
    moe_gate_up_swiglu(gate_up, layout, s);
    moe_down(down, layout, s);
  }
  if (beside) {
    gemm.join(s);
    join_on_throw.armed = false;  // after the join: a throw inside it still joins quietly
  } else {
    shared = shared_mlp(p, xs, H_pad, gemm, s);
  }
  const float* add = shared ? nullptr : p.add;
  if (y_bf16)
    combine(reinterpret_cast<const __nv_bfloat16*>(y), layout.row_of, nullptr, p.topk_weights, T, k, H, shared, add,
            p.out, s);
  else
    combine(reinterpret_cast<const float*>(y), layout.row_of, nullptr, p.topk_weights, T, k, H, shared, add, p.out, s);
}

bool wgmma_eligible(const MoeParams& p) {
  return p.num_tokens >= moe_wgmma_min_tokens() &&
         moe_detail::moe_wgmma_shapes_ok(p.hidden, p.inter, p.w_gate_up, p.w_down);
}

void moe_wgmma(const MoeParams& p, Gemm& gemm, cudaStream_t s) {
  // Scratch (moe_grouped): per token the x parts, the shared MLP's and k routed rows of act parts,
  // y (f32 split, else bf16) and the layout's indices; fixed, up to 127 padding rows per expert.
  const int64_t parts = gemm.split_expert_activations() ? 2 : 1, y_bytes = parts == 2 ? 4 : 2;
  const int64_t per_row = parts * 2 * p.inter + y_bytes * p.hidden + 4;
  const int64_t per_token =
      parts * 2 * p.hidden + p.top_k * (per_row + 8) + moe_detail::shared_mlp_bytes_per_token(p, false);
  moe_detail::for_token_chunks(p, per_token, p.num_experts * 127 * per_row,
                               [&](const MoeParams& c) { moe_grouped(c, gemm, true, s); });
}

}  // namespace

const float* moe_detail::shared_mlp(const MoeParams& p, const __nv_bfloat16* x_parts, int64_t ldx, Gemm& gemm,
                                    cudaStream_t s) {
  if (p.shared_inter <= 0) return nullptr;
  static GrowOnlyScratch x_buf, gu_buf, act_buf, out_buf;
  // The experts' activation choice, the routed experts' too (Gemm::split_expert_activations).
  const bool split = gemm.split_expert_activations();
  const int64_t T = p.num_tokens, S = p.shared_inter, H = p.hidden, parts = split ? 2 : 1;
  float* out = out_buf.get<float>(static_cast<size_t>(T * H));
  float* gu = gu_buf.get<float>(static_cast<size_t>(T * 2 * S));
  auto* act = act_buf.get<__nv_bfloat16>(static_cast<size_t>(parts * T * S));  // [parts][T][S]
  if (!x_parts) {  // the cuBLASLt path gathers its own rows per expert
    ldx = round_up(H, 8);
    auto* xs = x_buf.get<__nv_bfloat16>(static_cast<size_t>(parts * T * ldx));  // [parts][T][ldx]
    split_bf16(p.x, H, 0, xs, T, H, ldx, 1, split, s);
    x_parts = xs;
  }
  gemm.linear_parts(x_parts, ldx, p.w_shared_gate_up, gu, 0, T, 2 * S, H, nullptr, split, s);
  swiglu({gu, nullptr, T, S}, BfParts::stacked(act, T, S, split), s);  // written as the down GEMM's parts
  // The residual rides along as the GEMM's addend: one stream fewer for the combine to read.
  gemm.linear_parts(act, S, p.w_shared_down, out, 0, T, H, S, p.add, split, s);
  return out;
}

void moe_detail::combine(const float* y, const int32_t* row_of, const int32_t* row_lo, const float* w, int64_t T,
                         int64_t top_k, int64_t hidden, const float* extra, const float* add, float* out,
                         cudaStream_t s) {
  launch_combine(y, row_of, row_lo, w, T, top_k, hidden, extra, add, out, s);
}

void moe_detail::combine(const __nv_bfloat16* y, const int32_t* row_of, const int32_t* row_lo, const float* w,
                         int64_t T, int64_t top_k, int64_t hidden, const float* extra, const float* add, float* out,
                         cudaStream_t s) {
  launch_combine(y, row_of, row_lo, w, T, top_k, hidden, extra, add, out, s);
}

bool moe_shared_beside() {
  // Read per call, so a test can compare both orders in one process.
  return env_int("KILN_MOE_SHARED_BESIDE", 1, 0, 1) != 0;
}

int64_t moe_wgmma_min_tokens() {
  // Read per call, so tests and benchmarks can move it (a huge value turns the path off).
  return env_int("KILN_MOE_WGMMA_MIN_TOKENS", 256, 0);
}

void moe(const MoeParams& p, Gemm& gemm, cudaStream_t s) {
  if (p.num_tokens == 0) return;
  KILN_REQUIRE(p.top_k > 0 && p.num_experts > 0, "moe: needs top_k >= 1 and at least one expert");
  if (moe_quantized(p)) return quant_moe(p, gemm, s);  // quant/quant_moe.cu (bf16 copies come back here)
  KILN_REQUIRE(p.w_dtype == DType::BF16,
               std::string("moe on CUDA: expert weights must be bf16, got ") + dtype_name(p.w_dtype));
  KILN_REQUIRE(p.shared_inter == 0 || (p.w_shared_gate_up && p.w_shared_down), "moe: shared experts need both weights");
  if (p.num_tokens <= moe_gemv_max_tokens())
    moe_detail::moe_decode(p, s);
  else if (wgmma_eligible(p))
    moe_wgmma(p, gemm, s);
  else if (moe_detail::moe_cublas_eligible(p, s))
    moe_detail::moe_cublas(p, gemm, s);
  else
    moe_grouped(p, gemm, false, s);
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kiln::ops::cuda
