// Routed (and shared) experts over quantized weights. Decode-sized steps (<=
// quant_moe_gemv_max_tokens() tokens) take two launches shaped like moe_decode.cu's, reading the
// quantized rows (FP8 blocks, INT4 groups; shared experts in their own dtype, e.g. bf16 beside INT4
// routed experts) and decoding them in registers:
//  1. gate/up: one warp per activation j of a (slot, expert) or of a (token, shared MLP), its gate
//     and up rows loaded together, SwiGLU applied by the warp;
//  2. down + combine: one CTA per output (token, h), warp w summing slots w, w + 8, ... (the shared
//     row last), the CTA adding the warps' sums in warp order (the same bits on every run), then add.
// More tokens: every expert dequantized to bf16 scratch (a layer's experts at a time), then moe() on
// the bf16 copies: correct, not fast (a grouped GEMM dequantizing its tiles is the fast form).
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/env.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/quant/quant.cuh"
#include "ops/cuda/quant/quant_ops.h"
#include "ops/quant.h"

namespace kiln::ops::cuda {
namespace {

constexpr int kWarps = 8;

struct MoeArgs {
  const float* x;  // [T, H]
  int64_t T, H, I, S, k, E;
  const int32_t* ids;     // [T, k]
  const float* wts;       // [T, k]
  quant::QView gu, dn;    // routed: matrix e = expert e; gate/up [2I, H], down [H, I]
  quant::QView sgu, sdn;  // shared (S > 0): [2S, H], [H, S]
  float* act;             // [T * k, I] routed activations, then [T, S] shared
  float* out;             // [T, H]
  const float* add;       // [T, H] (null: none)
  bool xvec, actvec;      // x / act rows allow 16-byte loads
};

// Warp w: w < T·S shared (t = w / S, j = w % S), else routed w' = w - T·S (j = w' / slots, slot =
// w' % slots: neighbouring warps read the same expert row for different slots, the second from L2).
__global__ void __launch_bounds__(kWarps * 32) quant_gate_up_kernel(MoeArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t shared = a.T * a.S, slots = a.T * a.k, routed = slots * a.I;
  pdl_wait();
  pdl_trigger();
  float acc[2][1] = {};
  if (w < shared) {
    const int64_t t = w / a.S, j = w % a.S;
    const int64_t rows[2] = {j, a.S + j};
    quant::rows_dot<1, 2>(a.sgu, 0, rows, a.x + t * a.H, a.H, 1, a.xvec, lane, acc);
    const float g = warp_sum(acc[0][0]), u = warp_sum(acc[1][0]);
    if (lane == 0) a.act[routed + t * a.S + j] = silu_mul_ieee(g, u);
  } else if (w - shared < routed) {
    const int64_t slot = (w - shared) % slots, j = (w - shared) / slots;
    const int32_t e = a.ids[slot];
    if (e >= 0 && e < a.E) {  // an out-of-range id is a dropped slot: activation 0
      const int64_t rows[2] = {j, a.I + j};
      quant::rows_dot<1, 2>(a.gu, e, rows, a.x + slot / a.k * a.H, a.H, 1, a.xvec, lane, acc);
    }
    const float g = warp_sum(acc[0][0]), u = warp_sum(acc[1][0]);
    if (lane == 0) a.act[slot * a.I + j] = silu_mul_ieee(g, u);
  }
}

// CTA c = h · T + t writes out[t, h] (the tokens of one h side by side: same-expert rows from L2).
__global__ void __launch_bounds__(kWarps * 32) quant_down_kernel(MoeArgs a) {
  __shared__ float part_s[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = blockIdx.x % a.T, h = blockIdx.x / a.T;
  pdl_wait();
  pdl_trigger();
  float sum = 0.0f;  // lane-partial, segments in order
  for (int64_t j = warp; j <= a.k; j += kWarps) {
    float acc[1][1] = {};
    const int64_t rows[1] = {h};
    if (j < a.k) {
      const int64_t slot = t * a.k + j;
      const int32_t e = a.ids[slot];
      if (e < 0 || e >= a.E) continue;  // a dropped slot adds nothing
      quant::rows_dot<1, 1>(a.dn, e, rows, a.act + slot * a.I, a.I, 1, a.actvec, lane, acc);
      sum += a.wts[slot] * acc[0][0];
    } else if (a.S > 0) {
      quant::rows_dot<1, 1>(a.sdn, 0, rows, a.act + a.T * a.k * a.I + t * a.S, a.S, 1, a.actvec, lane, acc);
      sum += acc[0][0];
    }
  }
  sum = warp_sum(sum);
  if (lane == 0) part_s[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float v = 0.0f;
#pragma unroll
    for (int q = 0; q < kWarps; ++q) v += part_s[q];
    const int64_t i = t * a.H + h;
    a.out[i] = a.add ? v + a.add[i] : v;
  }
}

void quant_moe_decode(const MoeParams& p, cudaStream_t s) {
  static GrowOnlyScratch act_buf;
  const int64_t T = p.num_tokens, k = p.top_k, I = p.inter, H = p.hidden, S = p.shared_inter, E = p.num_experts;
  MoeArgs a{};
  a.x = p.x, a.T = T, a.H = H, a.I = I, a.S = S, a.k = k, a.E = E;
  a.ids = p.topk_ids, a.wts = p.topk_weights;
  a.gu = quant::make_view("moe gate/up", p.w_gate_up, p.w_dtype, p.w_gate_up_scales, H,
                          weight_elems(p.w_dtype, 2 * I, H), scale_elems(p.w_gate_up_scales, 2 * I, H));
  a.dn = quant::make_view("moe down", p.w_down, p.w_dtype, p.w_down_scales, I, weight_elems(p.w_dtype, H, I),
                          scale_elems(p.w_down_scales, H, I));
  if (S > 0) {
    a.sgu = quant::make_view("moe shared gate/up", p.w_shared_gate_up, p.shared_dtype(), p.w_shared_gate_up_scales, H,
                             0, 0);
    a.sdn = quant::make_view("moe shared down", p.w_shared_down, p.shared_dtype(), p.w_shared_down_scales, S, 0, 0);
  }
  a.act = act_buf.get<float>(static_cast<size_t>(T * k * I + T * S));
  a.out = p.out, a.add = p.add;
  a.xvec = aligned16(p.x) && H % 4 == 0;
  a.actvec = I % 4 == 0 && S % 4 == 0;  // act rows from a cudaMalloc base
  KILN_REQUIRE(T * H < (int64_t{1} << 31) && T * S + T * k * I < (int64_t{1} << 37),
               "moe decode: " + std::to_string(T) + " tokens of these widths exceed the grid");
  launch_pdl(quant_gate_up_kernel, dim3(blocks_for(T * S + T * k * I, kWarps)), dim3(kWarps * 32), 0, s, a);
  launch_pdl(quant_down_kernel, dim3(static_cast<unsigned>(T * H)), dim3(kWarps * 32), 0, s, a);
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int64_t quant_moe_gemv_max_tokens() {
  // The bf16 path turns to grouped GEMMs past 8 tokens; here the alternative expands every expert
  // to bf16 first, so the GEMVs keep going further. Read per call so tests can cover both paths.
  return env_int("KILN_QUANT_MOE_GEMV_MAX_TOKENS", 64, 0);
}

bool moe_quantized(const MoeParams& p) {
  return quant::is_quantized(p.w_dtype, p.w_gate_up_scales) || quant::is_quantized(p.w_dtype, p.w_down_scales) ||
         (p.shared_inter > 0 &&
          (quant::is_quantized(p.shared_dtype(), p.w_shared_gate_up_scales) ||
           quant::is_quantized(p.shared_dtype(), p.w_shared_down_scales) || p.shared_dtype() != p.w_dtype));
}

void quant_moe(const MoeParams& p, Gemm& gemm, cudaStream_t s) {
  if (p.num_tokens == 0) return;
  KILN_REQUIRE(p.top_k > 0 && p.num_experts > 0 && p.hidden > 0 && p.inter > 0,
               "moe: needs top_k >= 1, at least one expert and positive widths");
  KILN_REQUIRE(p.shared_inter == 0 || (p.w_shared_gate_up && p.w_shared_down), "moe: shared experts need both weights");
  KILN_REQUIRE(p.w_gate_up_scales.quantized() == p.w_down_scales.quantized(),
               "moe: gate/up and down weights must both be scaled or both plain");
  if (p.num_tokens <= quant_moe_gemv_max_tokens()) return quant_moe_decode(p, s);
  // Prefill-sized: bf16 copies of the quantized weights, then the bf16 paths.
  static GrowOnlyScratch gu_buf, dn_buf, sgu_buf, sdn_buf;
  const int64_t E = p.num_experts, I = p.inter, H = p.hidden, S = p.shared_inter;
  MoeParams b = p;
  b.w_dtype = DType::BF16, b.w_shared_dtype = std::nullopt;
  b.w_gate_up_scales = {}, b.w_down_scales = {}, b.w_shared_gate_up_scales = {}, b.w_shared_down_scales = {};
  if (quant::is_quantized(p.w_dtype, p.w_gate_up_scales)) {
    auto* gu = gu_buf.get<__nv_bfloat16>(static_cast<size_t>(E * 2 * I * H));
    auto* dn = dn_buf.get<__nv_bfloat16>(static_cast<size_t>(E * H * I));
    quant::dequantize_bf16(
        quant::make_view("moe gate/up", p.w_gate_up, p.w_dtype, p.w_gate_up_scales, H,
                         weight_elems(p.w_dtype, 2 * I, H), scale_elems(p.w_gate_up_scales, 2 * I, H)),
        E, 2 * I, gu, s);
    quant::dequantize_bf16(quant::make_view("moe down", p.w_down, p.w_dtype, p.w_down_scales, I,
                                            weight_elems(p.w_dtype, H, I), scale_elems(p.w_down_scales, H, I)),
                           E, H, dn, s);
    b.w_gate_up = gu, b.w_down = dn;
  } else {
    KILN_REQUIRE(
        p.w_dtype == DType::BF16,
        std::string("moe on CUDA: expert weights must be bf16, F8_E4M3 or I4X8, got ") + dtype_name(p.w_dtype));
  }
  if (S > 0 && quant::is_quantized(p.shared_dtype(), p.w_shared_gate_up_scales)) {
    auto* sgu = sgu_buf.get<__nv_bfloat16>(static_cast<size_t>(2 * S * H));
    auto* sdn = sdn_buf.get<__nv_bfloat16>(static_cast<size_t>(H * S));
    quant::dequantize_bf16(quant::make_view("moe shared gate/up", p.w_shared_gate_up, p.shared_dtype(),
                                            p.w_shared_gate_up_scales, H, 0, 0),
                           1, 2 * S, sgu, s);
    quant::dequantize_bf16(
        quant::make_view("moe shared down", p.w_shared_down, p.shared_dtype(), p.w_shared_down_scales, S, 0, 0), 1, H,
        sdn, s);
    b.w_shared_gate_up = sgu, b.w_shared_down = sdn;
  } else if (S > 0) {
    KILN_REQUIRE(p.shared_dtype() == DType::BF16, std::string("moe on CUDA: shared expert weights must be bf16, "
                                                              "F8_E4M3 or I4X8, got ") +
                                                      dtype_name(p.shared_dtype()));
  }
  moe(b, gemm, s);
}

}  // namespace kiln::ops::cuda
