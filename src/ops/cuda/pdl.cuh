// Programmatic dependent launch (Hopper): a decode step is ~250 small kernels, and each one's
// launch, ramp-up and tail used to sit on the critical path. A kernel launched with launch_pdl may
// start while the kernel before it in the stream is still running; it may read only constant data
// (weights: prefetch_l2 them into L2) until pdl_wait() returns, which is when the previous kernel
// has finished and its writes are visible. Kernels call pdl_trigger() once past their own wait
// (a plainly launched one may call it at once), which lets the next kernel launch early; a kernel
// that never calls it lets the next one launch when it exits. Both are no-ops without a programmatic
// dependency, so a kernel may use them however it is launched. KILN_PDL=0 launches everything
// plainly (for A/B measurements).
// Invariant: every kernel triggers only after its own pdl_wait (at least one CTA of every launch
// waits; a CTA may trigger and leave early only if others of its grid still wait). So when a
// kernel starts, every kernel before its immediate predecessor has completed and flushed. The MLA
// decode kernel relies on that: before its wait it reads the launch inputs and KV rows of earlier
// steps (not the rows its predecessor, mla_prepare, writes this step); so does the prefill MoE down
// GEMM (moe_wgmma.cu), which reads the expert layout. A kernel launched plainly starts after
// everything before it is done, so it may trigger at once (the MoE gate/up GEMM before it does).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "ops/cuda/env.h"

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/kernel_trace.h"

namespace kiln::ops::cuda {

// pdl_wait() and trace_phase() record through this translation unit's own pointer to the kernel
// trace ring, so they live in its anonymous namespace with it.
namespace {
// This translation unit's pointer to the kernel trace ring (kernel_trace.h); null: not tracing.
// Constant memory: every pdl_wait and trace_phase reads it (thread 0 of CTA 0), traced or not; a
// global load could stall that warp for an L2 round trip at every stamp, the constant cache
// should not. Whole steps did not measurably change (H200 session 13, run 3).
__constant__ KernelTraceRecord* g_kernel_trace = nullptr;
[[maybe_unused]] const bool g_kernel_trace_registered = register_kernel_trace_symbol(&g_kernel_trace);

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint64_t grid_id() {
  uint64_t id;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(id));
  return id;
}

// Waits until the previous kernel in the stream has completed and flushed its writes. `kernel`
// names the caller in the kernel trace.
__device__ __forceinline__ void pdl_wait(const char* kernel = __builtin_FUNCTION()) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Only thread 0 of CTA 0 loads the ring pointer: the branch keeps the load out of the others.
  KernelTraceRecord* trace = nullptr;
  uint64_t enter = 0;
  if ((threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) == 0) {
    trace = g_kernel_trace;
    if (trace) enter = global_timer_ns();
  }
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  if (trace) {
    const uint64_t id = grid_id();
    KernelTraceRecord& r = trace[id & (kKernelTraceSlots - 1)];
    r = KernelTraceRecord{id + 1,
                          reinterpret_cast<uint64_t>(kernel),
                          enter,
                          global_timer_ns(),
                          uint64_t{gridDim.x} * gridDim.y * gridDim.z,
                          uint64_t{blockDim.x} * blockDim.y * blockDim.z};
  }
#else
  (void)kernel;
#endif
}

// Kernel trace: thread 0 of CTA 0 stamps the time it reaches phase `phase` (0-7) of the kernel, to
// split a kernel's time on the critical path (kernel_trace.h).
// `this_cta` stamps from thread 0 of the calling CTA instead; if several CTAs of a launch pass true
// for one phase, the last to stamp wins.
__device__ __forceinline__ void trace_phase(int phase, bool this_cta = false) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if ((threadIdx.x | threadIdx.y | threadIdx.z) != 0 || (!this_cta && (blockIdx.x | blockIdx.y | blockIdx.z) != 0))
    return;
  KernelTraceRecord* trace = g_kernel_trace;
  if (!trace) return;
  const uint64_t id = grid_id();
  const uint64_t t = global_timer_ns();
  trace[kKernelTraceSlots + ((id * 8 + phase) & (kKernelTraceSlots - 1))] =
      KernelTraceRecord{id + 1, 0, t, t, 0, static_cast<uint64_t>(phase)};
#endif
}
}  // namespace

inline bool pdl_enabled() {
  static const bool on = env_int("KILN_PDL", 1) != 0;
  return on;
}

// Lets the next kernel in the stream start launching (once every CTA here has called it or exited).
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}

// Starts pulling [p, p + bytes) into L2 without waiting; p 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// kernel<<<grid, block, smem, s>>>(args...), allowed to overlap the previous kernel's tail, with
// one more launch attribute when `extra` is set (a cluster shape, a cooperative launch), which
// stays when KILN_PDL=0. The kernel must call pdl_wait() before it reads anything but constants or
// writes anything at all; the exceptions read data that kernels before its immediate predecessor
// wrote (the invariant above).
template <typename... Params, typename... Args>
void launch_pdl_with(const cudaLaunchAttribute* extra, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                     cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attrs[2]{};
  unsigned n = 0;
  if (extra) attrs[n++] = *extra;
  if (pdl_enabled()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  launch_pdl_with(nullptr, kernel, grid, block, smem, s, std::forward<Args>(args)...);
}

}  // namespace kiln::ops::cuda
