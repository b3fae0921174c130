// CUDA launchers, one per op, each on the backend's stream. Kernels live beside them, one .cu per
// op family (elementwise, gemm, mla/, moe/). Activations f32, weights bf16 (or f32), f32 math.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "ops/params.h"

namespace kiln::ops::cuda {

// Where a row pass writes its f32 results as the bf16 parts a tensor-core GEMM reads (the layout
// split_bf16 writes, Gemm::linear_parts reads): row r at hi + r * ld, its rounding remainders
// lo_offset elements after it (0: hi alone, activations rounded once).
struct BfParts {
  __nv_bfloat16* hi;
  int64_t ld, lo_offset;
  // The layout Gemm's parts take: `rows` hi rows ld apart, then (split) as many lo rows.
  static BfParts stacked(__nv_bfloat16* hi, int64_t rows, int64_t ld, bool split) {
    return {hi, ld, split ? rows * ld : 0};
  }
  // 4 values a thread fit its 8-byte stores (store_vec of 4 bf16) at every row, hi and lo.
  bool vec4() const { return ld % 4 == 0 && lo_offset % 4 == 0 && reinterpret_cast<uintptr_t>(hi) % 8 == 0; }
};

void copy(const CopyParams& p, cudaStream_t s);
void embedding(const EmbeddingParams& p, cudaStream_t s);
void rms_norm(const RmsNormParams& p, cudaStream_t s);
// The same norm written as bf16 parts (p.out unused): saves the GEMM after it a split pass.
void rms_norm(const RmsNormParams& p, const BfParts& out, cudaStream_t s);
void add(const AddParams& p, cudaStream_t s);
void take_tokens(const TakeTokensParams& p, cudaStream_t s);
void expert_slice(const ExpertSliceParams& p, cudaStream_t s);        // parallel.cu
void attention_merge(const AttentionMergeParams& p, cudaStream_t s);  // parallel.cu
void swiglu(const SwigluParams& p, cudaStream_t s);
void swiglu(const SwigluParams& p, const BfParts& out, cudaStream_t s);  // p.out unused
void rope(const RopeParams& p, cudaStream_t s);
void kv_scatter(const KvScatterParams& p, cudaStream_t s);
void kv_gather(const KvGatherParams& p, cudaStream_t s);
void log_softmax(const LogSoftmaxParams& p, cudaStream_t s);
// Token choice per row (sampling.cu): one CTA per row, graph-capturable.
void sample(const SampleParams& p, cudaStream_t s);
// Fills n values of dtype (F32 or BF16) with uniform(-scale, scale) from a counter hash of seed.
void fill_random(void* data, DType dtype, int64_t n, uint64_t seed, float scale, cudaStream_t s);

// Row pass (gemm.cu): x f32, head h's row r at x + h * head_stride + r * stride (k values) ->
// out[h] = bf16 hi [m, ld] then (split) lo [m, ld], x ≈ hi + lo, columns k..ld - 1 zero; without
// split, out[h] = hi alone. How f32 activations enter the tensor-core GEMMs.
void split_bf16(const float* x, int64_t stride, int64_t head_stride, __nv_bfloat16* out, int64_t m, int64_t k,
                int64_t ld, int64_t heads, bool split, cudaStream_t s);

// cuBLASLt GEMM: y = x · wᵀ with bf16 operands and f32 accumulation/output (see gemm.cu for how
// f32 activations keep their precision).
class Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  void linear(const LinearParams& p, cudaStream_t s);
  void linear_heads(const LinearHeadsParams& p, cudaStream_t s);
  // y = x · wᵀ (+ add, laid out as y) from x already in bf16 parts (BfParts: hi, then with `split`
  // lo at m · ldx; pad columns k..ldx - 1 not read), w bf16 [n, k], y [m, n] rows y_stride apart
  // (0: n). Any m: no GEMV path. `split` is the parts' writer's choice, not this object's.
  void linear_parts(const __nv_bfloat16* x, int64_t ldx, const void* w, float* y, int64_t y_stride, int64_t m,
                    int64_t n, int64_t k, const float* add, bool split, cudaStream_t s);
  // Independent GEMMs of one shape but their row counts, y_g = x_g · w_gᵀ: w_g [n, k] bf16
  // row-major, x_g [rows_g, k] bf16 rows ldx apart, y_g [rows_g, n] rows ldy apart, y_dtype F32 or
  // BF16 (f32 accumulation either way, rounded once on the store). They run on side streams,
  // ordered after everything already on `s` and before anything queued after.
  struct Group {
    const void* w;
    const void* x;
    int64_t rows;
    void* y;
  };
  void grouped(const Group* groups, int64_t count, int64_t n, int64_t k, int64_t ldx, int64_t ldy, cudaStream_t s,
               DType y_dtype = DType::F32);
  // Work that may run beside what `s` runs next: fork(s) returns a side stream ordered after
  // everything already on `s`, join(s) orders what is queued on `s` from then on after everything
  // queued on the side stream so far (both capturable: a fork and a join in a graph). GEMMs of this
  // object on the side stream take its own cuBLASLt workspace; they share the scratch of the
  // activation splits and halves, so between the two calls `s` must run none of this object's
  // GEMMs, nor `grouped` (which uses the same side stream); forks do not nest. Those calls throw.
  // join_quietly is join for a path that is already failing (a destructor): it throws nothing and
  // ignores CUDA errors.
  cudaStream_t fork(cudaStream_t s);
  void join(cudaStream_t s);
  void join_quietly(cudaStream_t s) noexcept;
  // true (the default): f32 activations enter every tensor-core GEMM as bf16 hi + lo rows; false:
  // rounded to bf16 once (Backend::set_activation_dtype). Sets the experts' choice too, which
  // set_split_expert_activations may then override.
  void set_split_activations(bool split) { split_ = expert_split_ = split; }
  bool split_activations() const { return split_; }
  // The MoE experts' GEMMs (routed and shared) alone (Backend::set_expert_activation_dtype).
  void set_split_expert_activations(bool split) { expert_split_ = split; }
  bool split_expert_activations() const { return expert_split_; }
  std::string name() const {
    return split_ ? "cuBLASLt bf16 with hi/lo-split f32 activations (f32 accumulate)"
                  : "cuBLASLt bf16 with bf16-rounded activations (f32 accumulate)";
  }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool split_ = true, expert_split_ = true;
};

// The attention prologue (mla/mla_prepare.cu): one CTA per token (plus the fold's CTAs),
// graph-capturable; the W_uk fold runs in the same launch at <= 8 tokens, else through `gemm` first.
void mla_prepare(const MlaPrepareParams& p, Gemm& gemm, cudaStream_t s);
void mla_absorbed(const MlaAbsorbedParams& p, cudaStream_t s);
void mla_expanded(const MlaExpandedParams& p, cudaStream_t s);
// Routing; with a fused gate (p.x set) <= 8 tokens run gate + routing in one launch.
void router(const RouterParams& p, cudaStream_t s);
// What KILN_OP_SKIP runs instead of the router (timing only): one small launch writing fixed
// choices, k distinct experts per token ((t·k + j) mod E) with weights 1/k, so that the MoE after
// it reads as many experts as under real routing and the step without the router still means
// something. Nothing else is written.
void router_stand_in(const RouterParams& p, cudaStream_t s);

// Routed (+ shared) experts (bf16 weights), graph-capturable, no host sync: decode steps run two
// GEMV launches (moe/moe_decode.cu); more tokens sort slots by expert on the device and run two
// grouped tensor-core GEMMs (moe/moe.cu), the shared experts through `gemm`.
void moe(const MoeParams& p, Gemm& gemm, cudaStream_t s);
// Largest token count the MoE runs as decode GEMVs (KILN_MOE_GEMV_MAX_TOKENS, default 8).
int64_t moe_gemv_max_tokens();
// Whether the grouped paths run the shared experts on a side stream beside the routed ones
// (KILN_MOE_SHARED_BESIDE, read per call: default 1; 0 runs them after, on the op's stream).
bool moe_shared_beside();
// Smallest step (tokens) whose experts run on the wgmma kernels (KILN_MOE_WGMMA_MIN_TOKENS, 256).
int64_t moe_wgmma_min_tokens();
// Smallest uncaptured step (tokens) whose experts run as cuBLASLt GEMMs when the wgmma kernels do
// not take them (KILN_MOE_CUBLAS_MIN_TOKENS, 1024).
int64_t moe_cublas_min_tokens();

}  // namespace kiln::ops::cuda
