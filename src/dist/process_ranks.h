// A split model over several processes (DESIGN.md §7: one process per node, rank 0 schedules).
// Rank 0's process keeps the scheduler and the engine; before each pool it makes and each step it
// runs, it broadcasts the same over the process group, and every other process runs a worker loop
// that makes the matching pool and runs its ranks' share of the step (their collectives meet rank
// 0's in the forward). The loop ends when rank 0's model goes: a clean end says "stop", an end by
// an exception aborts the group, so that the workers exit with an error instead of a success.
#pragma once

#include <memory>

#include "dist/communicator.h"
#include "model/deepseek_v3.h"
#include "model/rank_group.h"

namespace kiln::dist {

// Rank 0's side, over `process_comm` (one rank per process, rank 0 here); `rank0` is the backend
// whose precision settings the other processes' ranks copy.
std::unique_ptr<RemoteRanks> make_process_ranks(Communicator& process_comm, ops::Backend& rank0);

// Every other process: follows rank 0's pools and steps on `model` (this process's first rank,
// holding the group of its ranks) until rank 0 says stop. Throws a kiln::Error naming the rank
// when a step fails or a peer goes.
void run_rank_worker(DeepseekV3Model& model, Communicator& process_comm);

// A communicator that forwards to `c` without owning it: a rank whose process holds one rank uses
// the process group itself for the model's collectives.
std::unique_ptr<Communicator> borrow_communicator(Communicator& c);

}  // namespace kiln::dist
