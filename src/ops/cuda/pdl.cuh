// Programmatic dependent launch (Hopper): a decode step is ~250 small kernels, and each one's
// launch, ramp-up and tail used to sit on the critical path. A kernel launched with launch_pdl may
// start while the kernel before it in the stream is still running; it may read only constant data
// (weights: prefetch_l2 them into L2) until pdl_wait() returns, which is when the previous kernel
// has finished and its writes are visible. Every kernel calls pdl_trigger() once it is past its
// own wait, which lets the next kernel launch early; both are no-ops without a programmatic
// dependency, so a kernel may use them however it is launched. KILN_PDL=0 launches everything
// plainly (for A/B measurements).
// Invariant: every kernel triggers only after its own pdl_wait (at least one CTA of every launch
// waits; a CTA may trigger and leave early only if others of its grid still wait). So when a
// kernel starts, every kernel before its immediate predecessor has completed and flushed. The MLA
// decode kernel relies on that: before its wait it reads the launch inputs and KV rows of earlier
// steps (not the rows its predecessor, mla_prepare, writes this step).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "ops/cuda/env.h"

#include "ops/cuda/cuda_common.cuh"

namespace kiln::ops::cuda {

inline bool pdl_enabled() {
  static const bool on = env_int("KILN_PDL", 1) != 0;
  return on;
}

// Waits until the previous kernel in the stream has completed and flushed its writes.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
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

// kernel<<<grid, block, smem, s>>>(args...), allowed to overlap the previous kernel's tail. The
// kernel must call pdl_wait() before it reads anything but constants or writes anything at all;
// the one exception reads data that kernels before its immediate predecessor wrote (see below).
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace kiln::ops::cuda
