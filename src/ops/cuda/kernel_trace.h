// A kernel timeline from inside CUDA graphs (KILN_KERNEL_TRACE=file), where neither the op profile
// (events: graphs off) nor Nsight Compute (one kernel at a time) can see how programmatic dependent
// launch overlaps a decode step's kernels. Thread 0 of CTA 0 of every kernel that calls pdl_wait()
// stamps the global timer before and after the wait: "enter" is when CTA 0 reached its wait (after
// whatever it does before it: a kernel that copies weights first was resident earlier than that),
// "release" when the kernel before it had finished and flushed. The difference between
// consecutive releases is each kernel's cost on the step's critical path. scripts/kernel-trace.py
// reads the file. Off (the default), the cost is one constant-memory load and a branch per kernel.
#pragma once

#include <cstdint>

namespace kiln::ops::cuda {

// One record per launch, in a ring indexed by the launch's grid id (no atomics on the GPU); a
// second ring of the same size holds trace_phase() stamps (ctas 0, threads = the phase). A CUDA
// graph's replays reuse their grid ids, so the file holds each graph's last replay (a whole decode
// step) and every eager launch that the ring still holds. A stamp lands one constant-memory load
// (the ring pointer) after the point it marks. Stamps come from thread 0 of CTA 0, or of one other
// CTA a launch names (the MLA decode kernel's last split with rows). A stamp that its CTA does not
// reach in the last replay (the tree kernel's MLA merge, carried by whichever split finishes
// second) keeps an earlier replay's time under the same grid id, so such medians mix replays.
struct KernelTraceRecord {
  uint64_t grid_id;        // %gridid + 1 (0: an empty slot)
  uint64_t name;           // device address of the kernel's name (__builtin_FUNCTION)
  uint64_t enter_ns;       // %globaltimer before griddepcontrol.wait
  uint64_t release_ns;     // ... and after it
  uint64_t ctas, threads;  // grid and block sizes
};
constexpr uint64_t kKernelTraceSlots = uint64_t{1} << 16;  // a power of two

// Each translation unit that includes pdl.cuh has its own copy of the device pointer the kernels
// record through; they register its address at static initialisation, and kernel_trace_begin()
// points them all at one buffer.
bool register_kernel_trace_symbol(const void* symbol);
// If KILN_KERNEL_TRACE is set: allocates the ring on the current device and turns tracing on.
void kernel_trace_begin() noexcept;
// Writes the records (CSV: grid_id, kernel, enter_ns, release_ns, ctas, threads, by enter time)
// to the file KILN_KERNEL_TRACE names, and frees the ring. No-op when tracing is off.
void kernel_trace_end() noexcept;

}  // namespace kiln::ops::cuda
