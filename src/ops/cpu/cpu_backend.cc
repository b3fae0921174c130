// The CPU backend: host memory and the reference ops.
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/sysinfo.h"
#include "ops/backend.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/sampling.h"

namespace kiln::ops {
namespace {

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::CPU; }
  std::string name() const override { return "cpu"; }

  OwnedTensor alloc(DType dtype, Shape shape) override {
    const size_t n = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
    const size_t rounded = std::max<size_t>(64, (n + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, rounded);
    KILN_CHECK(p != nullptr, "out of host memory allocating {} bytes for a {} tensor {}", n, dtype_name(dtype),
               shape_str(shape));
    std::memset(p, 0, rounded);
    OwnedTensor o;
    o.mem = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
    o.t = Tensor{p, dtype, std::move(shape), Device::CPU};
    return o;
  }
  void upload(const Tensor& dst, const void* src) override { std::memcpy(dst.data, src, dst.nbytes()); }
  void download(void* dst, const Tensor& src) override { std::memcpy(dst, src.data, src.nbytes()); }

  DType weight_dtype() const override { return DType::F32; }
  DType kv_dtype() const override { return DType::F32; }
  void set_activation_dtype(DType t) override {
    KILN_CHECK(t == DType::F32, "the CPU reference keeps f32 activations (bf16 activations are a CUDA option), got {}",
               dtype_name(t));
  }
  DType activation_dtype() const override { return DType::F32; }
  void set_expert_activation_dtype(DType t) override {
    KILN_CHECK(t == DType::F32,
               "the CPU reference keeps f32 expert activations (bf16 activations are a CUDA option), got {}",
               dtype_name(t));
  }
  DType expert_activation_dtype() const override { return DType::F32; }
  int64_t free_memory_bytes() const override { return host_available_bytes(); }
  void fill_random(const Tensor& t, uint64_t seed, float scale) override { cpu::fill_random(t, seed, scale); }
  std::vector<std::pair<std::string, std::string>> kernel_plan() const override {
    return {{"all ops", "CPU reference (f32; OpenBLAS GEMM, OpenMP loops)"},
            {"mla_prepare", "CPU reference: copy, rope, rms_norm, rope and kv_scatter composed"},
            {"quantized weights",
             "FP8 block-scaled and INT4 group-wise weights dequantized exactly to f32 in "
             "row panels, then the f32 GEMM"}};
  }

  void copy(const CopyParams& p) override { cpu::copy(p); }
  void embedding(const EmbeddingParams& p) override { cpu::embedding(p); }
  void rms_norm(const RmsNormParams& p) override { cpu::rms_norm(p); }
  void linear(const LinearParams& p) override { cpu::linear(p); }
  void linear_heads(const LinearHeadsParams& p) override { cpu::linear_heads(p); }
  void add(const AddParams& p) override { cpu::add(p); }
  void take_tokens(const TakeTokensParams& p) override { cpu::take_tokens(p); }
  void swiglu(const SwigluParams& p) override { cpu::swiglu(p); }
  void rope(const RopeParams& p) override { cpu::rope(p); }
  void mla_expanded(const MlaExpandedParams& p) override { cpu::mla_expanded(p); }
  void mla_absorbed(const MlaAbsorbedParams& p) override { cpu::mla_absorbed(p); }
  void kv_scatter(const KvScatterParams& p) override { cpu::kv_scatter(p); }
  void kv_gather(const KvGatherParams& p) override { cpu::kv_gather(p); }
  void mla_prepare(const MlaPrepareParams& p) override { cpu::mla_prepare(p); }
  void router(const RouterParams& p) override { cpu::router(p); }
  void moe(const MoeParams& p) override { cpu::moe(p); }
  void log_softmax(const LogSoftmaxParams& p) override { cpu::log_softmax(p); }
  void sample(const SampleParams& p) override { cpu::sample(p); }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<CpuBackend>();
}

#ifndef KILN_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend() {
  fail("--device cuda: this kiln was built without CUDA (configure with nvcc present or -DKILN_CUDA=ON)");
}
bool cuda_available() {
  return false;
}
void set_cuda_device(int device) {
  fail("GPU {}: this kiln was built without CUDA", device);
}
#endif

}  // namespace kiln::ops
