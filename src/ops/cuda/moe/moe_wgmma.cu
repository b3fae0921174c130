// The two grouped expert GEMMs of prefill-sized batches on Hopper warpgroup MMAs (wgmma, sm_90a):
// the same arguments and layout as the mma.sync kernels of moe_grouped_gemm.cu (moe_internal.cuh),
// with 128-row M tiles (AlignedLayout::bm = 128), so every expert of a batch runs in one launch
// and nothing goes back to the host. Unlike those, they leave the padding rows of act and y
// unwritten, so the two paths' kernels do not mix.
//
// Why: at a 1k-token Moonlight prefill each of the 64 experts gets ~96 rows. One cuBLASLt GEMM per
// expert (moe_cublas.cu) took 1.07 ms per layer for ~1.1 GB of expert weights, ~0.26 ms of HBM
// time, plus a host sync per layer; the mma.sync kernels (moe_grouped_gemm.cu) are bound by
// shared-memory reads at these sizes (every warp reads its own copy of the weight tile through
// ldmatrix). A wgmma reads its shared-memory operands once per warpgroup of 64 rows.
//
// CTA: 256 threads = two warpgroups; tile 128 token rows x 256 weight rows; K in steps of 64 (one
// 128-byte-swizzled panel per operand and stage, wgmma.cuh's layout) through a cp.async ring: 4
// stages of 48 KB, or 3 of 64 KB when split. Two forms of the MMAs (moe_wgmma_tile.cuh):
//  - token-major (full tiles): warpgroup w multiplies tokens 64w..64w+63 (wgmma's A) by the 256
//    weight rows (its B), 4 m64n256k16 wgmmas a step per activation part;
//  - weight-major (tiles of at most Args::weight_major_max real rows): warpgroup w multiplies two
//    blocks of 64 weight rows (A) by the tile's first N tokens (B; N the real rows rounded up to 16),
//    8 m64nNk16 wgmmas a step per part, so padding rows past N cost no tensor work.
//  - gate/up: the 256 weight rows are gate rows j0..j0+127 then up rows I+j0..I+j0+127, laid out so
//    that a thread holds the gate and up values of the same (token, j) in either form: SwiGLU runs
//    in the epilogue and act is written once. A rows are gathered by token (sorted_slot).
//  - down: 256 output columns of hidden; y is f32, or bf16 with bf16 activations (the combine reads
//    either), so the rounded expert output costs half the bytes.
// Split activations (f32 mode): x = x_hi + x_lo. A stage holds both parts' A panels beside one
// weight panel and both multiply it into one f32 accumulator (the sum the mma.sync kernels form per
// fragment), so the weights cross from L2 once for both: a first version that ran the K loop twice
// (hi, then lo) took the f32 MoE layer at 1,024 tokens to 940 us, this one 788 (H200).
//
// Pipeline: at step k every thread waits for its copies of k, one barrier makes everyone's visible,
// the warpgroups issue k's wgmmas and wait for k - 1's, and a second barrier frees k - 1's stage
// for the loads of step k + stages - 1 while k's wgmmas run.
//
// Uneven experts: with random weights, the router gives a 1k-token prefill ~84 tiles for its
// 6,000 rows (0 to 604 rows an expert): 41-48% of the tile rows are padding. Padding rows cost no
// loads (zero-filled A) and no stores. In the token-major form a warpgroup whose 64 rows are all
// padding skips its wgmmas (session 21's changes together, against session 20's kernels: whole
// prefills 5-7% faster at 1k with bf16 activations and 10-11% with f32, 1.9-3.0% at 8k); the
// weight-major form stops at the real rows rounded up to 16. It is not used for full tiles: every
// tile weight-major measured slower at 8k than every tile token-major (-4.1 to -5.5% whole
// prefills in all three precision modes, H200, session 23 run 2). A likely cause, by the
// count and not profiled: at N = 128 its wgmmas read 20% more shared memory per MMA (24 KB a
// k-step of 16 and part against 20: both of a warpgroup's blocks read the tokens).
// The down kernel launches with programmatic dependent launch: its CTAs can take the SMs the
// gate/up kernel's last wave leaves and load their first weight stages before waiting for act (not
// measured apart).
//
// Ceiling at an 8k-token Moonlight prefill (49k routed rows, bf16): gate/up 49k x 2816 x 2048 and
// down 49k x 2048 x 1408 are 850 GFLOP, ~0.95 ms at the H200's measured 893 TFLOP/s; at 1k tokens
// the ~1.1 GB of expert weights, read once, are ~0.26 ms at 4.3 TB/s. Measured (Nsight Compute,
// bf16, clocks unlocked at ~1.75 GHz, session 15): at 8k gate/up 1.05 ms (61% of the SM's
// throughput, issue slots 17% busy) and down 558 us; at 1k 280 and 144 us (DRAM ~60% busy). Before
// the copies lost their per-step address arithmetic: 1.17 ms (54%, issue slots 34%), 599, 299 and
// 148 us. Session 18: the gate/up kernel at 1k with IEEE division in its epilogue 297-301 us, with
// silu_mul's fast division 248-249 (one run's A/B binary; the old kernel measured 277-288 on other
// machines). Measured the same or slower (docs/results.md): a warp-specialised variant (TMA weight
// loads, a producer warpgroup, mbarriers); the next loads issued right after the wgmmas (one
// barrier a step, two stages ahead); weight panels multicast by TMA to two-CTA clusters of one
// expert's row tiles (half the L2 reads, but a cluster barrier a step); L2 prefetches of the weight
// rows 6-12 steps ahead, or 512 B - 2 KB of each row at a time (cp.async.bulk.prefetch); no proxy
// fence before the wgmmas (not correct, and not faster either); padding rows of A reading real rows
// instead of zero-filling (266-269 vs 297-301 us at 1k with IEEE division in the epilogue, 251-252
// vs 248-249 with silu_mul's).
#include <type_traits>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/env.h"
#include "ops/cuda/moe/moe_internal.cuh"
#include "ops/cuda/moe/moe_wgmma_tile.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/wgmma.cuh"

namespace kiln::ops::cuda::moe_detail {
namespace {

using namespace wgmma_tile;

// Tiles of at most this many real rows take the weight-major form (KILN_MOE_WGMMA_WEIGHT_MAJOR_MAX
// overrides it: 0 none, 128 all).
constexpr int kWeightMajorMax = 96;

template <bool kGateUp, bool kSplit>
__global__ void __launch_bounds__(kThreads, 1) expert_gemm_kernel(Args p) {
  using P = Pipe<kSplit>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  // One grid dimension (row tiles can outnumber grid.y's 65,535): column tiles of a row tile are
  // neighbours, so they share its A rows in L2.
  const int64_t col_tiles = (p.n + (kGateUp ? kBN / 2 : kBN) - 1) / (kGateUp ? kBN / 2 : kBN);
  const int64_t tile = blockIdx.x / col_tiles, col_tile = blockIdx.x % col_tiles;
  // The gate/up kernel is launched plainly (everything before it is done), so it may let the down
  // kernel launch at once: the down CTAs can then take SMs as this grid's last wave leaves them.
  if constexpr (kGateUp) pdl_trigger();
  const int e = p.tile_expert[tile];
  if (e < 0) return;  // past the real tiles of the upper-bound grid
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wq = warp % 4;
  // The warpgroup, made warp-uniform for the compiler too (a shuffle from lane 0): the descriptor
  // arithmetic below then stays in uniform registers instead of crossing from ordinary ones before
  // every wgmma.
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
  // gate/up: columns j0.. of act; down: columns n0.. of y.
  const int64_t n0 = col_tile * (kGateUp ? kBN / 2 : kBN);
  // The tile's real rows come first (moe_align pads each expert's last tile at its end).
  const int n_real = __syncthreads_count(tid < kBM && p.sorted_slot[tile * kBM + tid] >= 0);
  const bool weight_major = n_real <= p.weight_major_max;
  const int n_mma = weight_major ? (n_real + 15) / 16 * 16 : kBM;  // token rows the wgmmas read

  // This thread's 16-byte chunk (tid % 8) of A rows tid / 8 + 32 q and weight rows likewise: one
  // swizzled shared offset (rows 32 apart share their swizzle phase), one source pointer per copy
  // advanced by the step, and the A rows' source size (0 for padding rows: zeros, nothing read;
  // gate/up gathers the others by token) fixed for the whole K loop. Rows past n_mma, which no
  // wgmma reads, are not copied at all. Weight rows past n read row n - 1 instead of
  // zero-filling: their products land only in columns past n, which nothing reads. Computing each
  // copy's address, predicate and size per step had cost the issuing warps ~250 instructions a
  // step, between one step's wgmmas and the next (SASS, H200). Padding rows must not read a real
  // row instead: at 256 tokens most of each tile is padding, and all of them reading token 0's
  // row took the MoE layer with split activations to 709 us, against 588 zero-filling (H200,
  // session 15 runs 10 and 11, two machines; session 14's kernel measured 618 on a third).
  const int chunk = tid % 8, row0 = tid / 8;
  const uint32_t smem_off = sw128_offset(row0, chunk);
  const char* a_src[kAChunks];
  uint32_t a_bytes[kAChunks];
  bool a_copy[kAChunks];
#pragma unroll
  for (int q = 0; q < kAChunks; ++q) {
    int64_t row = tile * kBM + row0 + 32 * q;
    const int32_t slot = p.sorted_slot[row];
    a_bytes[q] = slot < 0 ? 0 : 16;
    a_copy[q] = row0 + 32 * q < n_mma;
    if constexpr (kGateUp) row = slot < 0 ? 0 : slot / p.top_k;
    a_src[q] = reinterpret_cast<const char*>(p.a + row * p.lda + chunk * 8);
  }
  const __nv_bfloat16* w_e = p.w + static_cast<int64_t>(e) * p.w_rows * p.K;
  const char* b_src[kBChunks];
#pragma unroll
  for (int q = 0; q < kBChunks; ++q) {
    const int r = row0 + 32 * q;
    int64_t col = n0 + r, wrow;
    if constexpr (kGateUp) col = n0 + r % (kBN / 2);
    col = col < p.n ? col : p.n - 1;
    if constexpr (kGateUp)
      wrow = r < kBN / 2 ? col : p.n + col;  // gate rows, then the matching up rows
    else
      wrow = col;
    b_src[q] = reinterpret_cast<const char*>(w_e + wrow * p.K + chunk * 8);
  }
  const int64_t a_lo_bytes = p.a_lo * 2;

  const int steps = static_cast<int>(p.K / kBK);
  auto stage_addr = [&](int step) { return smem_u32(smem) + (step % P::kStages) * P::kStageBytes + smem_off; };
  auto issue_a = [&](int step) {
    const int64_t k_bytes = static_cast<int64_t>(step) * kBK * 2;
#pragma unroll
    for (int part = 0; part < P::kParts; ++part)
#pragma unroll
      for (int q = 0; q < kAChunks; ++q)
        if (a_copy[q])
          cp_async16_bytes(stage_addr(step) + part * kAPanel + q * 32 * 128,
                           a_src[q] + k_bytes + (part ? a_lo_bytes : 0), a_bytes[q]);
  };
  auto issue_b = [&](int step) {
    const int64_t k_bytes = static_cast<int64_t>(step) * kBK * 2;
    const uint32_t b_s = stage_addr(step) + P::kParts * kAPanel;
#pragma unroll
    for (int q = 0; q < kBChunks; ++q) cp_async16_bytes(b_s + q * 32 * 128, b_src[q] + k_bytes, 16u);
  };
  // One commit group per step (the waits below count steps); a group also completes the copies
  // issued before it uncommitted.
  auto issue = [&](int step) {
    if (step < steps) {
      issue_a(step);
      issue_b(step);
    }
    cp_async_commit();
  };
  if constexpr (kGateUp) {
#pragma unroll
    for (int i = 0; i < P::kStages - 1; ++i) issue(i);
  } else {
    // The first stages' weights are on their way before the wait: constants, as are the layout's
    // tables read above (pdl.cuh: moe_align wrote them before our predecessor, the gate/up GEMM,
    // started). Only act comes from the gate/up kernel. (If every slot was dropped, no CTA of
    // this grid reaches the wait: harmless, as there is nothing to read and nothing after us
    // launches programmatically.)
#pragma unroll
    for (int i = 0; i < P::kStages - 1; ++i)
      if (i < steps) issue_b(i);
    pdl_wait();
#pragma unroll
    for (int i = 0; i < P::kStages - 1; ++i) {
      if (i < steps) issue_a(i);
      cp_async_commit();
    }
  }

  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  const uint32_t x_panel = smem_u32(smem), w_panel = x_panel + P::kParts * kAPanel;
  // The K loop, one copy per form and shape: with a branch around differently shaped wgmmas (or
  // around the wgmmas at all), ptxas fences the accumulators at every step (C7519; the tensor pipe
  // went from 69% to 52% active in the gate/up kernel at 8k tokens, H200). The copies meet at
  // barrier 0 the same number of times a step through different instructions, hence the
  // non-aligned barrier (PTX requires every thread of a CTA to execute the same aligned one). Each
  // copy waits for its wgmmas itself: where the copies meet, ptxas may move accumulators between
  // registers, which must not happen while wgmmas are in flight (C7515: it serialises them all).
  auto k_loop = [&](auto mma_step) {
    for (int step = 0; step < steps; ++step) {
      cp_async_wait<P::kStages - 2>();  // this thread's copies of `step` have landed
      fence_proxy_async_smem();         // ... and are visible to wgmma
      cta_barrier_unaligned();          // everyone's are
      mma_step(static_cast<uint64_t>((step % P::kStages) * P::kStageBytes) >> 4);
      cta_barrier_unaligned();       // ... and in the other warpgroup: its stage is free
      issue(step + P::kStages - 1);  // into step - 1's stage
    }
    wgmma_wait<0>();
    wgmma_fence_regs(acc);
  };
  // Descriptors of stage 0's panels; a stage, part or k-step further adds its byte offset / 16 to
  // the address field (14 bits: shared addresses stay below 256 KB, so nothing carries out).
  // Token-major: this warpgroup's 64 tokens by the 256 weight rows; a warpgroup whose 64 rows are
  // all padding issues nothing (only when KILN_MOE_WGMMA_WEIGHT_MAJOR_MAX < 64 leaves such a tile
  // to this form).
  const uint64_t desc_tok = wgmma_desc_sw128(x_panel + wg * 64 * 128), desc_w256 = wgmma_desc_sw128(w_panel);
  auto token_major = [&](uint64_t stage) {
    wgmma_fence();
#pragma unroll
    for (int part = 0; part < P::kParts; ++part)
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)
        wgmma_m64n256k16_ss(acc, desc_tok + stage + (part * kAPanel + kk * 32) / 16, desc_w256 + stage + kk * 32 / 16);
    wgmma_commit();
    wgmma_wait<1>();  // step - 1's wgmmas are done in this warpgroup
  };
  // Weight-major: blocks of 64 weight rows (gate/up: this warpgroup's gate rows, then the same j's
  // up rows; down: its 128 output columns) by the tile's first N tokens.
  const uint64_t desc_x = wgmma_desc_sw128(x_panel);
  const uint64_t desc_wb[2] = {wgmma_desc_sw128(w_panel + (kGateUp ? 64 * wg : 128 * wg) * 128),
                               wgmma_desc_sw128(w_panel + (kGateUp ? 128 + 64 * wg : 128 * wg + 64) * 128)};
  auto weight_major_step = [&](auto n_tokens) {
    return [&](uint64_t stage) {
      constexpr int N = decltype(n_tokens)::value;
      wgmma_fence();
#pragma unroll
      for (int part = 0; part < P::kParts; ++part)
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          const uint64_t x = desc_x + stage + (part * kAPanel + kk * 32) / 16;
          wgmma_m64nk16_ss<N, 0>(acc, desc_wb[0] + stage + kk * 32 / 16, x);
          wgmma_m64nk16_ss<N, 64>(acc, desc_wb[1] + stage + kk * 32 / 16, x);
        }
      wgmma_commit();
      wgmma_wait<1>();
    };
  };
  if (!weight_major) {
    const bool wg_rows = __shfl_sync(0xffffffffu, wg * 64 < n_real ? 1 : 0, 0) != 0;
    if (wg_rows)
      k_loop(token_major);
    else
      k_loop([](uint64_t) {});
    store_token_major<kGateUp, kSplit>(p, acc, tile, n_real, n0, wg, wq, lane, smem);
    return;
  }
  switch (n_mma / 16) {  // moe_align gives every real tile at least one row
    case 1: k_loop(weight_major_step(std::integral_constant<int, 16>{})); break;
    case 2: k_loop(weight_major_step(std::integral_constant<int, 32>{})); break;
    case 3: k_loop(weight_major_step(std::integral_constant<int, 48>{})); break;
    case 4: k_loop(weight_major_step(std::integral_constant<int, 64>{})); break;
    case 5: k_loop(weight_major_step(std::integral_constant<int, 80>{})); break;
    case 6: k_loop(weight_major_step(std::integral_constant<int, 96>{})); break;
    case 7: k_loop(weight_major_step(std::integral_constant<int, 112>{})); break;
    case 8: k_loop(weight_major_step(std::integral_constant<int, 128>{})); break;
    default: __trap();
  }
  store_weight_major<kGateUp, kSplit>(p, acc, tile, n_real, n0, wg, wq, lane, smem);
}

bool widths_ok(int64_t hidden, int64_t inter) {
  return hidden % kBK == 0 && inter % kBK == 0;
}

template <bool kGateUp, bool kSplit>
void launch_split(const Args& a, const AlignedLayout& l, cudaStream_t s) {
  constexpr size_t smem = Pipe<kSplit>::kSmemBytes;
  static SmemGrants smem_done;
  allow_smem(expert_gemm_kernel<kGateUp, kSplit>, static_cast<int>(smem), smem_done);
  const int64_t ctas = int64_t{blocks_for(a.n, kGateUp ? kBN / 2 : kBN)} * l.max_tiles;
  KILN_REQUIRE(ctas < (int64_t{1} << 31), "moe wgmma: " + std::to_string(ctas) + " tiles exceed the grid");
  const dim3 grid(static_cast<unsigned>(ctas));
  if constexpr (kGateUp)
    expert_gemm_kernel<kGateUp, kSplit><<<grid, kThreads, smem, s>>>(a);
  else  // may start in the gate/up kernel's tail (it waits before reading act)
    launch_pdl(expert_gemm_kernel<kGateUp, kSplit>, grid, dim3(kThreads), smem, s, a);
}

template <bool kGateUp>
void launch(Args a, const AlignedLayout& l, bool split, cudaStream_t s) {
  KILN_REQUIRE(l.bm == kBM, "moe wgmma: the layout's tiles must be 128 rows");
  // Read per call, so that one process (a test) can run both forms.
  a.weight_major_max = static_cast<int>(env_int("KILN_MOE_WGMMA_WEIGHT_MAJOR_MAX", kWeightMajorMax, 0, kBM));
  if (split)
    launch_split<kGateUp, true>(a, l, s);
  else
    launch_split<kGateUp, false>(a, l, s);
}

}  // namespace

bool moe_wgmma_shapes_ok(int64_t hidden, int64_t inter, const void* w_gate_up, const void* w_down) {
  return widths_ok(hidden, inter) && aligned16(w_gate_up) && aligned16(w_down);
}

void moe_gate_up_swiglu_wgmma(const GateUpArgs& g, const AlignedLayout& l, cudaStream_t s) {
  KILN_REQUIRE(
      g.hidden_pad == g.hidden && g.inter_pad == g.inter && widths_ok(g.hidden, g.inter) && aligned16(g.w_gate_up),
      "moe wgmma: widths must be multiples of 64 and weights 16-byte aligned");
  const Args a{.a = g.x_split,
               .a_lo = g.num_tokens * g.hidden_pad,
               .lda = g.hidden_pad,
               .sorted_slot = l.sorted_slot,
               .top_k = g.top_k,
               .tile_expert = l.tile_expert,
               .w = g.w_gate_up,
               .w_rows = 2 * g.inter,
               .K = g.hidden,
               .n = g.inter,
               .act = g.act_split,
               .act_lo = l.max_tiles * l.bm * g.inter_pad,
               .ldo = g.inter_pad,
               .y = nullptr};
  launch<true>(a, l, g.split, s);
}

void moe_down_wgmma(const DownArgs& d, const AlignedLayout& l, cudaStream_t s) {
  KILN_REQUIRE(d.inter_pad == d.inter && widths_ok(d.hidden, d.inter) && aligned16(d.w_down),
               "moe wgmma: widths must be multiples of 64 and weights 16-byte aligned");
  const Args a{.a = d.act_split,
               .a_lo = l.max_tiles * l.bm * d.inter_pad,
               .lda = d.inter_pad,
               .sorted_slot = l.sorted_slot,
               .top_k = 1,
               .tile_expert = l.tile_expert,
               .w = d.w_down,
               .w_rows = d.hidden,
               .K = d.inter,
               .n = d.hidden,
               .act = nullptr,
               .act_lo = 0,
               .ldo = 0,
               .y = d.y};
  launch<false>(a, l, d.split, s);
}

}  // namespace kiln::ops::cuda::moe_detail
