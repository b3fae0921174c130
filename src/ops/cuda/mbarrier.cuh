// Shared-memory transaction barriers (mbarrier, sm_90) and the bulk copy that completes on one:
// a producer thread arms a barrier with the bytes it expects and starts one cp.async.bulk; the
// consumers wait for the barrier's phase to flip, so nobody waits on a whole-CTA barrier.
// A barrier's phase flips when its arrivals (the init count) are in and every expected byte has
// landed; in a ring of `stages` stages, tile j waits on stage j % stages for parity
// (j / stages) & 1.
#pragma once

#include <cstdint>

namespace kiln::ops::cuda {

// Before any other thread uses the barrier: init by one thread, then a CTA barrier.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// After the inits, before a bulk copy may complete on them (the copy engine sees them initialised).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival that also expects `bytes` more of transactions (the bulk copies that complete on it).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
  } while (!done);
}
// [dst, dst + bytes) in shared memory <- [src, src + bytes) in global memory, completing on `bar`;
// both 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void bulk_copy_to_shared(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

}  // namespace kiln::ops::cuda
