// The CUDA backend: device memory through a caching allocator (the forward allocates scratch
// every step; cudaMalloc/cudaFree there would serialise the GPU), one stream, the kernels in this
// folder and cuBLASLt for GEMMs.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

#include "ops/backend.h"
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/kernel_trace.h"
#include "ops/cuda/op_profile.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/quant/quant_ops.h"

namespace kiln::ops {
namespace {

// Size-bucketed free lists. Blocks are reused in stream order, which is safe on a single stream.
// The backend keeps two: one for eager work and one reserved for CUDA-graph captures, whose
// blocks stay graph scratch for the process's life (a replay writes to the captured addresses).
class CachingAllocator {
 public:
  // may_release: on out-of-memory, free the cached blocks and retry. Never for the graph pool:
  // its cached blocks are scratch that captured graphs still write to.
  explicit CachingAllocator(bool may_release) : may_release_(may_release) {}
  ~CachingAllocator() {
    for (auto& [size, p] : free_) cudaFree(p);
  }
  void* get(size_t bytes, size_t& rounded) {
    rounded = round(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    // Best fit up to half again the size: prefill steps vary in shape from step to step, and an
    // exact-size match left them calling cudaMalloc (which synchronises the device) in steady state.
    auto it = free_.lower_bound(rounded);
    if (it != free_.end() && it->first <= rounded + rounded / 2) {
      void* p = it->second;
      rounded = it->first;  // returned to its own size's list
      free_.erase(it);
      return p;
    }
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, rounded);
    if (err != cudaSuccess && may_release_) {  // release the cache and try once more before giving up
      for (auto& [size, q] : free_) cudaFree(q);
      free_.clear();
      cudaGetLastError();
      err = cudaMalloc(&p, rounded);
    }
    if (err != cudaSuccess) cudaGetLastError();  // not sticky: later launches must not see it
    KILN_CUDA_CHECK(err);
    return p;
  }
  void put(void* p, size_t rounded) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace(rounded, p);
  }

 private:
  static size_t round(size_t b) {
    if (b <= 512) return 512;
    if (b < (1u << 20)) {
      size_t r = 512;
      while (r < b) r <<= 1;
      return r;
    }
    return (b + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  }
  const bool may_release_;
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
};

// Pinned host buffers that small uploads (a step's index arrays, sampling parameters) are
// staged through, so that the copy runs asynchronously and the caller may free its source at
// once: the engine then waits for the device once a step, on the sampled tokens. A slot is reused
// only after the copy that last read it has run (its event).
class PinnedStaging {
 public:
  static constexpr size_t kMaxBytes = size_t{4} << 20;  // larger uploads (weights) copy synchronously
  ~PinnedStaging() {
    for (Slot& s : slots_) {
      if (s.ready) cudaEventDestroy(s.ready);
      if (s.host) cudaFreeHost(s.host);
    }
  }
  void upload(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
    Slot& s = slots_[next_++ % slots_.size()];
    if (s.ready)
      KILN_CUDA_CHECK(cudaEventSynchronize(s.ready));
    else
      KILN_CUDA_CHECK(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming));
    if (s.capacity < bytes) {
      if (s.host) KILN_CUDA_CHECK(cudaFreeHost(s.host));
      s.host = nullptr;
      s.capacity = std::max(bytes, size_t{64} << 10);
      KILN_CUDA_CHECK(cudaMallocHost(&s.host, s.capacity));
    }
    std::memcpy(s.host, src, bytes);
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, stream));
    KILN_CUDA_CHECK(cudaEventRecord(s.ready, stream));
  }

 private:
  struct Slot {
    void* host = nullptr;
    size_t capacity = 0;
    cudaEvent_t ready = nullptr;
  };
  std::array<Slot, 8> slots_{};
  size_t next_ = 0;
};

// Pinned host blocks kept for reuse: pinning memory costs far more than a step's download.
class PinnedPool {
 public:
  ~PinnedPool() {
    for (auto& [size, p] : free_) cudaFreeHost(p);
  }
  void* get(size_t bytes, size_t& got) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.lower_bound(bytes);
    if (it != free_.end()) {
      got = it->first;
      void* p = it->second;
      free_.erase(it);
      return p;
    }
    got = std::max<size_t>(bytes, size_t{64} << 10);
    void* p = nullptr;
    KILN_CUDA_CHECK(cudaMallocHost(&p, got));
    return p;
  }
  void put(void* p, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace(size, p);
  }

 private:
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
};

// A copy to pinned host memory queued on the stream, with the event that says it landed.
struct StartedDownload {
  std::shared_ptr<PinnedPool> pool;
  void* host = nullptr;
  size_t bytes = 0, capacity = 0;
  cudaEvent_t done = nullptr;
  ~StartedDownload() {
    if (done) {
      cudaEventSynchronize(done);  // the copy may still be writing the block
      cudaEventDestroy(done);
    }
    if (host) pool->put(host, capacity);
  }
};

// An event with timing, for the device's busy time between two points of the queue.
struct TimingMark {
  cudaEvent_t event = nullptr;
  ~TimingMark() {
    if (event) cudaEventDestroy(event);
  }
};

class CudaBackend final : public Backend {
 public:
  CudaBackend()
      : alloc_(std::make_shared<CachingAllocator>(true)), graph_alloc_(std::make_shared<CachingAllocator>(false)) {
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    cudaDeviceProp prop{};
    KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    name_ = std::string("cuda (") + prop.name + ")";
    cuda::kernel_trace_begin();
  }
  ~CudaBackend() override {
    profile_.reset();  // prints, while the stream still exists
    cuda::kernel_trace_end();
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::CUDA; }
  std::string name() const override { return name_; }
  DType weight_dtype() const override { return DType::BF16; }
  DType kv_dtype() const override { return DType::BF16; }
  void set_activation_dtype(DType t) override { gemm_.set_split_activations(splits(t, "activation")); }
  DType activation_dtype() const override { return gemm_.split_activations() ? DType::F32 : DType::BF16; }
  void set_expert_activation_dtype(DType t) override {
    gemm_.set_split_expert_activations(splits(t, "expert activation"));
  }
  DType expert_activation_dtype() const override { return gemm_.split_expert_activations() ? DType::F32 : DType::BF16; }
  int64_t free_memory_bytes() const override {
    size_t free = 0, total = 0;
    KILN_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return static_cast<int64_t>(free);
  }

  OwnedTensor alloc(DType dtype, Shape shape) override {
    const size_t n = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
    size_t rounded = 0;
    auto a = capturing_ ? graph_alloc_ : alloc_;
    void* p = a->get(n, rounded);
    OwnedTensor o;
    o.mem = std::shared_ptr<void>(p, [a, rounded](void* q) { a->put(q, rounded); });
    o.t = Tensor{p, dtype, std::move(shape), Device::CUDA};
    return o;
  }
  void upload(const Tensor& dst, const void* src) override {
    if (dst.nbytes() <= PinnedStaging::kMaxBytes) return staging_.upload(dst.data, src, dst.nbytes(), stream_);
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the caller may free `src` right away
  }
  void download(void* dst, const Tensor& src) override {
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void synchronize() override { KILN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  std::shared_ptr<void> start_download(const Tensor& src) override {
    auto d = std::make_shared<StartedDownload>();
    d->pool = pinned_;
    d->bytes = src.nbytes();
    d->host = pinned_->get(d->bytes, d->capacity);
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&d->done, cudaEventDisableTiming));
    KILN_CUDA_CHECK(cudaMemcpyAsync(d->host, src.data, d->bytes, cudaMemcpyDeviceToHost, stream_));
    KILN_CUDA_CHECK(cudaEventRecord(d->done, stream_));
    return d;
  }
  void finish_download(const std::shared_ptr<void>& started, void* dst) override {
    const auto& d = *static_cast<const StartedDownload*>(started.get());
    KILN_CUDA_CHECK(cudaEventSynchronize(d.done));
    std::memcpy(dst, d.host, d.bytes);
  }
  std::shared_ptr<void> mark() override {
    auto m = std::make_shared<TimingMark>();
    KILN_CUDA_CHECK(cudaEventCreate(&m->event));
    KILN_CUDA_CHECK(cudaEventRecord(m->event, stream_));
    return m;
  }
  double elapsed_seconds(const std::shared_ptr<void>& a, const std::shared_ptr<void>& b) override {
    const cudaEvent_t ea = static_cast<const TimingMark*>(a.get())->event,
                      eb = static_cast<const TimingMark*>(b.get())->event;
    KILN_CUDA_CHECK(cudaEventSynchronize(eb));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, ea, eb));
    return ms / 1e3;
  }

  bool supports_graphs() const override { return !profile_; }
  void begin_capture() override {
    KILN_REQUIRE(!capturing_, "begin_capture: a capture is already in progress");
    // Relaxed: kernels may still grow their GrowOnlyScratch (cudaMalloc) while being captured.
    KILN_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    capturing_ = true;
  }
  std::shared_ptr<void> end_capture() override {
    KILN_REQUIRE(capturing_, "end_capture: no capture in progress");
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    KILN_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    KILN_CUDA_CHECK(err);
    return std::shared_ptr<void>(exec, [](void* e) { cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(e)); });
  }
  void abort_capture() override {
    if (!capturing_) return;
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);  // reports the invalidation that brought us here
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
  }
  void replay(const std::shared_ptr<void>& graph) override {
    KILN_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph.get()), stream_));
  }
  void fill_random(const Tensor& t, uint64_t seed, float scale) override {
    KILN_REQUIRE(t.dtype == DType::F32 || t.dtype == DType::BF16,
                 std::string("fill_random: unsupported dtype ") + dtype_name(t.dtype));
    cuda::fill_random(t.data, t.dtype, t.numel(), seed, scale, stream_);
  }
  std::vector<std::pair<std::string, std::string>> kernel_plan() const override {
    const std::string pdl = cuda::pdl_enabled() ? " (programmatic dependent launch)" : " (KILN_PDL=0: plain launches)";
    return {
        {"linear",
         "<=8 rows: kiln bf16 GEMV, residual addend fused (2-8 rows, k % 32 == 0: mma.sync m16n8k16, 16 "
         "weight rows a CTA, their first 2048 columns loaded before the previous kernel ends, the rows as N, "
         "x as bf16 hi + lo; one row, k <= 2048: CUDA cores, each CTA copying its 8 weight rows into shared "
         "memory (cp.async) before the previous kernel ends; otherwise CUDA cores, 4 loads in flight per "
         "lane; f32 activations); more: " +
             gemm_.name() + "; an input RMSNorm runs first as its own kernel, which the GEMV after it overlaps"},
        {"linear_heads", "<=8 rows: the same GEMV over all heads in one launch; more: one batched cuBLASLt GEMM"},
        {"heads_then_linear",
         "one row (the absorbed attention's W_uv, then o_proj), a CTA's rows of both in 48 KB: one cooperative "
         "kernel, both weight tiles copied into shared memory before the previous kernel ends, a grid barrier "
         "between the two GEMVs (KILN_HEADS_LINEAR=0: off); otherwise linear_heads, then linear"},
        {"mla prefill",
         "kiln flash MLA, expanded form, one CTA per (head, 128-query tile), any head count: qk 192 / v 128: "
         "wgmma (sm_90a) over bf16 swizzled K/V^T tile images made once per call from the kv_b_proj output and "
         "the shared k_pe, two warpgroups of 64 queries, f32 softmax and accumulation; other head dims: f32 "
         "CUDA-core 16-query tiles"},
        {"mla decode",
         "kiln paged MLA over the bf16 latent cache, absorbed form, split-KV merged inside the kernel; 576-wide "
         "rows: mma.sync 16-head tiles (tail masked), every stage's KV tile in flight at once and earlier steps' "
         "rows requested before the previous kernel ends (<= 16 heads: 1-2 query rows in thread-block clusters of 8 "
         "CTAs, >= 32 rows a split, their partials merged through distributed shared memory first; 2-8 query rows "
         "4 stages, >= 128 rows a split; more rows 2 stages, >= 64; more heads: two 16-head tiles a CTA, 3 stages, "
         ">= 64 rows); other latent widths: CUDA-core 16-head tiles + a merge kernel"},
        {"mla_prepare",
         "kiln fused attention prologue, one launch: a CTA per token ropes every q head and writes its "
         "latent row (RMSNorm c_kv, rope k_pe) to the pool; absorbed form: the W_uk fold in the same launch at "
         "<=8 tokens (more CTAs, a bf16 GEMV with 16-byte loads over every head), more tokens: the batched "
         "GEMM first"},
        {"router",
         "kiln gate projection + sigmoid + bias + grouped top-k: <=8 tokens one launch of an 8-CTA thread-block "
         "cluster with the post-attention RMSNorm fused in (rank 0 routes from the logits the others store in its "
         "shared memory); more: RMSNorm, a gate GEMV (<=256 tokens) or a 3xTF32 tensor-core "
         "GEMM with H split over CTAs, then a warp per token (summing the slices in order)"},
        {"moe", "<=" + std::to_string(cuda::moe_gemv_max_tokens()) +
                    " tokens: kiln decode GEMVs, routed + shared experts in two launches; more: device-sorted grouped "
                    "mma.sync GEMMs (gate/up + SwiGLU, down; " +
                    (gemm_.split_expert_activations() ? "hi/lo f32 activations" : "bf16-rounded activations") +
                    "; 16-row tiles on the skinny kernel: 512-byte weight rows per stage, k split over warps), shared "
                    "experts via cuBLASLt" +
                    (cuda::moe_shared_beside() ? " on a side stream beside the routed ones" : "") +
                    "; >=" + std::to_string(cuda::moe_wgmma_min_tokens()) +
                    " tokens (widths multiples of 64): the same layout on wgmma kernels (128x256 tiles, 3-4 "
                    "cp.async stages, SwiGLU in the gate/up epilogue; one cuBLASLt GEMM per expert from >=" +
                    std::to_string(cuda::moe_cublas_min_tokens()) +
                    " uncaptured tokens only when KILN_MOE_WGMMA_MIN_TOKENS is raised, for A/Bs)"},
        {"quantized weights",
         "FP8 e4m3 block-scaled and INT4 pack-quantized (group-wise) weights: linear / linear_heads up to " +
             std::to_string(cuda::quant_gemv_max_rows()) +
             " rows: kiln quantized GEMV (a warp per weight row, 16-byte loads decoded in registers, a scale per "
             "chunk, 8 activation rows a launch); more: the weight dequantized to bf16 scratch, then the bf16 "
             "GEMM; moe up to " +
             std::to_string(cuda::quant_moe_gemv_max_tokens()) +
             " tokens: kiln quantized decode kernels (gate/up + SwiGLU, down + combine; shared experts in their "
             "own dtype); more: the experts dequantized to bf16 scratch, then the bf16 moe paths"},
        {"sample", "kiln multi-CTA sampling (row chunks, last-CTA merges): radix-select cuts, Philox draws"},
        {"norm/rope/etc", "kiln elementwise kernels (f32 activations, float4 RMSNorm)"},
        {"launches", "every decode kernel" + pdl}};
  }

  void copy(const CopyParams& p) override {
    run("copy", [&] { cuda::copy(p, stream_); });
  }
  void embedding(const EmbeddingParams& p) override {
    run("embedding", [&] { cuda::embedding(p, stream_); });
  }
  void rms_norm(const RmsNormParams& p) override {
    run("rms_norm", [&] { cuda::rms_norm(p, stream_); });
  }
  void linear(const LinearParams& p) override {
    run([&] { return "linear m" + bucket(p.m) + " " + std::to_string(p.n) + "x" + std::to_string(p.k); },
        [&] { cuda::linear_quantized(p) ? cuda::quant_linear(p, gemm_, stream_) : gemm_.linear(p, stream_); });
  }
  void linear_heads(const LinearHeadsParams& p) override {
    run(
        [&] {
          return "linear_heads m" + bucket(p.m) + " " + std::to_string(p.heads) + "x" + std::to_string(p.n) + "x" +
                 std::to_string(p.k);
        },
        [&] {
          cuda::linear_heads_quantized(p) ? cuda::quant_linear_heads(p, gemm_, stream_)
                                          : gemm_.linear_heads(p, stream_);
        });
  }
  void heads_then_linear(const LinearHeadsParams& heads, const LinearParams& proj) override {
    if (!cuda::heads_linear_fits(heads, proj)) return Backend::heads_then_linear(heads, proj);
    run([&] { return "heads_then_linear m1 " + std::to_string(heads.heads * heads.n) + "+" + std::to_string(proj.n); },
        [&] { cuda::launch_heads_linear(heads, proj, stream_); });
  }
  void add(const AddParams& p) override {
    run("add", [&] { cuda::add(p, stream_); });
  }
  void expert_slice(const ExpertSliceParams& p) override {
    run("expert_slice", [&] { cuda::expert_slice(p, stream_); });
  }
  void attention_merge(const AttentionMergeParams& p) override {
    run("attention_merge", [&] { cuda::attention_merge(p, stream_); });
  }
  void take_tokens(const TakeTokensParams& p) override {
    run("take_tokens", [&] { cuda::take_tokens(p, stream_); });
  }
  void swiglu(const SwigluParams& p) override {
    run("swiglu", [&] { cuda::swiglu(p, stream_); });
  }
  void rope(const RopeParams& p) override {
    run("rope", [&] { cuda::rope(p, stream_); });
  }
  void mla_expanded(const MlaExpandedParams& p) override {
    run("mla_expanded", [&] { cuda::mla_expanded(p, stream_); });
  }
  void mla_absorbed(const MlaAbsorbedParams& p) override {
    KILN_REQUIRE(p.lse == nullptr,
                 "mla_absorbed: the log-sum-exp output (decode context parallelism) has no CUDA kernel yet");
    run("mla_absorbed", [&] { cuda::mla_absorbed(p, stream_); });
  }
  void kv_scatter(const KvScatterParams& p) override {
    run("kv_scatter", [&] { cuda::kv_scatter(p, stream_); });
  }
  void kv_gather(const KvGatherParams& p) override {
    run("kv_gather", [&] { cuda::kv_gather(p, stream_); });
  }
  void mla_prepare(const MlaPrepareParams& p) override {
    run("mla_prepare", [&] { cuda::mla_prepare(p, gemm_, stream_); });
  }
  void router(const RouterParams& p) override {
    run(
        "router", [&] { cuda::router(p, stream_); }, [&] { cuda::router_stand_in(p, stream_); });
  }
  void moe(const MoeParams& p) override {
    run([&] { return "moe m" + bucket(p.num_tokens); }, [&] { cuda::moe(p, gemm_, stream_); });
  }
  void log_softmax(const LogSoftmaxParams& p) override {
    run("log_softmax", [&] { cuda::log_softmax(p, stream_); });
  }
  void sample(const SampleParams& p) override {
    run("sample", [&] { cuda::sample(p, stream_); });
  }

 private:
  // name: the op's name for the profile and KILN_OP_SKIP, a string or a callable making one
  // (built only when either is on); instead: what a skipped op runs (nothing when null).
  template <typename Name, typename F, typename G = std::nullptr_t>
  void run(Name&& name, F&& f, G&& instead = nullptr) {
    if (!profile_ && skip_.empty()) return f();
    std::string n;
    if constexpr (std::is_invocable_v<Name>)
      n = name();
    else
      n = name;
    if (skip_.skips(n)) {
      if constexpr (!std::is_null_pointer_v<std::decay_t<G>>) instead();
      return;
    }
    cuda::OpProfile::Scope scope(profile_.get(), profile_ ? std::move(n) : std::string(), stream_);
    f();
  }
  // Whether GEMMs split activations of dtype t (F32) or round them (BF16); `what` names the setting
  // in errors. Captured graphs keep the precision they were recorded with, so no change mid-capture.
  bool splits(DType t, const std::string& what) const {
    KILN_REQUIRE(t == DType::F32 || t == DType::BF16, what + " dtype must be f32 or bf16, got " + dtype_name(t));
    KILN_REQUIRE(!capturing_, what + " dtype: not while a CUDA graph is being captured");
    return t == DType::F32;
  }
  // Row counts in powers of two, so a profile groups decode and prefill shapes.
  static std::string bucket(int64_t m) {
    int64_t b = 1;
    while (b < m) b <<= 1;
    return "<=" + std::to_string(b);
  }

  std::unique_ptr<cuda::OpProfile> profile_ =
      cuda::OpProfile::requested() ? std::make_unique<cuda::OpProfile>() : nullptr;
  cuda::OpSkip skip_;  // KILN_OP_SKIP, see op_profile.h
  std::shared_ptr<CachingAllocator> alloc_, graph_alloc_;
  bool capturing_ = false;  // allocations come from graph_alloc_
  cudaStream_t stream_ = nullptr;
  PinnedStaging staging_;
  std::shared_ptr<PinnedPool> pinned_ = std::make_shared<PinnedPool>();
  cuda::Gemm gemm_;
  std::string name_;
};

}  // namespace

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void set_cuda_device(int device) {
  int n = 0;
  KILN_REQUIRE(cudaGetDeviceCount(&n) == cudaSuccess && device >= 0 && device < n,
               "GPU " + std::to_string(device) + " is not visible (" + std::to_string(n) + " GPUs)");
  KILN_CUDA_CHECK(cudaSetDevice(device));
}

std::unique_ptr<Backend> make_cuda_backend() {
  KILN_REQUIRE(cuda_available(), "--device cuda: no CUDA GPU is visible");
  return std::make_unique<CudaBackend>();
}

}  // namespace kiln::ops
