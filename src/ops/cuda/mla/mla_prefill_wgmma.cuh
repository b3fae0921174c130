// Flash attention on Hopper warpgroup MMAs (wgmma) for the expanded MLA form with qk 192 / v 128
// (every DeepSeek-V3-family checkpoint). Included by mla_prefill.cu only.
//
// Why wgmma: with mma.sync every warp reads the whole key and value tile from shared memory for
// its own 16 query rows, 40 KB per warp per 64-key tile, and shared-memory bandwidth, not the
// tensor cores, bounds the kernel (~200 TFLOP/s on H200). A wgmma reads its B operand once for a
// warpgroup's 64 rows.
//
// Two steps per call (per group of heads when the copies would be large):
//  1. tile_images_kernel writes, for every 64-key block of every sequence and every head, the exact
//     shared-memory image the attention wants (bf16, 128-byte swizzled, wgmma_desc_sw128's layout):
//     K [64 keys x 192] as three 64-wide panels (k_nope from kv_b ‖ the shared k_pe), then Vᵀ
//     [128 x 64 keys]: 40,960 bytes. Keys past a sequence's end are zero. Sequence b's blocks
//     start at block ceil(cu_kv[b] / 64) + b, so blocks never straddle sequences.
//  2. flash_kernel: CTA = one head, one 128-query tile of one sequence, two warpgroups of 64 query
//     rows. Q is converted into a swizzled shared image once; each key tile is one 40 KB bulk copy
//     (cp.async.bulk, issued by thread 0) into a STAGES-deep ring of transaction barriers
//     (mbarrier.cuh): a warpgroup waits for its tile's copy only, and frees the stage when its
//     wgmmas are done with it, so no CTA-wide barrier realigns the two warpgroups per tile and
//     their ping-pong (below) holds across tiles. Per tile and warpgroup: S = Q·Kᵀ as 12 m64n64k16
//     wgmmas (both operands in shared memory); f32 online softmax in registers (exp2, causal mask
//     only on tiles that cross the diagonal); O += P·V as 4 m64n128k16 wgmmas with P as register A
//     fragments (the S accumulator layout is the A-fragment layout) and Vᵀ in shared memory.
// Varlen: the grid is total_q / 128 + num_seqs CTAs wide (an upper bound on sum ceil(q_len / 128));
// warp 0 maps the CTA index to (sequence, query tile) with a warp scan over cu_q, and spare CTAs
// exit. Query tiles of a sequence are issued last-first (most keys first) so the causal tail stays
// short.
//
// Measured on H200 (docs/results.md): 16 heads at 8k tokens 350 TFLOP/s against 194 for the
// mma.sync flash kernel it replaced (same tiles, K/V read per warp through ldmatrix). Session 18,
// the warpgroups' S wgmmas ordered (ping-pong): this kernel alone at 8k, 904 -> 830 us a layer in
// one run (2 · 320 · 16 heads · 8000 · 8001 / 2 FLOP: ~363 -> ~395 TFLOP/s). Session 20, the
// cp.async ring and its per-tile __syncthreads replaced by the mbarrier ring: 827-834 -> 732-733
// us a layer (Nsight Compute, two runs; tensor pipe 47 -> 53% active), whole 8k prefills +1.6 to
// +2.4% (bf16 activations) and +0.6 to +1.4% (f32) in four pairs over two runs.
// Measured and left out:
//  - 4 stages with the old ring (815-818 vs 827-829 us, whole 8k prefills +0.4%);
//  - P·V's wait deferred into the next tile's S wait (ptxas serialised the wgmmas, C7515);
//  - session 20: Q held in registers as A fragments, on the old ring (shared-memory wavefronts
//    40 -> 27.5% of peak, the time the same, 818 vs 822 us: shared-memory bandwidth is not the
//    limit); on the mbarrier ring, S_j issued beside P_{j-1}·V_{j-1} (FlashAttention-3's
//    intra-warpgroup overlap, the ping-pong kept): 759 vs 733 us.
#pragma once

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/mbarrier.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/wgmma.cuh"

namespace kiln::ops::cuda::mla_prefill_wgmma {

constexpr int kQk = 192, kV = 128, kBM = 128, kBN = 64, kThreads = 256;
constexpr int kPanel = 64;                           // bf16 values per swizzled row
constexpr int kKImage = (kQk / kPanel) * kBN * 128;  // 24,576 B: K tile, 3 panels
constexpr int kVImage = kV * 128;                    // 16,384 B: Vᵀ tile, one panel of 128 rows
constexpr int kTileImage = kKImage + kVImage;        // 40,960 B per (block, head)
constexpr int kQImage = (kQk / kPanel) * kBM * 128;  // 49,152 B: Q tile, 3 panels of 128 rows
constexpr float kLog2e = 1.4426950408889634f;

// Key tiles in flight ahead of the one being computed: a stage is refilled two tiles after its
// last use, so the warpgroups may drift a tile apart (ping-pong) without the copies waiting.
template <int STAGES>
constexpr int lead() {
  static_assert(STAGES >= 3, "one stage in use, one a warpgroup may still read, one or more loading");
  return STAGES - 2;
}
template <int STAGES>
constexpr size_t smem_bytes() {
  return static_cast<size_t>(1024 + kQImage + STAGES * kTileImage);  // +1024: aligning the base
}
static_assert(smem_bytes<4>() <= 227 * 1024, "shared memory");

// First image block of sequence b (blocks of consecutive sequences never overlap).
__device__ __forceinline__ int64_t first_block(const int32_t* cu_kv, int64_t b) {
  return (cu_kv[b] + kBN - 1) / kBN + b;
}
// An upper bound on the image blocks of a batch: ceil(total_kv / 64) + num_seqs.
inline int64_t max_blocks(int64_t total_kv, int64_t num_seqs) {
  return (total_kv + kBN - 1) / kBN + num_seqs;
}

// grid: (max_blocks, group heads); block 256. img: [max_blocks, group heads, kTileImage bytes].
__global__ void __launch_bounds__(kThreads)
    tile_images_kernel(const float* kv_b, int64_t kv_b_stride, int64_t head0, int64_t nope, const float* k_pe,
                       int64_t k_pe_stride, VarlenSeqs seqs, unsigned char* img) {
  __shared__ float v_s[kBN][kV + 1];  // the block's values, f32, for the transpose
  const int64_t blk = blockIdx.x, hg = gridDim.y, hl = blockIdx.y, h = head0 + hl;
  // The last sequence whose first block is <= blk.
  const int64_t b = last_at_most(seqs.num_seqs, blk, [&](int64_t q) { return first_block(seqs.cu_kv, q); });
  const int64_t kv0 = seqs.cu_kv[b], kv_len = seqs.cu_kv[b + 1] - kv0;
  const int64_t key0 = (blk - first_block(seqs.cu_kv, b)) * kBN;
  if (key0 < 0 || key0 >= kv_len) return;  // between sequences: never read
  unsigned char* out = img + (blk * hg + hl) * int64_t{kTileImage};
  const float* head = kv_b + h * (nope + kV);

  // K: row r = key key0 + r; 16-byte chunk cc of the 192-wide row (8 values) from k_nope or k_pe.
  for (int i = threadIdx.x; i < kBN * (kQk / 8); i += kThreads) {
    const int r = i / (kQk / 8), cc = i % (kQk / 8), d0 = cc * 8;
    float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
    if (key0 + r < kv_len) {
      const int64_t row = kv0 + key0 + r;
      const float* src = d0 < nope ? head + row * kv_b_stride + d0 : k_pe + row * k_pe_stride + (d0 - nope);
      x0 = __ldg(reinterpret_cast<const float4*>(src));
      x1 = __ldg(reinterpret_cast<const float4*>(src) + 1);
    }
    *reinterpret_cast<uint4*>(out + (cc / 8) * (kBN * 128) + sw128_offset(r, cc % 8)) =
        make_uint4(pack_bf16(x0.x, x0.y), pack_bf16(x0.z, x0.w), pack_bf16(x1.x, x1.y), pack_bf16(x1.z, x1.w));
  }
  // V through shared memory, then Vᵀ: row d holds the 64 keys of column d.
  for (int i = threadIdx.x; i < kBN * (kV / 4); i += kThreads) {
    const int r = i / (kV / 4), c4 = i % (kV / 4);
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (key0 + r < kv_len)
      x = __ldg(reinterpret_cast<const float4*>(head + (kv0 + key0 + r) * kv_b_stride + nope) + c4);
    v_s[r][4 * c4] = x.x, v_s[r][4 * c4 + 1] = x.y, v_s[r][4 * c4 + 2] = x.z, v_s[r][4 * c4 + 3] = x.w;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kV * (kBN / 8); i += kThreads) {
    const int d = i / (kBN / 8), c = i % (kBN / 8);
    const float* k = &v_s[8 * c][d];  // keys 8c .. 8c + 7 of column d
    constexpr int kS = kV + 1;
    *reinterpret_cast<uint4*>(out + kKImage + sw128_offset(d, c)) =
        make_uint4(pack_bf16(k[0], k[kS]), pack_bf16(k[2 * kS], k[3 * kS]), pack_bf16(k[4 * kS], k[5 * kS]),
                   pack_bf16(k[6 * kS], k[7 * kS]));
  }
}

// The kernel's view of one call (a group of heads).
struct Params {
  const float* q;  // [total_q, num_heads, 192] rows q_stride apart (q_nope ‖ roped q_pe)
  int64_t q_stride;
  const unsigned char* img;  // tile_images_kernel's output for heads [head0, head0 + gridDim.y)
  int64_t blocks;            // image blocks per head in img (max_blocks)
  float* out;                // [total_q, num_heads, 128]
  VarlenSeqs seqs;
  int64_t num_heads, head0;
  float scale;
};

// grid: (total_q / kBM + num_seqs, group heads); block kThreads (two warpgroups).
template <int STAGES>
__global__ void __launch_bounds__(kThreads, 1) flash_kernel(Params p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // The swizzle atoms need 1024-byte-aligned bases.
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  unsigned char* q_img = smem;  // [3 panels][kBM rows][128 B]
  auto stage = [&](int i) { return smem + kQImage + i * kTileImage; };
  __shared__ int tile_seq, tile_qb;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wq = warp % 4;
  // Warp-uniform for the compiler too (as in moe_wgmma.cu): the descriptors stay in uniform registers.
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
  const int64_t hg = gridDim.y, hl = blockIdx.y, h = p.head0 + hl;

  // CTA index -> (sequence, query tile): tiles of sequence b are ceil(q_len_b / kBM) consecutive
  // indices; a warp scan over 32 sequences at a time finds the one holding blockIdx.x.
  if (warp == 0) {
    const int t = static_cast<int>(blockIdx.x);
    int found_b = -1, found_local = 0, base = 0;
    for (int64_t b0 = 0; b0 < p.seqs.num_seqs; b0 += 32) {
      const int64_t b = b0 + lane;
      const int n = b < p.seqs.num_seqs ? (p.seqs.cu_q[b + 1] - p.seqs.cu_q[b] + kBM - 1) / kBM : 0;
      int incl = n;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      const int excl = incl - n;
      const unsigned hit = __ballot_sync(0xffffffffu, t >= base + excl && t < base + incl);
      if (hit) {
        const int src = __ffs(static_cast<int>(hit)) - 1;
        found_b = static_cast<int>(b0) + src;
        found_local = t - base - __shfl_sync(0xffffffffu, excl, src);
        break;
      }
      base += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) {
      tile_seq = found_b;
      tile_qb = found_local;
    }
  }
  __syncthreads();
  if (tile_seq < 0) return;  // a spare CTA of the upper-bound grid
  const int64_t b = tile_seq;
  const int64_t q0 = p.seqs.cu_q[b], q_len = p.seqs.cu_q[b + 1] - q0;
  const int64_t kv_len = p.seqs.cu_kv[b + 1] - p.seqs.cu_kv[b];
  const int64_t n_qb = (q_len + kBM - 1) / kBM;
  const int64_t i0 = (n_qb - 1 - tile_qb) * kBM;  // last tile first: it has the most keys
  const int64_t rows = min(static_cast<int64_t>(kBM), q_len - i0);
  const int64_t diag = kv_len - q_len + i0;  // query row r of the tile sees keys [0, diag + r]
  const int n_tiles = static_cast<int>((diag + rows + kBN - 1) / kBN);
  // Images exist for cu_kv[num_seqs] <= total_kv keys only; a caller's wrong total_kv leaves the
  // tile's output unwritten rather than reading past the images.
  if (first_block(p.seqs.cu_kv, b) + n_tiles > p.blocks) return;

  // Tile j of this sequence and head: one contiguous image, one bulk copy by thread 0 that lands
  // on full[j % STAGES]. Each warp arrives on empty[s] once its wgmmas are done with stage s.
  __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
  const unsigned char* img0 = p.img + (first_block(p.seqs.cu_kv, b) * hg + hl) * int64_t{kTileImage};
  auto bar = [](uint64_t* barrier) { return smem_u32(barrier); };
  auto issue_tile = [&](int j) {  // thread 0
    if (j >= n_tiles) return;
    const int s = j % STAGES;
    if (j >= STAGES) mbarrier_wait(bar(&empty[s]), ((j - STAGES) / STAGES) & 1);  // tile j - STAGES left it
    mbarrier_arrive_expect_tx(bar(&full[s]), kTileImage);
    bulk_copy_to_shared(smem_u32(stage(s)), img0 + static_cast<int64_t>(j) * hg * kTileImage, kTileImage,
                        bar(&full[s]));
  };
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbarrier_init(bar(&full[s]), 1);
      mbarrier_init(bar(&empty[s]), kThreads / 32);
    }
    fence_mbarrier_init();
#pragma unroll
    for (int j = 0; j < lead<STAGES>(); ++j) issue_tile(j);
  }

  // Q tile -> bf16 swizzled image (rows past the sequence are zero).
  {
    const float* q_base = p.q + (q0 + i0) * p.q_stride + h * kQk;
    for (int i = tid; i < kBM * (kQk / 8); i += kThreads) {
      const int r = i / (kQk / 8), cc = i % (kQk / 8);
      float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
      if (r < rows) {
        x0 = __ldg(reinterpret_cast<const float4*>(q_base + r * p.q_stride) + 2 * cc);
        x1 = __ldg(reinterpret_cast<const float4*>(q_base + r * p.q_stride) + 2 * cc + 1);
      }
      *reinterpret_cast<uint4*>(q_img + (cc / 8) * (kBM * 128) + sw128_offset(r, cc % 8)) =
          make_uint4(pack_bf16(x0.x, x0.y), pack_bf16(x0.z, x0.w), pack_bf16(x1.x, x1.y), pack_bf16(x1.z, x1.w));
    }
  }
  fence_proxy_async_smem();  // the Q image is visible to wgmma
  __syncthreads();           // everyone's, and the barriers are initialised

  const float sl2 = p.scale * kLog2e;
  const int g = lane / 4, t4 = lane % 4;
  const int64_t row_lim0 = diag + wg * 64 + wq * 16 + g;    // last key visible to this thread's first row
  const uint32_t q_addr = smem_u32(q_img) + wg * 64 * 128;  // this warpgroup's 64 rows of panel 0
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int j = 0; j < n_tiles; ++j) {
    // Tile j + lead goes into the stage tile j + lead - STAGES = j - 2 used: both warpgroups are
    // done with it unless one is two tiles behind the other.
    if (tid == 0) issue_tile(j + lead<STAGES>());
    mbarrier_wait(bar(&full[j % STAGES]), (j / STAGES) & 1);  // tile j has landed
    __syncwarp();  // converged again for the aligned barriers and wgmmas below
    const uint32_t k_addr = smem_u32(stage(j % STAGES)), vt_addr = k_addr + kKImage;

    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.0f;
    wgmma_fence();
    // Ping-pong: the warpgroups issue their S in turns (0 then 1 for each tile: barrier 1 holds
    // warpgroup 1 until 0 has issued, barrier 2 holds 0's next until 1 has). The intent: the tensor
    // cores take warpgroup 0's S first, then warpgroup 1's while warpgroup 0 runs its softmax,
    // instead of both softmaxes leaving them idle at once (measured: the kernel faster, its tensor
    // pipe busier; not the schedule itself). Nothing else aligns them: each waits for its tiles only.
    if (wg == 1) named_barrier_sync(1, kThreads);
    if (wg == 0 && j > 0) named_barrier_sync(2, kThreads);
#pragma unroll
    for (int kk = 0; kk < kQk / 16; ++kk) {
      const uint32_t off = (kk % 4) * 32;  // k-step inside the panel
      wgmma_m64n64k16_ss(s, wgmma_desc_sw128(q_addr + (kk / 4) * (kBM * 128) + off),
                         wgmma_desc_sw128(k_addr + (kk / 4) * (kBN * 128) + off), kk > 0);
    }
    wgmma_commit();
    if (wg == 0) named_barrier_arrive(1, kThreads);
    if (wg == 1 && j + 1 < n_tiles) named_barrier_arrive(2, kThreads);
    wgmma_wait<0>();
    wgmma_fence_regs(s);

    const int64_t j0 = static_cast<int64_t>(j) * kBN;
    if (j0 + kBN - 1 > diag) {  // the tile reaches past some row's diagonal: mask
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t key = j0 + n * 8 + 2 * t4 + (e & 1);
          if (key > row_lim0 + (e >= 2 ? 8 : 0)) s[4 * n + e] = -INFINITY;
        }
      }
    }
    // Online softmax per row (r = 0: row g, r = 1: row g + 8); scores stay in raw units, the
    // exponent is s * scale * log2e - m * scale * log2e. A row's four partial maxima and sums live
    // in the quad of lanes that holds it.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) mx = fmaxf(mx, fmaxf(s[4 * n + 2 * r], s[4 * n + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float ms = mx == -INFINITY ? 0.0f : mx * sl2;
      const float alpha = fast_exp2(m[r] * sl2 - ms);  // 0 while m was -inf
      m[r] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) {
        s[4 * n + 2 * r] = fast_exp2(fmaf(s[4 * n + 2 * r], sl2, -ms));
        s[4 * n + 2 * r + 1] = fast_exp2(fmaf(s[4 * n + 2 * r + 1], sl2, -ms));
        sum += s[4 * n + 2 * r] + s[4 * n + 2 * r + 1];
      }
      l[r] = l[r] * alpha + sum;
#pragma unroll
      for (int d = 0; d < kV / 8; ++d) {
        o[4 * d + 2 * r] *= alpha;
        o[4 * d + 2 * r + 1] *= alpha;
      }
    }
    // O += P·V, 16 keys per wgmma: keys 16kk.. are S column blocks 2kk and 2kk + 1.
    uint32_t a[kBN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      a[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
      a[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
      a[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
      a[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
    wgmma_fence_regs(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) wgmma_m64n128k16_rs(o, a[kk], wgmma_desc_sw128(vt_addr + kk * 32));
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(o);
    __syncwarp();
    if (lane == 0) mbarrier_arrive(bar(&empty[j % STAGES]));  // this warp's wgmmas are done with the stage
  }

  // Normalise and store: rows g and g + 8 of this warp's 16, columns 8d + 2 t4 (+1).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int64_t row = wg * 64 + wq * 16 + g + 8 * r;
    if (row >= rows) continue;
    const float inv = 1.0f / sum;
    float* dst = p.out + ((q0 + i0 + row) * p.num_heads + h) * kV + 2 * t4;
#pragma unroll
    for (int d = 0; d < kV / 8; ++d)
      *reinterpret_cast<float2*>(dst + d * 8) = make_float2(o[4 * d + 2 * r] * inv, o[4 * d + 2 * r + 1] * inv);
  }
}

}  // namespace kiln::ops::cuda::mla_prefill_wgmma
