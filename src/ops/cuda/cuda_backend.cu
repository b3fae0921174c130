// The CUDA backend: device memory through a caching allocator (the forward allocates scratch
// every step; cudaMalloc/cudaFree there would serialise the GPU), one stream, the kernels in this
// folder and cuBLASLt for GEMMs.
#include <map>
#include <mutex>

#include "ops/backend.h"
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace kiln::ops {
namespace {

// Size-bucketed free lists. Blocks are reused in stream order, which is safe on a single stream.
class CachingAllocator {
 public:
  ~CachingAllocator() {
    for (auto& [size, p] : free_) cudaFree(p);
  }
  void* get(size_t bytes, size_t& rounded) {
    rounded = round(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(rounded);
    if (it != free_.end()) {
      void* p = it->second;
      free_.erase(it);
      return p;
    }
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, rounded);
    if (err != cudaSuccess) {  // release the cache and try once more before giving up
      for (auto& [size, q] : free_) cudaFree(q);
      free_.clear();
      cudaGetLastError();
      KILN_CUDA_CHECK(cudaMalloc(&p, rounded));
    }
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
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend() : alloc_(std::make_shared<CachingAllocator>()) {
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    cudaDeviceProp prop{};
    KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    name_ = std::string("cuda (") + prop.name + ")";
  }
  ~CudaBackend() override { cudaStreamDestroy(stream_); }

  Device device() const override { return Device::CUDA; }
  std::string name() const override { return name_; }
  DType weight_dtype() const override { return DType::BF16; }
  int64_t free_memory_bytes() const override {
    size_t free = 0, total = 0;
    KILN_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return static_cast<int64_t>(free);
  }

  OwnedTensor alloc(DType dtype, Shape shape) override {
    const size_t n = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
    size_t rounded = 0;
    void* p = alloc_->get(n, rounded);
    OwnedTensor o;
    auto a = alloc_;
    o.mem = std::shared_ptr<void>(p, [a, rounded](void* q) { a->put(q, rounded); });
    o.t = Tensor{p, dtype, std::move(shape), Device::CUDA};
    return o;
  }
  void upload(const Tensor& dst, const void* src) override {
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the caller may free `src` right away
  }
  void download(void* dst, const Tensor& src) override {
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void synchronize() override { KILN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void fill_random(const Tensor& t, uint64_t seed, float scale) override {
    KILN_REQUIRE(t.dtype == DType::F32 || t.dtype == DType::BF16,
                 std::string("fill_random: unsupported dtype ") + dtype_name(t.dtype));
    cuda::fill_random(t.data, t.dtype, t.numel(), seed, scale, stream_);
  }
  std::vector<std::pair<std::string, std::string>> kernel_plan() const override {
    return {
        {"linear", "<=8 rows: kiln bf16 GEMV (f32 activations); more: " + gemm_.name()},
        {"mla prefill", "kiln flash MLA, expanded form, 16-query x 32-key tiles, one CTA per head (any head count)"},
        {"mla decode", "kiln paged MLA, absorbed form, 16-head tiles (tail masked), split-KV + LSE combine"},
        {"router", "kiln fused sigmoid + bias + grouped top-k (one thread per token)"},
        {"moe", "<=4 tokens: kiln per-slot bf16 GEMV; more: expert-grouped cuBLASLt GEMMs"},
        {"norm/rope/etc", "kiln elementwise kernels (f32 activations)"}};
  }

  void copy(const CopyParams& p) override { cuda::copy(p, stream_); }
  void embedding(const EmbeddingParams& p) override { cuda::embedding(p, stream_); }
  void rms_norm(const RmsNormParams& p) override { cuda::rms_norm(p, stream_); }
  void linear(const LinearParams& p) override { gemm_.linear(p, stream_); }
  void linear_heads(const LinearHeadsParams& p) override { gemm_.linear_heads(p, stream_); }
  void add(const AddParams& p) override { cuda::add(p, stream_); }
  void swiglu(const SwigluParams& p) override { cuda::swiglu(p, stream_); }
  void rope(const RopeParams& p) override { cuda::rope(p, stream_); }
  void mla_expanded(const MlaExpandedParams& p) override { cuda::mla_expanded(p, stream_); }
  void mla_absorbed(const MlaAbsorbedParams& p) override { cuda::mla_absorbed(p, stream_); }
  void kv_scatter(const KvScatterParams& p) override { cuda::kv_scatter(p, stream_); }
  void kv_gather(const KvGatherParams& p) override { cuda::kv_gather(p, stream_); }
  void router(const RouterParams& p) override { cuda::router(p, stream_); }
  void moe(const MoeParams& p) override { cuda::moe(p, gemm_, stream_); }
  void log_softmax(const LogSoftmaxParams& p) override { cuda::log_softmax(p, stream_); }

 private:
  std::shared_ptr<CachingAllocator> alloc_;
  cudaStream_t stream_ = nullptr;
  cuda::Gemm gemm_;
  std::string name_;
};

}  // namespace

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::unique_ptr<Backend> make_cuda_backend() {
  KILN_REQUIRE(cuda_available(), "--device cuda: no CUDA GPU is visible");
  return std::make_unique<CudaBackend>();
}

}  // namespace kiln::ops
