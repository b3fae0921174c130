// y = x · wᵀ through cuBLASLt: bf16 operands, f32 accumulation and output. Activations are f32
// in the model; rounding them to bf16 alone costs ~0.05 mean |Δ logprob| on the parity fixtures,
// so by default x is split into two bf16 parts, x ≈ hi + lo (about 16 bits of mantissa). Up to a
// few hundred rows they are stacked as 2m rows of ONE GEMM (the weights are still read once, which
// is what decode pays for) and summed by a pass; from kAccumulateMinRows, where y and the parts are
// 256-byte aligned, the lo GEMM accumulates into the hi one's y instead. With split activations off
// (--activation-dtype bf16) x is rounded to bf16 once. Where y's rows are 256-byte aligned the GEMM
// writes y itself, an addend entering as its C operand. Producers that can (the input RMSNorm, the
// shared experts' SwiGLU, the MoE's own split) write the parts themselves (BfParts,
// Gemm::linear_parts), saving the split pass; rows known to be bf16 (LinearParams::x_bf16) skip
// the lo part.
// Algorithm choices are cached per shape and output type: Gemm::grouped (the prefill MoE's
// per-expert GEMMs) may store bf16 instead of f32, for consumers that read bf16 activations anyway.
#include <cublasLt.h>

#include <algorithm>
#include <initializer_list>
#include <map>
#include <tuple>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/gemv.h"

#define KILN_CUBLAS_CHECK(expr)                                                                                        \
  do {                                                                                                                 \
    cublasStatus_t st_ = (expr);                                                                                       \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                                  \
      ::kiln::ops::cuda::throw_error("cuBLASLt error " + std::to_string(static_cast<int>(st_)) + " at " __FILE__ ":" + \
                                     std::to_string(__LINE__));                                                        \
  } while (0)

namespace kiln::ops::cuda {
namespace {

// Head h = blockIdx.y of x [m, heads, k] -> out[h] = hi [m, ld] then (split) lo [m, ld], bf16,
// x ≈ hi + lo, columns k..ld - 1 zero; without split, out[h] = hi alone. V columns a thread
// (row_pass_at; k and ld multiples of V, so a vector is all data or all padding).
template <int V>
__global__ void split_bf16_kernel(const float* x, int64_t stride, int64_t head_stride, __nv_bfloat16* out, int64_t m,
                                  int64_t k, int64_t ld, bool split) {
  int64_t r, c;
  if (!row_pass_at(ld, V, r, c)) return;
  float v[V] = {};
  if (c < k) load_vec(x + blockIdx.y * head_stride + r * stride + c, v);
  store_parts_vec(out + blockIdx.y * (split ? 2 : 1) * m * ld + r * ld + c, split ? m * ld : 0, v);
}

// Head h = blockIdx.y: y[i, h, j] = t[h][i, j] + t[h][m + i, j] (halves; else t[h][i, j] alone),
// plus add[i, h, j] (laid out as y) when given: a fused addend costs no pass of its own. V columns
// a thread (row_pass_at).
template <int V>
__global__ void sum_halves_kernel(const float* t, int64_t m, int64_t n, bool halves, float* y, int64_t y_stride,
                                  int64_t y_head_stride, const float* add) {
  int64_t r, c;
  if (!row_pass_at(n, V, r, c)) return;
  const float* th = t + blockIdx.y * (halves ? 2 : 1) * m * n + r * n + c;
  const int64_t o = blockIdx.y * y_head_stride + r * y_stride + c;
  float v[V];
  load_vec(th, v);
  if (halves) {
    float w[V];
    load_vec(th + m * n, w);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] += w[i];
  }
  if (add) {
    float a[V];
    load_vec(add + o, a);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] += a[i];
  }
  store_vec(y + o, v);
}

}  // namespace

void split_bf16(const float* x, int64_t stride, int64_t head_stride, __nv_bfloat16* out, int64_t m, int64_t k,
                int64_t ld, int64_t heads, bool split, cudaStream_t s) {
  if (m == 0) return;
  // 8-byte bf16 stores: out + h * parts * m * ld + r * ld + c stays 8-byte aligned when ld % 4 == 0.
  const bool vec = rows_vec4(k, {stride, head_stride, ld}, {x}) && reinterpret_cast<uintptr_t>(out) % 8 == 0;
  const dim3 grid(row_pass_blocks(m, ld, vec ? 4 : 1), static_cast<unsigned>(heads));
  if (vec)
    split_bf16_kernel<4><<<grid, kRowPassThreads, 0, s>>>(x, stride, head_stride, out, m, k, ld, split);
  else
    split_bf16_kernel<1><<<grid, kRowPassThreads, 0, s>>>(x, stride, head_stride, out, m, k, ld, split);
}

namespace {

void sum_halves(const float* t, int64_t m, int64_t n, int64_t heads, bool halves, float* y, int64_t y_stride,
                int64_t y_head_stride, const float* add, cudaStream_t s) {
  const bool vec = rows_vec4(n, {y_stride, y_head_stride}, {t, y, add});
  const dim3 grid(row_pass_blocks(m, n, vec ? 4 : 1), static_cast<unsigned>(heads));
  if (vec)
    sum_halves_kernel<4><<<grid, kRowPassThreads, 0, s>>>(t, m, n, halves, y, y_stride, y_head_stride, add);
  else
    sum_halves_kernel<1><<<grid, kRowPassThreads, 0, s>>>(t, m, n, halves, y, y_stride, y_head_stride, add);
}

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_size = 64u << 20;
  GrowOnlyScratch xbuf;  // [heads][2m][k] bf16 hi/lo parts of x ([heads][m][k] unsplit)
  GrowOnlyScratch tbuf;  // [heads][2m][n] f32 products of the two parts
  GrowOnlyScratch nbuf;  // [m][k] f32 normalised x of Gemm::linear's input norm (GEMVs, f32 weights)

  // linear_heads, plus add (laid out as y) when given: Gemm::linear's addend; split: hi/lo activations.
  void heads(const LinearHeadsParams& p, const float* add, bool split, cudaStream_t s);
  // The same from x already in bf16 parts (p.x unused; p.x_stride, p.x_head_stride ignored): head
  // h's hi rows at xb + h * parts * m * ldx, [m, ldx], then its lo rows (split).
  void from_parts(const LinearHeadsParams& p, const __nv_bfloat16* xb, int64_t ldx, const float* add, bool split,
                  cudaStream_t s);
  // (rows, n, k, ldb, ldc, heads, batch strides, output type) -> chosen algorithm (ldb < 0: f32
  // operands); the output type matters: a bf16 store is another kernel than an f32 one.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int>,
           cublasLtMatmulAlgo_t>
      algos;

  // c[h] = b[h] · a[h]ᵀ for h < heads: a [n, k] (row-major, heads a_stride elements apart), b [rows, k]
  // rows ldb apart, c [rows, n] rows ldc apart; type: bf16 or f32 operands; c_type: f32 or (bf16
  // operands only) bf16 output, f32 accumulation either way.
  // addend (laid out as c; may be c itself): c = b · aᵀ + addend, through the GEMM's C operand
  // (beta = 1).
  void matmul(cudaDataType_t type, const void* a, int64_t a_stride, const void* b, int64_t ldb, int64_t b_stride,
              void* c, int64_t ldc, int64_t c_stride, int64_t rows, int64_t n, int64_t k, int64_t heads, cudaStream_t s,
              void* ws = nullptr, int64_t algo_rows = 0, cudaDataType_t c_type = CUDA_R_32F,
              const void* addend = nullptr);

  // Side streams for Gemm::grouped and Gemm::fork, each with its own workspace (cuBLASLt
  // workspaces must not be shared by GEMMs that may run at once): the first (fork's) and the fork
  // event made with this object, the others on grouped's first use, on the device current then.
  static constexpr int kSideStreams = 4;
  cudaStream_t side[kSideStreams] = {};
  void* side_ws[kSideStreams] = {};
  cudaEvent_t fork = nullptr, join[kSideStreams] = {};
  // Makes side streams 0..n-1 (and the fork event) where missing.
  void make_side_streams(int n);
  // Frees whatever was made, so a Gemm whose constructor throws part-way leaks nothing.
  ~Impl();
  // Between fork and join (Gemm::fork's contract): only the side stream may run this object's
  // GEMMs, as they share its scratch; grouped, which uses that side stream, not at all.
  bool forked = false;
  void require_usable_on(cudaStream_t s, const char* op) const {
    KILN_REQUIRE(!forked || s == side[0], std::string(op) +
                                              ": between Gemm::fork and Gemm::join only the side stream may run this "
                                              "object's GEMMs (they share its scratch)");
  }
  // Gemm::join's two calls (s waits for side stream 0's work so far), the first error returned.
  cudaError_t join_side(cudaStream_t s) noexcept;
  // The workspace of GEMMs on stream s: a side stream's own, else the main one.
  void* workspace_for(cudaStream_t s) const {
    for (int i = 0; i < kSideStreams; ++i)
      if (side[i] && s == side[i]) return side_ws[i];
    return workspace;
  }
};

void Gemm::Impl::make_side_streams(int n) {
  // Each handle is set only once made: a failure part-way leaves the rest to the next call.
  if (!fork) KILN_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  for (int i = 0; i < n; ++i) {
    if (!side[i]) KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&side[i], cudaStreamNonBlocking));
    if (!join[i]) KILN_CUDA_CHECK(cudaEventCreateWithFlags(&join[i], cudaEventDisableTiming));
    if (!side_ws[i]) KILN_CUDA_CHECK(cudaMalloc(&side_ws[i], workspace_size));
  }
}

void Gemm::Impl::matmul(cudaDataType_t type, const void* a, int64_t a_stride, const void* b, int64_t ldb,
                        int64_t b_stride, void* c, int64_t ldc, int64_t c_stride, int64_t rows, int64_t n, int64_t k,
                        int64_t heads, cudaStream_t s, void* ws, int64_t algo_rows, cudaDataType_t c_type,
                        const void* addend) {
  cublasLtMatmulDesc_t op;
  // Plain CUBLAS_COMPUTE_32F keeps f32 x f32 in full f32 (TF32 needs _FAST_TF32); the PEDANTIC
  // variant picked a ~100x slower kernel (the router gate at 8k tokens took 3.6 ms).
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  // Weights [n, k] row-major = column-major [k, n]: op(A) = Aᵀ gives [n, k]; x and y likewise.
  cublasLtMatrixLayout_t la, lb, lc;
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, type, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, type, static_cast<uint64_t>(k), static_cast<uint64_t>(rows), ldb));
  KILN_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&lc, c_type, static_cast<uint64_t>(n), static_cast<uint64_t>(rows), ldc));
  if (heads > 1) {
    const int32_t count = static_cast<int32_t>(heads);
    for (auto [l, stride] : {std::pair{la, a_stride}, std::pair{lb, b_stride}, std::pair{lc, c_stride}}) {
      KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      KILN_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
  }
  // algo_rows (when set and not `rows`): the algorithm is looked up and cached for that many rows
  // instead (Gemm::grouped buckets expert sizes so that a new routing does not mean a new search).
  if (algo_rows <= 0) algo_rows = rows;
  // Null when a bucket size (r != rows) has no algorithm: the caller then searches the exact size.
  auto algo_for = [&](int64_t r) -> const cublasLtMatmulAlgo_t* {
    const auto key = std::make_tuple(r, n, k, ldb * (type == CUDA_R_32F ? -1 : 1), ldc, heads, a_stride, b_stride,
                                     c_stride, static_cast<int>(c_type));
    auto it = algos.find(key);
    if (it != algos.end()) return &it->second;
    cublasLtMatrixLayout_t qb = lb, qc = lc;  // layouts of r rows for the query
    if (r != rows) {
      KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&qb, type, static_cast<uint64_t>(k), static_cast<uint64_t>(r), ldb));
      KILN_CUBLAS_CHECK(
          cublasLtMatrixLayoutCreate(&qc, c_type, static_cast<uint64_t>(n), static_cast<uint64_t>(r), ldc));
    }
    cublasLtMatmulPreference_t pref;
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &workspace_size, sizeof(workspace_size)));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, op, la, qb, qc, qc, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (r != rows) {
      cublasLtMatrixLayoutDestroy(qb);
      cublasLtMatrixLayoutDestroy(qc);
    }
    if (r != rows && (st != CUBLAS_STATUS_SUCCESS || found == 0)) return nullptr;
    KILN_CUBLAS_CHECK(st);
    KILN_REQUIRE(found > 0, "cuBLASLt has no algorithm for a " + std::to_string(r) + "x" + std::to_string(n) + "x" +
                                std::to_string(k) + " GEMM (" + std::to_string(heads) + " heads)");
    return &algos.emplace(key, res.algo).first->second;
  };
  // C and D share a layout, so an algorithm chosen for beta 0 serves beta 1 too (one cache entry).
  const float alpha = 1.0f, beta = addend ? 1.0f : 0.0f;
  const void* c_in = addend ? addend : c;
  void* w = ws ? ws : workspace_for(s);
  const cublasLtMatmulAlgo_t* algo = algo_for(algo_rows);
  cublasStatus_t st =
      algo ? cublasLtMatmul(handle, op, &alpha, a, la, b, lb, &beta, c_in, lc, c, lc, algo, w, workspace_size, s)
           : CUBLAS_STATUS_NOT_SUPPORTED;
  if (st != CUBLAS_STATUS_SUCCESS && algo_rows != rows)  // the bucket's algorithm does not fit: search this size
    st = cublasLtMatmul(handle, op, &alpha, a, la, b, lb, &beta, c_in, lc, c, lc, algo_for(rows), w, workspace_size, s);
  KILN_CUBLAS_CHECK(st);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
}

Gemm::Impl::~Impl() {
  for (int i = 0; i < kSideStreams; ++i) {  // each made on its own (make_side_streams)
    if (side[i]) cudaStreamDestroy(side[i]);
    if (join[i]) cudaEventDestroy(join[i]);
    cudaFree(side_ws[i]);
  }
  if (fork) cudaEventDestroy(fork);
  cudaFree(workspace);
  if (handle) cublasLtDestroy(handle);
}

Gemm::Gemm() : impl_(std::make_unique<Impl>()) {
  KILN_CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
  KILN_CUDA_CHECK(cudaMalloc(&impl_->workspace, impl_->workspace_size));
  // fork's side stream and workspace now, before the KV cache is sized from the free memory (the
  // MoE forks on its first grouped call, which may come after that, inside a decode graph's capture).
  impl_->make_side_streams(1);
}

Gemm::~Gemm() = default;

void Gemm::linear_heads(const LinearHeadsParams& p, cudaStream_t s) {
  impl_->require_usable_on(s, "linear_heads");
  impl_->heads(p, nullptr, split_, s);
}

void Gemm::Impl::heads(const LinearHeadsParams& p_in, const float* add, bool split, cudaStream_t s) {
  if (p_in.m == 0 || p_in.n == 0 || p_in.heads == 0 || p_in.k == 0) return;
  LinearHeadsParams p = p_in;  // stride 0: the dense [m, heads, k] / [m, heads, n] layout
  if (!p.x_stride) p.x_stride = p.heads * p.k;
  if (!p.y_stride) p.y_stride = p.heads * p.n;
  if (p.w_dtype == DType::BF16 && p.m <= kGemvMaxRows) {  // decode-sized: memory-bound GEMV, ~f32 x (gemv.cu)
    launch_gemv(p, add, s);
    return;
  }
  const int64_t ys = p.y_stride, xs = p.x_stride;
  if (p.w_dtype == DType::F32) {  // f32 weights (tests, the router gate): one plain f32 GEMM per head
    if (!add) {
      matmul(CUDA_R_32F, p.w, p.w_head_stride, p.x, xs, p.x_head_stride, p.y, ys, p.y_head_stride, p.m, p.n, p.k,
             p.heads, s);
      return;
    }
    float* t = tbuf.get<float>(static_cast<size_t>(p.heads * p.m * p.n));  // products, then + add into y
    matmul(CUDA_R_32F, p.w, p.w_head_stride, p.x, xs, p.x_head_stride, t, p.n, p.m * p.n, p.m, p.n, p.k, p.heads, s);
    sum_halves(t, p.m, p.n, p.heads, false, p.y, ys, p.y_head_stride, add, s);
    return;
  }
  KILN_REQUIRE(p.w_dtype == DType::BF16, std::string("linear: unsupported weight dtype ") + dtype_name(p.w_dtype));
  // bf16 weights: every head's x split into hi and lo rows (or rounded once).
  const int64_t parts = split ? 2 : 1;
  auto* xb = xbuf.get<__nv_bfloat16>(static_cast<size_t>(p.heads * parts * p.m * p.k));
  split_bf16(p.x, xs, p.x_head_stride, xb, p.m, p.k, p.k, p.heads, split, s);
  from_parts(p, xb, p.k, add, split, s);
}

// Smallest m whose split halves run as two GEMMs, the lo one accumulating into y through its C
// operand, instead of one GEMM of 2m rows and a pass summing the halves. The two GEMMs read the
// weights twice, which decode batches pay for; past a few hundred rows the GEMM is bound by its
// tensor work and the pass (3 m·n floats through HBM) is what is saved. H200, session 19 run 1,
// every m on two GEMMs against none: prefills with f32 activations +3.1 / +3.9% at 1k tokens and
// +2.5 / +3.7% at 8k; decode batches of 128 slower (7,437 and 8,035 tok/s against 8,317; 256 within
// the spread). 512 lies between the rows measured slower and faster; it was not measured itself.
constexpr int64_t kAccumulateMinRows = 512;

void Gemm::Impl::from_parts(const LinearHeadsParams& p, const __nv_bfloat16* xb, int64_t ldx, const float* add,
                            bool split, cudaStream_t s) {
  const int64_t parts = split ? 2 : 1, ys = p.y_stride, xh = parts * p.m * ldx;
  // The GEMM writes y (and reads add as its C) itself when their rows start 256-byte aligned, as
  // cuBLASLt's heuristics assume by default, and so are the parts it reads (the lo rows too when
  // split: they start m · ldx elements on); else through scratch and a pass, like the halves.
  auto a256 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 256 == 0; };
  const bool y_direct = a256(p.y) && (!add || a256(add)) && ys % 64 == 0 && p.y_head_stride % 64 == 0;
  const bool x_direct = a256(xb) && (p.heads == 1 || xh % 128 == 0) && (!split || a256(xb + p.m * ldx));
  if (y_direct && x_direct && (!split || p.m >= kAccumulateMinRows)) {
    matmul(CUDA_R_16BF, p.w, p.w_head_stride, xb, ldx, xh, p.y, ys, p.y_head_stride, p.m, p.n, p.k, p.heads, s, nullptr,
           0, CUDA_R_32F, add);
    if (split)  // y += lo · wᵀ
      matmul(CUDA_R_16BF, p.w, p.w_head_stride, xb + p.m * ldx, ldx, xh, p.y, ys, p.y_head_stride, p.m, p.n, p.k,
             p.heads, s, nullptr, 0, CUDA_R_32F, p.y);
    return;
  }
  // Both parts as 2m rows of one GEMM (the weights read once), the halves summed (+ add).
  float* t = tbuf.get<float>(static_cast<size_t>(p.heads * parts * p.m * p.n));
  matmul(CUDA_R_16BF, p.w, p.w_head_stride, xb, ldx, xh, t, p.n, parts * p.m * p.n, parts * p.m, p.n, p.k, p.heads, s);
  sum_halves(t, p.m, p.n, p.heads, split, p.y, ys, p.y_head_stride, add, s);
}

void Gemm::linear(const LinearParams& p, cudaStream_t s) {
  impl_->require_usable_on(s, "linear");
  const int64_t xs = p.x_stride ? p.x_stride : p.k, ys = p.y_stride ? p.y_stride : p.n;
  LinearHeadsParams h{p.x, xs, 0, p.w, 0, p.w_dtype, p.y, ys, 0, 1, p.m, p.n, p.k};
  if (!p.norm_weight || p.m == 0 || p.n == 0 || p.k == 0) {
    impl_->heads(h, p.add, split_ && !p.x_bf16, s);  // bf16 x: its lo part would be zero
    return;
  }
  KILN_REQUIRE(p.norm_weight_dtype == DType::F32 || p.norm_weight_dtype == DType::BF16,
               std::string("linear: unsupported norm weight dtype ") + dtype_name(p.norm_weight_dtype));
  // The rms_norm op writes the normalised rows (and the sums it requires) to scratch first: for the
  // tensor-core GEMM as its bf16 parts (no split pass), for the GEMV in f32.
  RmsNormParams n{p.x, xs, p.norm_weight, p.norm_weight_dtype, nullptr, p.k, p.m, p.k, p.norm_eps};
  n.residual = p.norm_residual;
  if (p.w_dtype == DType::BF16 && p.m > kGemvMaxRows) {
    auto* xb = impl_->xbuf.get<__nv_bfloat16>(static_cast<size_t>((split_ ? 2 : 1) * p.m * p.k));
    rms_norm(n, BfParts::stacked(xb, p.m, p.k, split_), s);
    impl_->from_parts(h, xb, p.k, p.add, split_, s);
    return;
  }
  float* xn = impl_->nbuf.get<float>(static_cast<size_t>(p.m * p.k));
  n.out = xn;
  // Measured and left out (session 10): the norm triggering the GEMV before its own wait, so that
  // the GEMV's CTAs take SMs as the MoE down kernel drains (1 / 2 / 8 rows: 2.62-2.68 vs 2.60-2.63,
  // 3.79 vs 3.71-3.73, 10.52-10.64 vs 10.42-10.44 ms per step).
  rms_norm(n, s);
  h.x = xn, h.x_stride = p.k;
  impl_->heads(h, p.add, split_, s);
}

void Gemm::linear_parts(const __nv_bfloat16* x, int64_t ldx, const void* w, float* y, int64_t y_stride, int64_t m,
                        int64_t n, int64_t k, const float* add, bool split, cudaStream_t s) {
  impl_->require_usable_on(s, "linear_parts");
  if (m == 0 || n == 0 || k == 0) return;
  const LinearHeadsParams h{nullptr, 0, 0, w, 0, DType::BF16, y, y_stride ? y_stride : n, 0, 1, m, n, k};
  impl_->from_parts(h, x, ldx, add, split, s);
}

void Gemm::grouped(const Group* groups, int64_t count, int64_t n, int64_t k, int64_t ldx, int64_t ldy, cudaStream_t s,
                   DType y_dtype) {
  KILN_REQUIRE(y_dtype == DType::F32 || y_dtype == DType::BF16,
               std::string("grouped GEMM: unsupported output dtype ") + dtype_name(y_dtype));
  KILN_REQUIRE(!impl_->forked, "grouped GEMM: not between Gemm::fork and Gemm::join (it uses the forked side stream)");
  // bf16 D (and C, unused at beta 0) with f32 compute and scale: the accumulator is rounded once
  // on the store, and the pass after reads half the bytes (the MoE's bf16-activation mode).
  const cudaDataType_t c_type = y_dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  Impl& m = *impl_;
  const int used = static_cast<int>(std::min<int64_t>(count, Impl::kSideStreams));
  m.make_side_streams(used);
  // One expert's GEMM fills only part of the GPU (1,536 doubled rows x 2816 at an 8k prefill are
  // ~130 tiles, some experts far fewer), so
  // consecutive groups go round-robin to side streams that run side by side, forked from and
  // joined back into `s` (the caller sees one ordered op).
  KILN_CUDA_CHECK(cudaEventRecord(m.fork, s));
  for (int i = 0; i < used; ++i) KILN_CUDA_CHECK(cudaStreamWaitEvent(m.side[i], m.fork, 0));
  for (int64_t g = 0; g < count; ++g) {
    const Group& gr = groups[g];
    const int i = static_cast<int>(g % Impl::kSideStreams);
    int64_t bucket = 128;  // the algorithm of the next power of two: a handful of searches per shape
    while (bucket < gr.rows) bucket *= 2;
    m.matmul(CUDA_R_16BF, gr.w, 0, gr.x, ldx, 0, gr.y, ldy, 0, gr.rows, n, k, 1, m.side[i], m.side_ws[i], bucket,
             c_type);
  }
  for (int i = 0; i < used; ++i) {
    KILN_CUDA_CHECK(cudaEventRecord(m.join[i], m.side[i]));
    KILN_CUDA_CHECK(cudaStreamWaitEvent(s, m.join[i], 0));
  }
}

cudaStream_t Gemm::fork(cudaStream_t s) {
  Impl& m = *impl_;
  KILN_REQUIRE(!m.forked, "Gemm::fork: forks do not nest (join the first)");
  m.make_side_streams(1);
  KILN_CUDA_CHECK(cudaEventRecord(m.fork, s));
  KILN_CUDA_CHECK(cudaStreamWaitEvent(m.side[0], m.fork, 0));
  m.forked = true;
  return m.side[0];
}

cudaError_t Gemm::Impl::join_side(cudaStream_t s) noexcept {
  forked = false;  // a failed join leaves nothing to join later
  const cudaError_t e = cudaEventRecord(join[0], side[0]);
  return e != cudaSuccess ? e : cudaStreamWaitEvent(s, join[0], 0);
}

void Gemm::join(cudaStream_t s) {
  KILN_CUDA_CHECK(impl_->join_side(s));
}

void Gemm::join_quietly(cudaStream_t s) noexcept {
  (void)impl_->join_side(s);
}

}  // namespace kiln::ops::cuda
