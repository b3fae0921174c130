// The op interface: one backend (CPU reference, CUDA) implements every op over the params structs
// in params.h. The model forward is written once against this class.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/params.h"

namespace kiln::ops {

// Memory owned by a backend, viewed as a Tensor.
struct OwnedTensor {
  std::shared_ptr<void> mem;
  Tensor t;
  float* f32() const { return t.f32(); }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;

  virtual OwnedTensor alloc(DType dtype, Shape shape) = 0;
  // Copies host bytes into / out of a tensor of this backend.
  virtual void upload(const Tensor& dst, const void* src) = 0;
  virtual void download(void* dst, const Tensor& src) = 0;

  // Weights are converted to this type when loaded.
  virtual DType weight_dtype() const = 0;
  // Element type of the latent KV pool (PagedKv::pool): F32 on the CPU reference, BF16 on CUDA
  // (half the bytes that bandwidth-bound decode attention reads per step).
  virtual DType kv_dtype() const = 0;
  // What the tensor-core GEMMs (prefill-sized linear layers and experts) multiply activations as.
  // F32 (the default): the f32 activation is split into two bf16 parts, hi + lo, so a GEMM keeps
  // ~16 mantissa bits of it at twice the tensor work. BF16: the activation is rounded to bf16
  // once, as vLLM and SGLang do, for twice the rate. Decode-sized GEMVs read f32 activations
  // either way. The CPU reference takes F32 only. Set it before capturing CUDA graphs: a captured
  // step keeps the precision it was recorded with.
  virtual void set_activation_dtype(DType t) = 0;
  virtual DType activation_dtype() const = 0;
  // The same choice for the experts' GEMMs alone (moe()'s routed and shared experts past the
  // decode GEMVs: most of a prefill's tensor work), so they can round while the rest splits.
  // set_activation_dtype sets both; call this after it to override the experts. The CPU reference
  // takes F32 only. Like the other, set it before capturing CUDA graphs.
  virtual void set_expert_activation_dtype(DType t) = 0;
  virtual DType expert_activation_dtype() const = 0;
  // Fills a tensor with uniform(-scale, scale) values from a counter-based hash of `seed`
  // (random-weight benchmarks; no host round trip).
  virtual void fill_random(const Tensor& t, uint64_t seed, float scale) = 0;
  // Memory this backend could still allocate, in bytes (sizes the KV pool after the weights).
  virtual int64_t free_memory_bytes() const = 0;
  // Waits for all queued work (timing).
  virtual void synchronize() {}
  // Starts copying `src` to the host behind the work queued so far, and returns at once;
  // finish_download waits for that copy alone (work queued after it may still run) and hands the
  // bytes to `dst`. The pair lets the engine queue step n+1 before it reads step n's tokens.
  virtual std::shared_ptr<void> start_download(const Tensor& src);
  virtual void finish_download(const std::shared_ptr<void>& started, void* dst);
  // A mark in the device's work queue; elapsed_seconds(a, b) waits for b and returns the device
  // time between the two marks (the host clock on backends that run ops as they are called).
  virtual std::shared_ptr<void> mark();
  virtual double elapsed_seconds(const std::shared_ptr<void>& a, const std::shared_ptr<void>& b);
  // CUDA graphs (decode steps): ops issued between begin_capture() and end_capture() are
  // recorded instead of run, and replay() reruns them on the same buffers. Memory allocated while
  // capturing comes from a pool reserved for graphs, so nothing else can be handed a captured
  // scratch address. A capture that hits an op that cannot be captured (a host sync) throws;
  // call abort_capture() then. Backends without graphs return false from supports_graphs().
  virtual bool supports_graphs() const { return false; }
  virtual void begin_capture() {}
  virtual std::shared_ptr<void> end_capture() { return nullptr; }
  virtual void abort_capture() {}
  virtual void replay(const std::shared_ptr<void>& graph) {}
  // Which implementation serves each op (the startup "kernel plan", DESIGN.md §5).
  virtual std::vector<std::pair<std::string, std::string>> kernel_plan() const = 0;

  virtual void copy(const CopyParams& p) = 0;
  virtual void embedding(const EmbeddingParams& p) = 0;
  virtual void rms_norm(const RmsNormParams& p) = 0;
  virtual void linear(const LinearParams& p) = 0;
  virtual void linear_heads(const LinearHeadsParams& p) = 0;
  // linear_heads(heads) then linear(proj), where proj reads what heads writes (the absorbed
  // attention's W_uv, then o_proj; proj.y must not overlap heads.y): a backend may run them as one
  // (CUDA, one decode row).
  virtual void heads_then_linear(const LinearHeadsParams& heads, const LinearParams& proj) {
    linear_heads(heads);
    linear(proj);
  }
  virtual void add(const AddParams& p) = 0;
  virtual void take_tokens(const TakeTokensParams& p) = 0;
  virtual void swiglu(const SwigluParams& p) = 0;
  virtual void rope(const RopeParams& p) = 0;
  virtual void mla_expanded(const MlaExpandedParams& p) = 0;
  virtual void mla_absorbed(const MlaAbsorbedParams& p) = 0;
  virtual void kv_scatter(const KvScatterParams& p) = 0;
  virtual void kv_gather(const KvGatherParams& p) = 0;
  // rope(q_pe) + the new latent rows (norm, rope) into the pool: one launch per layer (params.h).
  virtual void mla_prepare(const MlaPrepareParams& p) = 0;
  virtual void router(const RouterParams& p) = 0;
  virtual void moe(const MoeParams& p) = 0;
  // The default goes through the host (download, remap, upload): correct on every backend, and
  // what the CPU runs; a device kernel is a later speed-up for expert parallelism on CUDA.
  virtual void expert_slice(const ExpertSliceParams& p);
  // The same host default (decode context parallelism's merge of partial attention).
  virtual void attention_merge(const AttentionMergeParams& p);
  virtual void log_softmax(const LogSoftmaxParams& p) = 0;
  // Token choice per row (params.h SampleParams); never modifies the logits.
  virtual void sample(const SampleParams& p) = 0;
};

std::unique_ptr<Backend> make_cpu_backend();
// The CUDA backend on the current device; throws when this build has no CUDA or no GPU is present.
std::unique_ptr<Backend> make_cuda_backend();
bool cuda_available();
// Makes `device` the calling thread's current GPU (one rank per GPU: each rank's thread chooses
// its own before making its backend); throws in a build without CUDA.
void set_cuda_device(int device);

}  // namespace kiln::ops
