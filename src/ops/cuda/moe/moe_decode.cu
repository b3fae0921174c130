// Decode-sized MoE (<= moe_gemv_max_tokens() tokens): the chosen experts and the shared experts in two
// launches that stream the weights at copy bandwidth. A decode step is bound by reading them
// (Moonlight: 6 routed + 2 shared experts = 138 MB per layer), and at one token the cost was
// launch count and load latency, not FLOPs: 8 launches per layer (slot GEMV, SwiGLU, slot GEMV,
// combine, then the shared MLP's GEMV, SwiGLU, GEMV, add) ran at ~2 TB/s.
//  1. gate/up: one warp per activation j of a (slot, expert) or of the shared MLP, reading the
//     gate and up rows together and applying SwiGLU itself; a shared row serves up to 4 tokens per
//     warp (1 at a single token).
//  2. down + combine: one CTA per output (token, h), or per two adjacent h from 4 tokens, sums
//     w_j · (Wd[e_j][h] · act_j) over its slots and the shared row, its warps taking a segment of
//     the sum each, so nothing is written per slot and no combine pass follows.
// Activations stay f32 and weights bf16 with f32 accumulation (the precision of the other paths);
// sums run in a fixed order, so results do not depend on timing.
// Measured and left out (session 11, H200): 2-8 tokens on tensor cores as the projections' GEMV
// (gemv.cu) does it, every MMA taking all the tokens (its N of 8) so that each chosen expert is
// read once for all the tokens that chose it: gate/up tiles of 8 gate over 8 up rows (SwiGLU in the
// lanes), down tiles of 16 columns, then a combine launch. Whole steps at 2 / 4 / 8 tokens, each
// against this file's kernels in the same run:
//  - a CTA per tile, staged in shared memory: 3.51-3.57 / 5.76-5.80 / 9.17-9.28 ms vs 3.51-3.52 /
//    5.26-5.33 / 8.67;
//  - the same in registers: 3.86-3.91 / 5.71-5.80 / 9.54-9.61 vs 3.48-3.50 / 5.14-5.18 / 8.52-8.58;
//  - one persistent CTA per SM, tiles through a 3-4 stage cp.async ring, x held in registers as
//    bf16 hi/lo fragments: 4.23-4.31 / 6.06-6.14 / 8.79-8.88 vs 3.45-3.50 / 5.10-5.19 / 8.34-8.49.
// They read fewer bytes (each distinct expert once); why they are slower is not measured (no
// profiler run). All three passed the parity tests they were run against (the first and last
// Parity.MoeExperts; the second only MoeWithAdd and MoeBf16Activations, which it passed).
#include <algorithm>
#include <cstdlib>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/env.h"
#include "ops/cuda/moe/moe_internal.cuh"
#include "ops/cuda/pdl.cuh"

namespace kiln::ops::cuda::moe_detail {
namespace {

constexpr int kWarps = 8;
// CTAs per SM the register budget must allow (64 registers a thread): the kernels are bound by
// loads in flight, and at 80-93 registers only 2-3 CTAs fit (Nsight Compute on H200: 25-37%
// occupancy). The two-output down kernel is the exception: 3 CTAs at 80 registers (see there).
constexpr int kMinBlocks = 4;

struct DecodeArgs {
  const float* x;  // [T, H]
  int64_t T, H;
  const int32_t* ids;  // [T, k]
  const float* wts;    // [T, k]
  int64_t k, E, I;
  const __nv_bfloat16* w_gate_up;  // [E, 2I, H]
  const __nv_bfloat16* w_down;     // [E, H, I]
  const __nv_bfloat16* s_gate_up;  // [2S, H] (S = 0: no shared experts)
  const __nv_bfloat16* s_down;     // [H, S]
  int64_t S;
  float* act;        // [T * k, I] routed activations, then [T, S] shared
  float* out;        // [T, H]
  const float* add;  // [T, H] added to out (null: none)
  // down_combine_kernel's segments (set by the launcher): units (8-column chunks, or columns) of a
  // routed row (ni) and of the shared row (ns), pieces per row (pi, ps) and their lengths (li, ls).
  int32_t ni, ns, pi, ps, li, ls;
};

// acc += the 8 bf16 weights in w times the 8 values a ‖ b.
__device__ __forceinline__ void fma8(const uint4& w, const float4& a, const float4& b, float& acc) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
  float2 f = __bfloat1622float2(h[0]);
  acc += f.x * a.x + f.y * a.y;
  f = __bfloat1622float2(h[1]);
  acc += f.x * a.z + f.y * a.w;
  f = __bfloat1622float2(h[2]);
  acc += f.x * b.x + f.y * b.y;
  f = __bfloat1622float2(h[3]);
  acc += f.x * b.z + f.y * b.w;
}
__device__ __forceinline__ void fma8(const uint4& w, const float* x, float& acc) {
  fma8(w, __ldg(reinterpret_cast<const float4*>(x)), __ldg(reinterpret_cast<const float4*>(x) + 1), acc);
}

// Lane-partial dots of gate row g and up row u with `tokens` (<= NT) rows of x, H apart.
template <int CHUNK, int NT>
__device__ __forceinline__ void pair_dots(const __nv_bfloat16* g, const __nv_bfloat16* u, const float* x, int64_t H,
                                          int tokens, bool vec, int lane, float (&ag)[NT], float (&au)[NT]) {
  if (vec) {
    const uint4* g4 = reinterpret_cast<const uint4*>(g);
    const uint4* u4 = reinterpret_cast<const uint4*>(u);
    const int64_t n8 = H / 8;
    for (int64_t base = 0; base < n8; base += 32 * CHUNK) {
      uint4 vg[CHUNK], vu[CHUNK];
#pragma unroll
      for (int c = 0; c < CHUNK; ++c) {
        const int64_t i = base + c * 32 + lane;
        if (i < n8) vg[c] = __ldcs(g4 + i), vu[c] = __ldcs(u4 + i);
      }
#pragma unroll
      for (int c = 0; c < CHUNK; ++c) {
        const int64_t i = base + c * 32 + lane;
        if (i >= n8) break;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (t >= tokens) break;
          fma8(vg[c], x + t * H + i * 8, ag[t]);
          fma8(vu[c], x + t * H + i * 8, au[t]);
        }
      }
    }
  } else {
    for (int64_t i = lane; i < H; i += 32) {
      const float gv = __bfloat162float(g[i]), uv = __bfloat162float(u[i]);
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (t < tokens) ag[t] += gv * x[t * H + i], au[t] += uv * x[t * H + i];
    }
  }
}

// Tokens per shared-expert task (NT): a warp applies one pair of shared rows to up to this many
// tokens. 4 for batches (93 registers, uncapped); 1 for a single token, which fits kMinBlocks CTAs
// per SM where the registers of 4 would spill.
constexpr int kSharedTokens = 4;

// grid: ceil((S·G + T·k·I) / kWarps) CTAs, G = ceil(T / NT). Warp w < S·G is shared (j, token
// group), the rest routed (w' = w - S·G: j = w' / slots, slot = w' % slots). Routed warps next to
// each other share j, so slots that chose the same expert read the same row at about the same
// time: the second read hits L2, and a batch pays DRAM for the distinct experts, not for every slot.
// Not done by default (session 13, H200): the resident shared warps prefetching their rows into
// L2 while the router runs (`prefetch`, KILN_MOE_SHARED_PREFETCH=1). 23 MB pulled through HBM
// then slowed the router, a chain of latency-bound steps, by more than it saved here: without it
// the router took 3.7 us less a layer and gate/up 0.5 us more (kernel trace, run 4, the binary
// of a since-reverted ranking), and single-stream steps went 2.50-2.53 -> 2.45-2.51 ms (run 5,
// same binary). Nor did these warps computing the input norm themselves and running before the
// wait (run 1: gate/up 3.6 us faster, the router 3.6 us slower; batch 8 9.4 against 8.5 ms).
// Nor (session 24) the shared rows pulled into L2 during the attention before this kernel, by a
// side-stream kernel pacing bulk prefetches at 0.5-4 TB/s: every form made single-stream steps
// slower (453 -> 227-443 tok/s), the router and MLA decode slowed, and this kernel still read all
// 92 MB from DRAM (L2 hit rate 1.68% with or without; docs/results.md, session 24).
template <int CHUNK, int NT>  // CHUNK: 16-byte gate loads per lane and pass (as many up loads with them)
__global__ void __launch_bounds__(kWarps * 32, NT == 1 ? kMinBlocks : 1)
    gate_up_kernel(DecodeArgs a, bool vec, bool prefetch) {
  const int lane = threadIdx.x & 31;
  // 32-bit task arithmetic (the launcher checks that the tasks fit): a 64-bit division by a runtime
  // value is a subroutine of ~70 instructions, against a warp's few hundred in all.
  const uint32_t w = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const auto slots = static_cast<uint32_t>(a.T * a.k), routed = slots * static_cast<uint32_t>(a.I),
             groups = static_cast<uint32_t>((a.T + NT - 1) / NT), shared = static_cast<uint32_t>(a.S) * groups;
  // With `prefetch` (off by default, see above) the shared rows, which are constant, start towards
  // L2 while the router finishes. Routed rows depend on its choice, so they wait.
  if (prefetch && vec && lane == 0 && w < shared && w % groups == 0) {
    const uint32_t j = w / groups;
    prefetch_l2(a.s_gate_up + j * a.H, static_cast<uint32_t>(a.H * 2));
    prefetch_l2(a.s_gate_up + (a.S + j) * a.H, static_cast<uint32_t>(a.H * 2));
  }
  pdl_wait();
  pdl_trigger();
  if (w < shared) {
    const uint32_t j = w / groups, t0 = w % groups * NT;
    const int tokens = static_cast<int>(min(static_cast<int64_t>(NT), a.T - t0));
    float g[NT] = {}, u[NT] = {};
    const __nv_bfloat16* row = a.s_gate_up + j * a.H;
    pair_dots<CHUNK, NT>(row, row + a.S * a.H, a.x + t0 * a.H, a.H, tokens, vec, lane, g, u);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= tokens) break;
      const float gv = warp_sum(g[t]), uv = warp_sum(u[t]);
      if (lane == 0) a.act[routed + (t0 + t) * a.S + j] = silu_mul_ieee(gv, uv);
    }
  } else if (w - shared < routed) {
    const uint32_t slot = (w - shared) % slots, j = (w - shared) / slots;
    const int32_t e = a.ids[slot];
    float g[1] = {0.0f}, u[1] = {0.0f};
    if (e >= 0 && e < a.E) {  // an out-of-range id is a dropped slot: activation 0
      const __nv_bfloat16* row = a.w_gate_up + (static_cast<int64_t>(e) * 2 * a.I + j) * a.H;
      pair_dots<CHUNK, 1>(row, row + a.I * a.H, a.x + (slot / static_cast<uint32_t>(a.k)) * a.H, a.H, 1, vec, lane, g,
                          u);
    }
    g[0] = warp_sum(g[0]);
    u[0] = warp_sum(u[0]);
    if (lane == 0) a.act[slot * a.I + j] = silu_mul_ieee(g[0], u[0]);
  }
}

// grid: T·H / OUT CTAs; CTA c = (h / OUT)·T + t writes out[t, h .. h + OUT - 1] (OUT below; the
// tokens of one h side by side: same-expert rows come from L2 the second time, as in the gate/up
// kernel). The sum is cut into segments of at most kSegChunks · 32 chunks of 8 columns: each routed
// slot's row in pi pieces and the shared row in ps pieces (Moonlight: 6 + 2 segments of 1,408
// columns). Warp w takes segments w, w + kWarps, ...; it issues all of a segment's loads before it
// uses any, so an output costs about one round trip. (A warp per output walking its segments in
// passes, the next pass's loads issued before the current one was reduced, ran at 1.75 TB/s on H200
// at one token: 26 us for 46 MB; this takes 19.)
// The CTA sums the warps' partials in warp order, so the result does not depend on timing.
// Measured and left out: two or four outputs per CTA with the segments staged in shared memory by
// cp.async (same or slower whole steps; the two outputs kept since hold them in registers); the
// first segment loaded before pdl_wait; and, for 2-8 tokens, the down projection per expert (each
// distinct row once for all its slots, partial sums, then a combine launch): 169 + 5 us against 121
// us at 8 tokens (H200, Nsight Compute). Also slower (session 10): the gate/up CTAs prefetching the
// chosen experts' down rows into L2 once the routing is known (single-stream steps 2.71-2.74 vs
// 2.59-2.61 ms). And (session 12) each CTA's rows copied into shared memory by the bulk-copy engine
// before the wait (one cp.async.bulk per row, issued by one thread; 128 threads, 80 registers, 22.5
// KB a CTA), so that the CTAs resident during the gate/up tail hold every byte in flight without
// registers: much slower, 2.78-2.82 vs 2.57 ms at batch 1 and 10.30-10.32 vs 8.54-8.61 at batch 8
// (H200, same binary, env switch).
constexpr int kSegChunks = 6;  // 8 spilled at 64 registers

// OUT consecutive outputs h per CTA (CTA c = (h / OUT)·T + t): a warp loads its segment of all OUT
// rows before it uses any and reads each act value once for them all, so a CTA holds OUT times the
// weight bytes in flight for the same act loads. The same sums in the same order for any OUT.
template <int OUT>
__global__ void __launch_bounds__(kWarps * 32, OUT == 1 ? kMinBlocks : 3) down_combine_kernel(DecodeArgs a, bool vec) {
  __shared__ float part_s[OUT][kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // 32-bit index arithmetic, and the segments' sizes from the launcher. With them computed here by
  // 64-bit divisions the kernel executed 10.8M instructions at one token (now 6.4M): ~660 a warp,
  // of which its loads and dot products need about 110 (an estimate), all before the warp's loads
  // could issue (Nsight Compute, H200: 21.5 -> 18.7 us alone; single-stream steps 2.28-2.33 ->
  // 2.22-2.25 ms, 8 streams 8.43-8.45 -> 7.84-7.92; session 16 run 5). Measured and not kept: 5
  // CTAs an SM at 48 registers (occupancy 43 -> 54%: 18.6 us alone, steps within 2.5% either way).
  const auto T = static_cast<uint32_t>(a.T), t = blockIdx.x % T, h0 = blockIdx.x / T * OUT;
  if (vec && threadIdx.x == 0 && t == 0 && a.S > 0)
    prefetch_l2(a.s_down + h0 * a.S, static_cast<uint32_t>(OUT * a.S * 2));
  pdl_wait();
  pdl_trigger();
  const int k = static_cast<int>(a.k), routed_segs = k * a.pi;
  float acc[OUT] = {};  // lane-partial, segments in order
  for (int n = warp; n < routed_segs + a.ps; n += kWarps) {
    const __nv_bfloat16* w;  // row h0; row h0 + o is o · row apart
    const float* x;
    int64_t row;
    int b, end;  // units
    float scale = 1.0f;
    if (n < routed_segs) {
      const int j = a.pi == 1 ? n : n / a.pi;
      const int64_t slot = int64_t{t} * k + j;
      const int32_t e = a.ids[slot];
      if (e < 0 || e >= a.E) continue;  // a dropped slot adds nothing
      w = a.w_down + (static_cast<int64_t>(e) * a.H + h0) * a.I;
      x = a.act + slot * a.I;
      row = a.I;
      b = (n - j * a.pi) * a.li, end = min(a.ni, b + a.li), scale = a.wts[slot];
    } else {
      w = a.s_down + h0 * a.S;
      x = a.act + a.T * a.k * a.I + t * a.S;
      row = a.S;
      b = (n - routed_segs) * a.ls, end = min(a.ns, b + a.ls);
    }
    float part[OUT] = {};
    if (vec) {
      const uint4* wl = reinterpret_cast<const uint4*>(w) + b + lane;  // this lane's chunks, 32 apart
      const float* xl = x + (b + lane) * 8;
      const int left = end - b - lane;  // chunks c · 32 < left are this lane's
      uint4 v[OUT][kSegChunks];
#pragma unroll
      for (int o = 0; o < OUT; ++o)
#pragma unroll
        for (int c = 0; c < kSegChunks; ++c)
          if (c * 32 < left) v[o][c] = __ldcs(wl + o * (row / 8) + c * 32);
#pragma unroll
      for (int c = 0; c < kSegChunks; ++c) {
        if (c * 32 >= left) break;
        const float4 x0 = __ldg(reinterpret_cast<const float4*>(xl + c * 256));
        const float4 x1 = __ldg(reinterpret_cast<const float4*>(xl + c * 256) + 1);
#pragma unroll
        for (int o = 0; o < OUT; ++o) fma8(v[o][c], x0, x1, part[o]);
      }
    } else {
      for (int i = b + lane; i < end; i += 32)
#pragma unroll
        for (int o = 0; o < OUT; ++o) part[o] += __bfloat162float(w[o * row + i]) * x[i];
    }
#pragma unroll
    for (int o = 0; o < OUT; ++o) acc[o] += scale * part[o];
  }
#pragma unroll
  for (int o = 0; o < OUT; ++o) {
    const float v = warp_sum(acc[o]);
    if (lane == 0) part_s[o][warp] = v;
  }
  __syncthreads();
  if (threadIdx.x < OUT) {
    const int o = threadIdx.x;
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < kWarps; ++q) sum += part_s[o][q];
    const int64_t i = t * a.H + h0 + o;
    a.out[i] = a.add ? sum + a.add[i] : sum;
  }
}

}  // namespace

void moe_decode(const MoeParams& p, cudaStream_t s) {
  static GrowOnlyScratch act_buf;
  const int64_t T = p.num_tokens, k = p.top_k, I = p.inter, H = p.hidden, S = p.shared_inter;
  DecodeArgs a{p.x,
               T,
               H,
               p.topk_ids,
               p.topk_weights,
               k,
               p.num_experts,
               I,
               static_cast<const __nv_bfloat16*>(p.w_gate_up),
               static_cast<const __nv_bfloat16*>(p.w_down),
               static_cast<const __nv_bfloat16*>(p.w_shared_gate_up),
               static_cast<const __nv_bfloat16*>(p.w_shared_down),
               S,
               act_buf.get<float>(static_cast<size_t>(T * k * I + T * S)),
               p.out,
               p.add};
  // 16-byte loads need every row start aligned: widths that are multiples of 8 on aligned bases.
  const bool vec_gu =
      H % 8 == 0 && aligned16(p.x) && aligned16(p.w_gate_up) && (S == 0 || aligned16(p.w_shared_gate_up));
  const bool vec_d =
      I % 8 == 0 && S % 8 == 0 && aligned16(a.act) && aligned16(p.w_down) && (S == 0 || aligned16(p.w_shared_down));
  // The down kernel's segments: a routed row in pi pieces, the shared row in ps, each at most
  // kSegChunks · 32 units.
  constexpr int64_t kSeg = 32 * kSegChunks;
  const int64_t ni = vec_d ? I / 8 : I, ns = vec_d ? S / 8 : S, pi = (ni + kSeg - 1) / kSeg,
                ps = (ns + kSeg - 1) / kSeg;
  a.ni = static_cast<int32_t>(ni), a.ns = static_cast<int32_t>(ns);
  a.pi = static_cast<int32_t>(pi), a.ps = static_cast<int32_t>(ps);
  a.li = static_cast<int32_t>(pi ? (ni + pi - 1) / pi : 0), a.ls = static_cast<int32_t>(ps ? (ns + ps - 1) / ps : 0);
  static const bool prefetch = env_int("KILN_MOE_SHARED_PREFETCH", 0, 0, 1) != 0;  // see gate_up_kernel
  const int nt = T == 1 ? 1 : kSharedTokens;
  const int64_t groups = (T + nt - 1) / nt;
  KILN_REQUIRE(T * k * I + S * groups < (int64_t{1} << 31) && T * H < (int64_t{1} << 31) && I < (int64_t{1} << 30) &&
                   S < (int64_t{1} << 30) && k * pi + ps < (1 << 30),
               "moe decode: " + std::to_string(T) + " tokens of these widths exceed the kernels' 32-bit indices");
  // 4 gate + 4 up loads in flight per lane measured the same as 8 + 8 (2.90 vs 2.91 ms per
  // single-stream step on H200) with fewer registers. A persistent grid (only the CTAs that fit,
  // striding over tasks) made this op faster alone (47.7 vs 49.1 us) but whole steps slower with
  // programmatic dependent launch (3.00 vs 2.91 ms), so every task keeps its own warp.
  launch_pdl(nt == 1 ? gate_up_kernel<4, 1> : gate_up_kernel<4, kSharedTokens>,
             dim3(blocks_for(T * k * I + S * groups, kWarps)), dim3(kWarps * 32), 0, s, a, vec_gu, prefetch);
  // Outputs per down CTA: two from 4 tokens (KILN_MOE_DOWN_OUTPUTS=1 or 2 forces one, read per
  // call so tests can compare them; 2 needs an even hidden size). H200, Moonlight, three rounds of
  // whole steps, session 24: 8 tokens +4.5 to +5.6% (the kernel alone 98.9 -> 85.1 us), 4 tokens
  // +0.2 to +2.9%, 2 tokens -1.3 to +1.5%, one token -0.8 to -1.9% (15.5 -> 15.9 us on the chain,
  // 17.1 us alone either way; why is not measured). Four outputs spilled at the 2 CTAs an SM their
  // 128 registers allow.
  const int64_t forced = env_int("KILN_MOE_DOWN_OUTPUTS", 0, 0, 2);
  const bool two = (forced ? forced == 2 : T >= 4) && H % 2 == 0;
  launch_pdl(two ? down_combine_kernel<2> : down_combine_kernel<1>, dim3(static_cast<unsigned>(T * H / (two ? 2 : 1))),
             dim3(kWarps * 32), 0, s, a, vec_d);
}

}  // namespace kiln::ops::cuda::moe_detail

namespace kiln::ops::cuda {

int64_t moe_gemv_max_tokens() {
  // Measured on H200 (Moonlight, whole decode steps): 8 tokens take 11.4 ms per step here and 14.2
  // ms in the grouped GEMMs, 16 tokens 16.1 ms here and 14.5 there. Past ~8 the GEMVs pull too
  // many same-expert rows through L2 (one per slot); the grouped GEMMs read each expert once.
  // KILN_MOE_GEMV_MAX_TOKENS overrides it (to measure the crossover on other GPUs).
  static const int64_t v = env_int("KILN_MOE_GEMV_MAX_TOKENS", 8, 0);
  return v;
}

}  // namespace kiln::ops::cuda
