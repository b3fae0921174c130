// Routed experts of a prefill-sized batch through cuBLASLt, one GEMM per expert. Since session 8
// the wgmma kernels (moe_wgmma.cu) take every shape this path takes, so it runs only when
// KILN_MOE_WGMMA_MIN_TOKENS is raised past the step: the baseline they are measured against.
//
// The grouped mma.sync kernels (moe_grouped_gemm.cu) never leave the device, so they serve every
// captured decode step; but on an 8k-token prefill they reach ~210 TFLOP/s of tensor work, a
// quarter of what cuBLASLt sustains on the same H200. Outside a capture the expert sizes can come
// back to the host (the tile -> expert table, one stream sync per layer and token chunk), and then
// every expert is one plain cuBLASLt GEMM, run four at a time on side streams (Gemm::grouped).
// Measured on H200 (Moonlight, docs/results.md): the MoE of an 8k prefill 10.4 -> 3.8 ms per layer.
//
// Precision is the experts' choice (Gemm::split_expert_activations; gemm.cu): f32 activations
// split into bf16 hi + lo parts, or rounded once. Split, each expert's rows are laid out
// "doubled": its hi rows, then its lo rows, so one GEMM reads the expert's weights once for both
// parts, and the kernels after it add the two halves.
//   padded row r of expert e (rows [s_e, s_e + n_e) of the aligned layout, moe_internal.cuh):
//   hi part at doubled row s_e + r, lo part at s_e + n_e + r (expert e owns [2 s_e, 2 s_e + 2 n_e)).
// With split activations off rows are not doubled: padded row r holds the bf16-rounded activation,
// every GEMM has half the rows, and the combine reads row_of as is. Both GEMMs then store bf16 too
// (f32 accumulation, rounded once on the store, as vLLM and SGLang keep expert outputs): gate/up is
// read only to be rounded into a bf16 act anyway, and y in bf16 costs one more 2^-9 rounding per
// routed value but halves the combine's reads. At an 8k Moonlight prefill that is ~1 GB less
// traffic per layer (gate/up 49k x 2816 and y 49k x 2048, each written and read once, at 2 bytes
// instead of 4). The glue passes move 16 bytes per access (the widths here are multiples of 64; an
// unaligned x takes a scalar gather) and give the bits scalar ones do.
#include <algorithm>
#include <vector>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/env.h"
#include "ops/cuda/moe/moe_internal.cuh"

namespace kiln::ops::cuda::moe_detail {
namespace {

constexpr int64_t kBm = 64;  // expert rows padded to this (keeps few distinct GEMM shapes)

// Doubled-layout rows (hi, lo) of padded row r; e < 0 past the real tiles. tile_expert is sorted
// by expert with -1 after the real tiles, so e's span is found by two binary searches. Unsplit:
// hi = r, lo = -1.
struct DoubledRow {
  int64_t hi, lo;
  int e;
};
__device__ DoubledRow doubled_row(const int32_t* tile_expert, int64_t max_tiles, int64_t r, bool split) {
  const int64_t t = r / kBm;
  const int e = tile_expert[t];
  if (e < 0) return {0, 0, -1};
  if (!split) return {r, -1, e};
  int64_t lo = 0, hi = t;  // first tile of e in [0, t]
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (tile_expert[mid] < e)
      lo = mid + 1;
    else
      hi = mid;
  }
  const int64_t first = lo;
  lo = t + 1, hi = max_tiles;  // first tile past e in (t, max_tiles]
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (tile_expert[mid] == e)
      lo = mid + 1;
    else
      hi = mid;
  }
  const int64_t s = first * kBm, n = (lo - first) * kBm;
  return {s + r, s + n + r, e};
}

// grid: one CTA per padded row r. x2[hi], x2[lo] = bf16 hi/lo parts of x[token(r)] ([cols];
// padding rows 0); unsplit, x2[r] = x[token(r)] rounded. V columns per thread (load_vec).
template <int V>
__global__ void gather_split_kernel(const float* x, const int32_t* sorted_slot, const int32_t* tile_expert,
                                    int64_t max_tiles, int64_t top_k, int64_t cols, bool split, __nv_bfloat16* x2) {
  const int64_t r = blockIdx.x;
  const DoubledRow d = doubled_row(tile_expert, max_tiles, r, split);
  if (d.e < 0) return;
  const int32_t slot = sorted_slot[r];
  const float* src = slot < 0 ? nullptr : x + (slot / top_k) * cols;
  for (int64_t c = threadIdx.x * int64_t{V}; c < cols; c += blockDim.x * int64_t{V}) {
    float v[V] = {};
    if (src) load_vec(src + c, v);
    store_parts_vec(x2 + d.hi * cols + c, split ? (d.lo - d.hi) * cols : 0, v);
  }
}

// grid: one CTA per padded row. gu [doubled rows, 2I] f32 (gate ‖ up, hi and lo products) ->
// act2 [doubled rows, I] bf16: silu(g)·u split into hi/lo parts again for the down GEMM.
__global__ void swiglu_split_kernel(const float* gu, const int32_t* tile_expert, int64_t max_tiles, int64_t inter,
                                    __nv_bfloat16* act2) {
  const int64_t r = blockIdx.x;
  const DoubledRow d = doubled_row(tile_expert, max_tiles, r, true);
  if (d.e < 0) return;
  const float* ghi = gu + d.hi * 2 * inter;
  const float* glo = gu + d.lo * 2 * inter;
  for (int64_t j = threadIdx.x; j < inter; j += blockDim.x) {
    const float g = ghi[j] + glo[j], u = ghi[inter + j] + glo[inter + j];
    const float v = silu_mul(g, u);
    store_bf16_parts(v, act2 + d.hi * inter + j, act2 + d.lo * inter + j);
  }
}

// Unsplit: gu [rows, 2I] bf16 (the GEMM's rounded products) -> act [rows, I] bf16, the same
// silu(g)·u in f32 rounded once; V columns per thread.
template <int V>
__global__ void swiglu_bf16_kernel(const __nv_bfloat16* gu, const int32_t* tile_expert, int64_t inter,
                                   __nv_bfloat16* act) {
  const int64_t r = blockIdx.x;
  if (tile_expert[r / kBm] < 0) return;
  const __nv_bfloat16* row = gu + r * 2 * inter;
  for (int64_t j = threadIdx.x * int64_t{V}; j < inter; j += blockDim.x * int64_t{V}) {
    float g[V], u[V];
    load_vec(row + j, g);
    load_vec(row + inter + j, u);
    __nv_bfloat16 a[V];
#pragma unroll
    for (int i = 0; i < V; ++i) a[i] = __float2bfloat16(silu_mul(g[i], u[i]));
    store_vec(act + r * inter + j, a);
  }
}

// Slot -> doubled rows of its down output (-1: dropped slot).
__global__ void slot_rows_kernel(const int32_t* row_of, const int32_t* tile_expert, int64_t max_tiles, int64_t slots,
                                 int32_t* row_hi, int32_t* row_lo) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= slots) return;
  const int32_t r = row_of[i];
  if (r < 0) {
    row_hi[i] = row_lo[i] = -1;
    return;
  }
  const DoubledRow d = doubled_row(tile_expert, max_tiles, r, true);
  row_hi[i] = static_cast<int32_t>(d.hi);
  row_lo[i] = static_cast<int32_t>(d.lo);
}

// Bytes of one value the GEMMs store: f32 products to be summed (split), else bf16.
int64_t out_bytes(bool split) {
  return split ? 4 : 2;
}

void moe_cublas_chunk(const MoeParams& p, Gemm& gemm, cudaStream_t s) {
  const int64_t T = p.num_tokens, k = p.top_k, E = p.num_experts, I = p.inter, H = p.hidden, slots = T * k;
  const int64_t tiles = max_tiles(slots, E, kBm), rows = tiles * kBm;
  const bool split = gemm.split_expert_activations();
  const int64_t parts = split ? 2 : 1;  // rows per padded row in the GEMMs
  const int64_t ob = out_bytes(split);
  KILN_REQUIRE(2 * rows < (int64_t{1} << 31), "moe: " + std::to_string(slots) + " routed slots overflow the row index");
  static GrowOnlyScratch idx_buf, in_buf, out_buf;
  int32_t* idx = idx_buf.get<int32_t>(static_cast<size_t>(rows + 3 * slots + tiles));
  const AlignedLayout layout{idx, idx + rows, idx + rows + slots, tiles, kBm};
  int32_t* row_hi = idx + rows + slots + tiles;
  int32_t* row_lo = row_hi + slots;
  // x2 [2 rows, H] then act2 [2 rows, I] (bf16); gu [2 rows, 2I] then y2 [2 rows, H] (f32); unsplit
  // one row each, gu and y bf16.
  auto* in2 = in_buf.get<__nv_bfloat16>(static_cast<size_t>(parts * rows * std::max(H, I)));
  char* out2 = out_buf.get<char>(static_cast<size_t>(parts * rows * std::max(2 * I, H) * ob));

  moe_align(p.topk_ids, slots, E, layout, s);
  static std::vector<int32_t> host_tiles;
  host_tiles.resize(static_cast<size_t>(tiles));
  KILN_CUDA_CHECK(cudaMemcpyAsync(host_tiles.data(), layout.tile_expert, static_cast<size_t>(tiles) * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, s));
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  // Each expert's span of padded rows [s_e, s_e + n_e), from its run of tiles.
  std::vector<std::pair<int32_t, int64_t>> spans;  // (expert, first tile), in tile order
  int64_t used = 0;
  for (; used < tiles && host_tiles[static_cast<size_t>(used)] >= 0; ++used)
    if (spans.empty() || spans.back().first != host_tiles[static_cast<size_t>(used)])
      spans.emplace_back(host_tiles[static_cast<size_t>(used)], used);
  const int64_t real_rows = used * kBm;  // 0 when every id is out of range: no routed rows at all

  const auto* wgu = static_cast<const __nv_bfloat16*>(p.w_gate_up);
  const auto* wd = static_cast<const __nv_bfloat16*>(p.w_down);
  std::vector<Gemm::Group> gate_up, down;
  for (size_t i = 0; i < spans.size(); ++i) {
    const int64_t e = spans[i].first, t0 = spans[i].second;
    const int64_t t1 = i + 1 < spans.size() ? spans[i + 1].second : used;
    const int64_t s0 = t0 * kBm, n = (t1 - t0) * kBm;
    gate_up.push_back({wgu + e * 2 * I * H, in2 + parts * s0 * H, parts * n, out2 + parts * s0 * 2 * I * ob});
    down.push_back({wd + e * H * I, in2 + parts * s0 * I, parts * n, out2 + parts * s0 * H * ob});
  }
  const DType out_dtype = split ? DType::F32 : DType::BF16;
  auto* out_f32 = reinterpret_cast<float*>(out2);
  auto* out_bf16 = reinterpret_cast<__nv_bfloat16*>(out2);
  if (real_rows > 0) {
    const auto grid = static_cast<unsigned>(real_rows);
    // Widths are multiples of 64 and x is 16-byte aligned here (moe_cublas_eligible); scratch rows
    // start 16-byte aligned: 8 values per access throughout.
    gather_split_kernel<8>
        <<<grid, row_threads(H / 8), 0, s>>>(p.x, layout.sorted_slot, layout.tile_expert, tiles, k, H, split, in2);
    gemm.grouped(gate_up.data(), static_cast<int64_t>(gate_up.size()), 2 * I, H, H, 2 * I, s, out_dtype);
    if (split)
      swiglu_split_kernel<<<grid, 256, 0, s>>>(out_f32, layout.tile_expert, tiles, I, in2);
    else
      swiglu_bf16_kernel<8><<<grid, row_threads(I / 8), 0, s>>>(out_bf16, layout.tile_expert, I, in2);
    gemm.grouped(down.data(), static_cast<int64_t>(down.size()), H, I, I, H, s, out_dtype);
  }
  const float* shared = shared_mlp(p, nullptr, 0, gemm, s);  // p.add included
  const float* add = shared ? nullptr : p.add;
  if (!split) {  // padded row r is row r of y: the aligned layout's row_of as is
    combine(out_bf16, layout.row_of, nullptr, p.topk_weights, T, k, H, shared, add, p.out, s);
    return;
  }
  slot_rows_kernel<<<blocks_for(slots, 256), 256, 0, s>>>(layout.row_of, layout.tile_expert, tiles, slots, row_hi,
                                                          row_lo);
  combine(out_f32, row_hi, row_lo, p.topk_weights, T, k, H, shared, add, p.out, s);
}

}  // namespace

bool moe_cublas_eligible(const MoeParams& p, cudaStream_t s) {
  if (p.num_tokens < moe_cublas_min_tokens()) return false;
  // Every operand of every expert GEMM 256-byte aligned, as cuBLASLt's heuristics assume by default
  // (real widths are multiples of 64; odd test sizes take the grouped kernels), and x 16-byte
  // aligned for the vectorised gather (always, from the allocator).
  if (p.hidden % 64 || p.inter % 64 || !aligned16(p.x)) return false;
  for (const void* w : {p.w_gate_up, p.w_down})
    if (reinterpret_cast<uintptr_t>(w) % 256) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(s, &status));
  return status == cudaStreamCaptureStatusNone;  // the expert sizes come back to the host
}

void moe_cublas(const MoeParams& p, Gemm& gemm, cudaStream_t s) {
  // Scratch bytes per row: x2/act2 (bf16) and gu/y2 (out_bytes), doubled when split; per token k
  // rows, the shared MLP's and the indices; fixed, up to 63 padding rows per expert.
  const bool split = gemm.split_expert_activations();
  const int64_t parts = split ? 2 : 1;
  const int64_t per_row =
      parts * (2 * std::max(p.hidden, p.inter) + out_bytes(split) * std::max(2 * p.inter, p.hidden));
  const int64_t per_token = p.top_k * (per_row + 16) + shared_mlp_bytes_per_token(p, true);
  for_token_chunks(p, per_token, p.num_experts * (kBm - 1) * per_row,
                   [&](const MoeParams& c) { moe_cublas_chunk(c, gemm, s); });
}

}  // namespace kiln::ops::cuda::moe_detail

namespace kiln::ops::cuda {

int64_t moe_cublas_min_tokens() {
  // Below this many tokens the grouped mma.sync kernels stay (one expert GEMM per launch is too
  // small to fill the GPU and the host sync costs more than it saves). KILN_MOE_CUBLAS_MIN_TOKENS
  // overrides it (0: always outside a capture; a huge value: never), read per call so tests can
  // reach every path; the wgmma kernels (moe.cu) take prefill-sized batches first.
  return env_int("KILN_MOE_CUBLAS_MIN_TOKENS", 1024, 0);
}

}  // namespace kiln::ops::cuda
