// The communicator of one rank of a split model on CUDA (dist/sharded_model.h's make_comm): NCCL
// over one GPU per rank, the id shared over the process's thread group. The model enqueues its
// ops on the backend's stream and NCCL runs on its own, so each collective waits for the
// backend's work before it starts and finishes before the next op is queued: correct, but a host
// sync per collective (and no CUDA graph around them). Putting the collectives on the backend's
// stream is the speed-up that follows.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "dist/communicator.h"
#include "ops/backend.h"

namespace kiln::dist {

std::unique_ptr<Communicator> make_nccl_rank_comm(int rank, int world_size, Communicator& host, ops::Backend& backend);

// The same with the NCCL id already shared (a multi-process run shares it once per process over the
// process group, dist/nccl_id_share.cc) and rank `rank` on CUDA device `device` of its machine.
// `id` is share_nccl_id's NcclId (128 bytes).
std::unique_ptr<Communicator> make_nccl_rank_comm(int rank, int world_size, const std::array<uint8_t, 128>& id,
                                                  int device, ops::Backend& backend);

}  // namespace kiln::dist
