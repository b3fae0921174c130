// One-shot all-reduce for decode-sized messages between the GPUs of one process (one rank thread
// per GPU, DESIGN.md §7): each rank copies its input into a staging buffer on its own GPU, and one
// kernel per rank reads every rank's staging buffer over NVLink peer access and adds them in rank
// order (in f32, rounding bf16 once), so every rank gets the same bits as the CPU communicators.
// Two flag barriers per block (before reading, and before a buffer may be refilled) replace NCCL's
// protocol; the round counters live in device memory, so the launches can be captured in a CUDA
// graph. A rank that never arrives makes its peers' kernels stop after a bound (a device trap),
// never spin for ever. Ranks in several processes need NCCL (or CUDA IPC, not done here).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "core/dtype.h"

namespace kiln::dist {

class OneShotAllReduce {
 public:
  // `devices[r]` is rank r's GPU; every pair must reach each other's memory (NVLink / P2P), else
  // an error names the pair. Staging buffers hold `max_bytes` per rank. At most 8 ranks.
  OneShotAllReduce(std::vector<int> devices, size_t max_bytes, double peer_timeout_s = 10);
  ~OneShotAllReduce();
  OneShotAllReduce(const OneShotAllReduce&) = delete;
  OneShotAllReduce& operator=(const OneShotAllReduce&) = delete;

  int world_size() const { return static_cast<int>(devices_.size()); }
  size_t max_bytes() const { return max_bytes_; }

  // Rank `rank`'s part, on its thread with its device current: sums `count` elements (F32 or BF16)
  // of `in` over the ranks into `out` (device pointers on its GPU; they may be equal), ordered on
  // `stream` (a cudaStream_t). Every rank must call it with the same count and dtype.
  void all_reduce(int rank, const void* in, void* out, size_t count, DType dtype, void* stream);

 private:
  std::vector<int> devices_;
  size_t max_bytes_;
  double peer_timeout_s_;
  std::vector<void*> staging_;  // per rank, on its GPU
  std::vector<void*> signals_;  // per rank, on its GPU: flags and round counters
};

}  // namespace kiln::dist
