// The GPU communicator: NCCL over one GPU per rank, its collectives enqueued on the communicator's
// stream (the buffers are device pointers). A watchdog thread polls NCCL's asynchronous error state
// and aborts the communicator when a peer fails, so that kernels waiting on a dead rank return
// instead of hanging; abort() does the same on request (when the host group learns a rank died).
// Only in builds with CUDA and NCCL; elsewhere connect_nccl says so.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "dist/communicator.h"

namespace kiln::dist {

// NCCL's ncclUniqueId (128 bytes), made on rank 0 and given to the others (broadcast_blob).
using NcclId = std::array<uint8_t, 128>;

struct NcclOptions {
  int rank = 0;
  int world_size = 1;
  int device = 0;               // CUDA device of this rank
  double init_timeout_s = 300;  // bound on forming the communicator (a rank that never joins)
  double watchdog_period_s = 0.05;
};

class NcclCommunicator : public Communicator {
 public:
  // The cudaStream_t the collectives are ordered on (owned by the communicator).
  virtual void* stream() const = 0;
  // Waits for the enqueued collectives; throws (naming the failure) if the communicator was aborted
  // or NCCL reported an error meanwhile, rather than waiting for ever.
  virtual void synchronize() = 0;
};

bool nccl_available();  // built with NCCL (a GPU may still be absent)
NcclId make_nccl_id();  // on rank 0
std::unique_ptr<NcclCommunicator> connect_nccl(const NcclOptions& opts, const NcclId& id);

// Rank 0 makes the id and `host_comm` (the process group that formed over TCP, or the thread
// group) carries it to every rank.
NcclId share_nccl_id(Communicator& host_comm);

}  // namespace kiln::dist
