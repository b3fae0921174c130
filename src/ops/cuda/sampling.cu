// The sample op on the GPU (params.h SampleParams; reference: ops/cpu/sampling.cc). Each row is
// split into chunks, one CTA each (grid chunks x rows, ~2 waves of CTAs even for one row); every
// pass is a kernel whose last CTA per row (an atomic counter, reset by that CTA, so replays of a
// captured graph start from 0) merges the chunks' partials. No host sync, no allocation per call
// once the scratch has grown; the launch shape depends on rows and vocab only. Passes, each one
// read of the row (float4 loads) by all CTAs, rows that need nothing more returning at once:
//   1. stats: online max / sum-exp (logsumexp), argmax and top-n of the raw row; the row is copied
//      to scratch when penalised. Greedy rows without penalties end here.
//   2. (penalties only) the penalties on the copy, then its argmax.
//   3. sampled rows: weights w = exp((l - max) / T) as fixed point (x 2^42, u64), so every sum is
//      exact and order-independent; the cuts are prefixes of the order (value desc, id asc) found
//      by radix select over an order-preserving 32-bit code of the logit (3 passes of 11/11/10-bit
//      digits, per-CTA shared histograms of counts and masses added into a per-row global one):
//      top-k by count, then top-p by mass (ceil(top_p x top-k mass)); the first pass also sums the
//      row mass and the min-p threshold's count / mass (max + T ln(min_p)). The shortest prefix
//      wins. A cut inside a run of equal logits keeps the lowest ids.
//   4. the draw: target = floor(u x kept mass) with u from ops/sampling_rng.h; each chunk sums its
//      kept mass, the last CTA scans the chunks, then the chunk holding the target in id order.
// Against the f64 reference a token can differ only when the draw lands within rounding (f32 exp)
// of a CDF boundary, or a top-p / min-p cut sits within rounding of its threshold: measured ~0 in
// tests/ops/sampling_parity_test.cc.
#include <algorithm>

#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/sampling_common.cuh"
#include "ops/sampling_rng.h"

namespace kiln::ops::cuda {
namespace {

using namespace sampling;

// (value desc, id asc) insertion into a sorted list of at most ntop entries.
__device__ __forceinline__ void top_insert(ArgMax e, ArgMax (&t)[kMaxTop], int& cnt, int ntop) {
  if (cnt == ntop && better(e, t[ntop - 1]).i != e.i) return;
  int j = cnt < ntop ? cnt++ : ntop - 1;
  while (j > 0 && better(e, t[j - 1]).i == e.i) t[j] = t[j - 1], --j;
  t[j] = e;
}
// The block's ntop best of the per-thread sorted lists, most likely first, by rounds of argmax.
template <typename F>
__device__ void block_top(ArgMax (&t)[kMaxTop], int cnt, int ntop, Reduce& sm, F&& emit) {
  int head = 0;
  for (int j = 0; j < ntop; ++j) {
    const ArgMax b = block_argmax(head < cnt ? t[head] : ArgMax{-INFINITY, INT_MAX}, sm);
    if (head < cnt && t[head].i == b.i) ++head;
    if (threadIdx.x == 0) emit(j, b);
  }
}

__global__ void __launch_bounds__(kThreads) stats_kernel(SampleParams p, Plan P) {
  __shared__ Reduce sm;
  const RowCtx c = row_ctx(p, P);
  float* copy = c.penalised ? P.copy + c.r * c.n : nullptr;
  const int ntop = static_cast<int>(p.num_top);
  ArgMax t[kMaxTop];
  int cnt = 0;
  float worst = -INFINITY;  // the thread's n-th best once its list is full
  float m = -INFINITY, s = 0.0f;
  ArgMax am{-INFINITY, INT_MAX};
  const bool al = aligned16(c.raw);
  for (int64_t i = c.c0 + 4 * threadIdx.x; i < c.c1; i += 4 * kThreads) {
    float x4[4];
    const int nv = load4(c.raw, i, c.c1, al, x4);
    for (int k = 0; k < nv; ++k) {
      const float x = x4[k];
      const int id = static_cast<int>(i + k);
      if (copy) copy[id] = x;
      if (x > m) {
        s = s * expf(m - x) + 1.0f;
        m = x;
      } else if (x != -INFINITY) {
        s += expf(x - m);
      }
      if (x > am.v || am.i == INT_MAX) am = ArgMax{x, id};
      // Visited in increasing id, so an equal value never displaces an earlier one.
      if (ntop > 0 && (cnt < ntop || x > worst)) {
        int j = cnt < ntop ? cnt++ : ntop - 1;
        while (j > 0 && x > t[j - 1].v) t[j] = t[j - 1], --j;
        t[j] = ArgMax{x, id};
        if (cnt == ntop) worst = t[ntop - 1].v;
      }
    }
  }
  const int64_t slot = c.r * P.chunks + c.ch;
  block_ms(m, s, sm);
  am = block_argmax(am, sm);
  block_top(t, cnt, ntop, sm, [&](int j, ArgMax b) {
    P.top_v[slot * kMaxTop + j] = b.v;
    P.top_i[slot * kMaxTop + j] = b.i;
  });
  if (threadIdx.x == 0) P.part[slot].m = m, P.part[slot].s = s, P.part[slot].am = am;
  if (!arrive_last(&P.zero[c.r].counter, static_cast<unsigned>(P.chunks), sm)) return;

  // The row's last CTA: merge the chunks.
  m = -INFINITY, s = 0.0f, am = ArgMax{-INFINITY, INT_MAX}, cnt = 0;
  for (int64_t j = threadIdx.x; j < P.chunks; j += kThreads) {
    const Partial* q = P.part + c.r * P.chunks + j;
    merge_ms(m, s, __ldcg(&q->m), __ldcg(&q->s));
    am = better(am, ArgMax{__ldcg(&q->am.v), __ldcg(&q->am.i)});
    for (int e = 0; e < ntop; ++e) {
      const int64_t o = (c.r * P.chunks + j) * kMaxTop + e;
      const ArgMax a{__ldcg(P.top_v + o), __ldcg(P.top_i + o)};
      if (a.i != INT_MAX) top_insert(a, t, cnt, ntop);
    }
  }
  block_ms(m, s, sm);
  const float lse = m + logf(s);
  am = block_argmax(am, sm);
  block_top(t, cnt, ntop, sm, [&](int j, ArgMax b) {
    const bool have = b.i != INT_MAX;
    p.top_ids[c.r * ntop + j] = have ? b.i : -1;
    p.top_logprobs[c.r * ntop + j] = have ? b.v - lse : -INFINITY;
  });
  if (threadIdx.x == 0) {
    RowState& rs = P.rs[c.r];
    rs.lse = lse, rs.mx = am.v, rs.arg = am.i;
    rs.z_all = 0, rs.z_min = 0, rs.c_min = 0;
    if (!c.penalised && p.temperature[c.r] <= 0.0f) p.token[c.r] = am.i, p.logprob[c.r] = am.v - lse;
  }
}

// Penalties on the copies, one thread per distinct token.
__global__ void __launch_bounds__(kThreads) penalty_kernel(SampleParams p, float* copies) {
  const int64_t r = blockIdx.x;
  const float rep = p.repetition[r], pres = p.presence[r], freq = p.frequency[r];
  const int b = p.pen_offsets[r], e = p.pen_offsets[r + 1];
  if (!(e > b && (rep != 1.0f || pres != 0.0f || freq != 0.0f))) return;
  float* copy = copies + r * p.vocab;
  for (int j = b + static_cast<int>(threadIdx.x); j < e; j += kThreads) {
    float& x = copy[p.pen_ids[j]];
    float v = x;
    if (rep != 1.0f) v = v > 0.0f ? __fdiv_rn(v, rep) : __fmul_rn(v, rep);
    const int cnt = p.pen_counts[j];
    if (cnt > 0 && (pres != 0.0f || freq != 0.0f))
      v = __fsub_rn(v, __fadd_rn(__fmul_rn(freq, static_cast<float>(cnt)), pres));  // no FMA: as the CPU
    x = v;
  }
}

// The argmax of penalised rows.
__global__ void __launch_bounds__(kThreads) argmax_kernel(SampleParams p, Plan P) {
  __shared__ Reduce sm;
  const RowCtx c = row_ctx(p, P);
  if (!c.penalised) return;
  const float* src = P.copy + c.r * c.n;
  ArgMax am{-INFINITY, INT_MAX};
  for (int64_t i = c.c0 + 4 * threadIdx.x; i < c.c1; i += 4 * kThreads) {
    float x4[4];
    const int nv = load4(src, i, c.c1, aligned16(src), x4);
    for (int k = 0; k < nv; ++k)
      if (x4[k] > am.v || am.i == INT_MAX) am = ArgMax{x4[k], static_cast<int>(i + k)};
  }
  const int64_t slot = c.r * P.chunks + c.ch;
  am = block_argmax(am, sm);
  if (threadIdx.x == 0) P.part[slot].am = am;
  if (!arrive_last(&P.zero[c.r].counter, static_cast<unsigned>(P.chunks), sm)) return;
  am = ArgMax{-INFINITY, INT_MAX};
  for (int64_t j = threadIdx.x; j < P.chunks; j += kThreads) {
    const Partial* q = P.part + c.r * P.chunks + j;
    am = better(am, ArgMax{__ldcg(&q->am.v), __ldcg(&q->am.i)});
  }
  am = block_argmax(am, sm);
  if (threadIdx.x == 0) {
    RowState& rs = P.rs[c.r];
    rs.mx = am.v, rs.arg = am.i;
    if (p.temperature[c.r] <= 0.0f) p.token[c.r] = am.i, p.logprob[c.r] = c.raw[am.i] - rs.lse;
  }
}

struct SelectSmem {
  u64 mass[kBins];
  uint32_t count[kBins];
  Reduce red;
  int sel_bin;
  uint32_t sel_count;
  u64 sel_mass;
};

// One digit of a radix select (level 0: bits 31..21, 1: 20..10, 2: 9..0) on the sampled rows: by
// count for top-k (by_mass false), by mass for top-p. The shortest prefix of the order whose
// count or mass reaches `need` (<= the row's total). Level 0 of the top-k select also sums the
// row's mass and the min-p threshold's count / mass, for every sampled row.
__global__ void __launch_bounds__(kThreads) select_kernel(SampleParams p, Plan P, int level, bool by_mass) {
  __shared__ SelectSmem sm;
  const RowCtx c = row_ctx(p, P);
  const float temp = p.temperature[c.r];
  if (temp <= 0.0f) return;
  const int64_t top_k = p.top_k[c.r];
  const bool active = by_mass ? p.top_p[c.r] < 1.0f : top_k > 0 && top_k < c.n;
  const bool sums = !by_mass && level == 0;
  RowState& rs = P.rs[c.r];
  if (!sums && !(active && (level == 0 || !rs.dead))) return;
  const int shift = level == 0 ? 21 : level == 1 ? 10 : 0;
  const uint32_t digit = level == 2 ? 0x3FFu : 0x7FFu;
  const uint32_t prefix = level ? rs.prefix : 0u, mask = level ? rs.mask : 0u;
  const float mx = rs.mx, min_p = p.min_p[c.r];
  const float t_min = min_p > 0.0f ? __fadd_rn(mx, __fmul_rn(temp, logf(min_p))) : -INFINITY;
  const float* src = c.penalised ? P.copy + c.r * c.n : c.raw;
  const bool al = aligned16(src);
  if (active) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) sm.count[b] = 0, sm.mass[b] = 0;
    __syncthreads();
  }
  u64 z_all = 0, z_min = 0;
  uint32_t c_min = 0;
  const int lane = threadIdx.x & 31;
  for (int64_t base = c.c0; base < c.c1; base += 4 * kThreads) {  // whole warps iterate together
    const int64_t i = base + 4 * threadIdx.x;
    float x4[4];
    const int nv = load4(src, i, c.c1, al, x4);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float x = x4[k];
      const uint32_t code = order_code(x);
      u64 q = 0;
      if (sums && k < nv) {
        q = weight_q(x, mx, temp);
        z_all += q;
        if (x >= t_min) z_min += q, ++c_min;
      }
      if (active) {
        int bin = -1;
        if (k < nv && (code & mask) == prefix) {
          bin = static_cast<int>((code >> shift) & digit);
          if (!sums) q = weight_q(x, mx, temp);  // a count cut needs its mass too (top-p's base)
        }
        // Logits cluster in few exponents: aggregate a warp's equal bins before the atomics.
        const unsigned peers = __match_any_sync(0xffffffffu, bin);
        // q <= 2^42: 21-bit halves sum without overflow over 32 lanes.
        const u64 qs = __reduce_add_sync(peers, static_cast<unsigned>(q & 0x1FFFFFu)) +
                       (static_cast<u64>(__reduce_add_sync(peers, static_cast<unsigned>(q >> 21))) << 21);
        if (bin >= 0 && lane == __ffs(peers) - 1) {
          atomicAdd(&sm.count[bin], static_cast<uint32_t>(__popc(peers)));
          atomicAdd(&sm.mass[bin], qs);
        }
      }
    }
  }
  if (sums) {
    block_sum3(z_all, z_min, c_min, sm.red);
    if (threadIdx.x == 0) atomicAdd(&rs.z_all, z_all), atomicAdd(&rs.z_min, z_min), atomicAdd(&rs.c_min, c_min);
  }
  ZeroRow& zr = P.zero[c.r];
  if (active) {
    __syncthreads();
    for (int b = threadIdx.x; b < kBins; b += kThreads)
      if (sm.count[b]) atomicAdd(&zr.count[b], sm.count[b]), atomicAdd(&zr.mass[b], sm.mass[b]);
  }
  if (!arrive_last(&zr.counter, static_cast<unsigned>(P.chunks), sm.red)) return;

  // The row's last CTA: the digit whose bin holds the need-th unit.
  if (sums && threadIdx.x == 0)
    rs.cut = Cut{0xFFFFFFFFu, 0, static_cast<uint32_t>(c.n), __ldcg(&rs.z_all)};  // everything
  if (!active) return;
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    sm.count[b] = __ldcg(&zr.count[b]), sm.mass[b] = __ldcg(&zr.mass[b]);
    zr.count[b] = 0, zr.mass[b] = 0;
  }
  if (threadIdx.x == 0) sm.sel_bin = INT_MAX;
  __syncthreads();
  u64 need = static_cast<u64>(top_k);
  if (by_mass) {
    const u64 base_mass = rs.cut.mass;
    need = static_cast<u64>(ceil(static_cast<double>(p.top_p[c.r]) * static_cast<double>(base_mass)));
    need = max(1ull, min(need, base_mass));
  }
  // Thread t owns bins [8t, 8t + 8): block scans of their totals, then a walk inside the thread.
  const uint32_t above_count = level ? rs.above_count : 0u;
  const u64 above_mass = level ? rs.above_mass : 0ull;
  uint32_t c_own = 0, c_before = 0;
  u64 m_own = 0, m_before = 0;
  for (int k = 0; k < kBinsPerThread; ++k)
    c_own += sm.count[threadIdx.x * kBinsPerThread + k], m_own += sm.mass[threadIdx.x * kBinsPerThread + k];
  cub::BlockScan<u64, kThreads>(sm.red.scan.scan64).ExclusiveSum(m_own, m_before);
  __syncthreads();
  cub::BlockScan<uint32_t, kThreads>(sm.red.scan.scan32).ExclusiveSum(c_own, c_before);
  uint32_t ca = above_count + c_before;
  u64 ma = above_mass + m_before;
  for (int k = 0; k < kBinsPerThread; ++k) {
    const int b = threadIdx.x * kBinsPerThread + k;
    const uint32_t cnt = sm.count[b];
    const u64 ms = sm.mass[b];
    if (cnt > 0 && (by_mass ? ma + ms >= need : ca + cnt >= need)) {
      atomicMin(&sm.sel_bin, b);
      break;
    }
    ca += cnt, ma += ms;
  }
  __syncthreads();
  const int bin = sm.sel_bin;
  if (bin != INT_MAX && threadIdx.x == bin / kBinsPerThread) sm.sel_count = ca, sm.sel_mass = ma;
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (bin == INT_MAX) {  // unreachable with exact sums; keeps the previous cut
    rs.dead = 1;
    return;
  }
  rs.dead = 0;
  rs.prefix = prefix | static_cast<uint32_t>(bin) << shift;
  rs.mask = mask | digit << shift;
  rs.above_count = sm.sel_count, rs.above_mass = sm.sel_mass;
  if (level < 2) return;
  const uint32_t tie_total = sm.count[bin], code = rs.prefix;
  const u64 qv = weight_q(code_value(code), mx, temp), am = sm.sel_mass;
  uint32_t ties;
  if (by_mass)
    ties = qv == 0 ? tie_total : static_cast<uint32_t>(min(static_cast<u64>(tie_total), (need - am + qv - 1) / qv));
  else
    ties = static_cast<uint32_t>(need - sm.sel_count);
  rs.cut = Cut{code, ties, sm.sel_count + ties, am + static_cast<u64>(ties) * qv};
}

// The draw: the first kept token in id order whose inclusive weight sum exceeds
// target = floor(u x kept mass), u = (bits >> 11) x 2^-53 exactly.
__global__ void __launch_bounds__(kThreads) draw_kernel(SampleParams p, Plan P) {
  __shared__ Reduce sm;
  __shared__ int64_t found_chunk;
  __shared__ u64 found_run;
  __shared__ uint32_t found_ties;
  __shared__ int found;
  const RowCtx c = row_ctx(p, P);
  const float temp = p.temperature[c.r];
  if (temp <= 0.0f) return;
  const RowState& rs = P.rs[c.r];
  const float mx = rs.mx, min_p = p.min_p[c.r];
  const float t_min = min_p > 0.0f ? __fadd_rn(mx, __fmul_rn(temp, logf(min_p))) : -INFINITY;
  Cut cut = rs.cut;
  if (min_p > 0.0f && rs.c_min < cut.count) cut = Cut{order_code(t_min), kAllTies, rs.c_min, rs.z_min};
  const float* src = c.penalised ? P.copy + c.r * c.n : c.raw;
  const bool al = aligned16(src);
  u64 mass = 0, unused = 0;
  uint32_t ties = 0;
  for (int64_t i = c.c0 + 4 * threadIdx.x; i < c.c1; i += 4 * kThreads) {
    float x4[4];
    const int nv = load4(src, i, c.c1, al, x4);
    for (int k = 0; k < nv; ++k) {
      const uint32_t code = order_code(x4[k]);
      if (code < cut.code) mass += weight_q(code_value(code), mx, temp);
      ties += code == cut.code;
    }
  }
  block_sum3(mass, unused, ties, sm);
  Partial* part = P.part + c.r * P.chunks;
  if (threadIdx.x == 0) part[c.ch].mass = mass, part[c.ch].ties = ties;
  if (!arrive_last(&P.zero[c.r].counter, static_cast<unsigned>(P.chunks), sm)) return;

  // The row's last CTA: the chunk holding the target, then the token inside it.
  const u64 target = __umul64hi(sample_bits(p.seed[c.r], p.counter[c.r]) & ~0x7FFull, cut.mass);
  const u64 qv = weight_q(code_value(cut.code), mx, temp);
  if (threadIdx.x == 0) found_chunk = -1, found = -1;
  u64 run = 0;
  uint32_t ties_run = 0;
  for (int64_t g = 0; g < P.chunks; g += kThreads) {
    const int64_t j = g + threadIdx.x;
    const uint32_t tj = j < P.chunks ? __ldcg(&part[j].ties) : 0u;
    uint32_t t_before = 0, t_all = 0;
    __syncthreads();
    cub::BlockScan<uint32_t, kThreads>(sm.scan.scan32).ExclusiveSum(tj, t_before, t_all);
    const uint32_t tb = ties_run + t_before;
    const uint32_t kept = cut.ties == kAllTies ? tj : (cut.ties > tb ? min(tj, cut.ties - tb) : 0u);
    const u64 mine = j < P.chunks ? __ldcg(&part[j].mass) + static_cast<u64>(kept) * qv : 0ull;
    u64 before = 0, all = 0;
    __syncthreads();
    cub::BlockScan<u64, kThreads>(sm.scan.scan64).ExclusiveSum(mine, before, all);
    if (j < P.chunks && run + before <= target && target < run + before + mine)
      found_chunk = j, found_run = run + before, found_ties = tb;
    __syncthreads();
    if (found_chunk >= 0) break;
    run += all, ties_run += t_all;
  }
  int token = rs.arg;  // unreachable fallback: the kept weights sum to cut.mass exactly
  if (found_chunk >= 0) {
    const int64_t c0 = found_chunk * P.chunk_len, c1 = min(c.n, c0 + P.chunk_len);
    const bool rank_ties = cut.ties != 0 && cut.ties != kAllTies;
    run = found_run, ties_run = found_ties;
    for (int64_t base = c0; base < c1; base += static_cast<int64_t>(kThreads) * kItems) {
      const int64_t first = base + static_cast<int64_t>(threadIdx.x) * kItems;
      uint32_t code[kItems];
      uint32_t tie_local = 0;
      for (int k = 0; k < kItems; ++k) {
        code[k] = first + k < c1 ? order_code(src[first + k]) : 0xFFFFFFFFu;
        tie_local += first + k < c1 && code[k] == cut.code;
      }
      uint32_t tie_before = 0, tie_all = 0;
      if (rank_ties) {
        cub::BlockScan<uint32_t, kThreads>(sm.scan.scan32).ExclusiveSum(tie_local, tie_before, tie_all);
        __syncthreads();
      }
      uint32_t rank = ties_run + tie_before, kept = 0;  // kept: bit k for item k
      u64 mine = 0;
      for (int k = 0; k < kItems; ++k) {
        const bool tie = first + k < c1 && code[k] == cut.code;
        if (first + k < c1 && (code[k] < cut.code || (tie && (cut.ties == kAllTies || rank < cut.ties)))) {
          kept |= 1u << k;
          mine += weight_q(code_value(code[k]), mx, temp);
        }
        rank += tie;
      }
      u64 before = 0, chunk = 0;
      cub::BlockScan<u64, kThreads>(sm.scan.scan64).ExclusiveSum(mine, before, chunk);
      if (run + before <= target && target < run + before + mine) {
        u64 acc = run + before;
        for (int k = 0; k < kItems; ++k) {
          if (kept >> k & 1u) acc += weight_q(code_value(code[k]), mx, temp);  // the same q as above
          if (acc > target) {
            found = static_cast<int>(first + k);
            break;
          }
        }
      }
      __syncthreads();
      if (found >= 0) break;
      run += chunk;
      ties_run += tie_all;
    }
    if (found >= 0) token = found;
  }
  if (threadIdx.x == 0) {
    p.token[c.r] = token;
    p.logprob[c.r] = c.raw[token] - rs.lse;
  }
}

}  // namespace

void sample(const SampleParams& p, cudaStream_t s) {
  if (p.rows == 0) return;
  KILN_REQUIRE(p.num_top >= 0 && p.num_top <= kMaxTop, "sample: num_top must be in [0, 20]");
  KILN_REQUIRE(p.vocab > 0 && p.vocab < (int64_t{1} << 22), "sample: vocab must be in [1, 2^22)");
  KILN_REQUIRE(p.rows < 65536, "sample: rows must be < 65536");
  // Chunks: ~2 waves of CTAs on 132 SMs, at most 16K tokens (64 KB) and at least 512 per chunk.
  const int64_t want = std::max((264 + p.rows - 1) / p.rows, (p.vocab + 16383) / 16384);
  Plan P{};
  P.chunk_len = std::max<int64_t>(512, ((p.vocab + want - 1) / want + 3) / 4 * 4);
  P.chunks = (p.vocab + P.chunk_len - 1) / P.chunk_len;
  // Histograms and counters: zero when a launch starts, left zero by every launch.
  static ZeroedScratch zeroed;
  static GrowOnlyScratch work, copies;
  P.zero = zeroed.get<ZeroRow>(static_cast<size_t>(p.rows));
  const auto rows = static_cast<size_t>(p.rows), slots = rows * static_cast<size_t>(P.chunks);
  const size_t off_part = rows * sizeof(RowState), off_tv = off_part + slots * sizeof(Partial),
               off_ti = off_tv + slots * kMaxTop * sizeof(float), bytes = off_ti + slots * kMaxTop * sizeof(int);
  char* w = work.get<char>(bytes);
  P.rs = reinterpret_cast<RowState*>(w);
  P.part = reinterpret_cast<Partial*>(w + off_part);
  P.top_v = reinterpret_cast<float*>(w + off_tv);
  P.top_i = reinterpret_cast<int*>(w + off_ti);
  // The penalised copies of the rows: [rows, vocab] f32, grown once and reused (capture-safe).
  P.copy = p.pen_offsets ? copies.get<float>(static_cast<size_t>(p.rows * p.vocab)) : nullptr;
  const dim3 grid(static_cast<unsigned>(P.chunks), static_cast<unsigned>(p.rows));
  stats_kernel<<<grid, kThreads, 0, s>>>(p, P);
  if (p.pen_offsets) {
    penalty_kernel<<<static_cast<unsigned>(p.rows), kThreads, 0, s>>>(p, P.copy);
    argmax_kernel<<<grid, kThreads, 0, s>>>(p, P);
  }
  for (int by_mass = 0; by_mass < 2; ++by_mass)
    for (int level = 0; level < 3; ++level) select_kernel<<<grid, kThreads, 0, s>>>(p, P, level, by_mass != 0);
  draw_kernel<<<grid, kThreads, 0, s>>>(p, P);
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kiln::ops::cuda
