// A communicator over threads of one process, one rank per thread: each rank publishes its buffers
// in a shared table, all meet at a barrier, each reads what it needs straight from its peers'
// buffers, and all meet again before anyone may reuse them. Sums add in rank order, so every rank
// holds the same bits. It runs every sharding path on the CPU backend in CI, and is the reference
// the other communicators are tested against.
#pragma once

#include <memory>
#include <vector>

#include "dist/communicator.h"

namespace kiln::dist {

// world_size communicators over one group; element r is rank r's and must be used by one thread.
// The group lives as long as any of its communicators.
std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int world_size);

}  // namespace kiln::dist
