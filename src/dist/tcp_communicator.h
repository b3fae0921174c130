// A communicator across processes over TCP, and the rendezvous that starts it: rank 0 listens on
// the --dist-init-addr address, every other rank connects and introduces itself, and rank 0 lets
// all of them go once the group is whole (or names the ranks that never came when the timeout
// passes). Collectives go through rank 0, which computes every result in rank order, so a
// multi-process group gives the same bits as the thread group. Meant for small messages: the NCCL
// unique id, the scheduler's step, CPU-backend runs in CI; NCCL carries the tensors on GPUs.
//
// Failure handling: a rank whose process exits or is killed closes its sockets, which rank 0 sees
// at once and reports to every survivor as an error naming that rank; a machine that vanishes is
// caught by TCP keepalive; op_timeout_s bounds how long any rank waits for a peer in a collective.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "dist/communicator.h"

namespace kiln::dist {

struct TcpOptions {
  int rank = 0;
  int world_size = 1;
  std::string host = "127.0.0.1";  // rank 0's address: it listens there, the others connect to it
  int port = 29500;
  double rendezvous_timeout_s = 300;  // how long rank 0 waits for the group, and the others for rank 0
  double op_timeout_s = 0;            // bound on one collective's wait for a peer; 0: none (a server idles)
  int keepalive_s = 10;               // how soon a vanished machine is noticed
};

// Runs the rendezvous and returns rank `opts.rank`'s communicator; throws a kiln::Error naming the
// missing or faulty rank when the group cannot be formed.
std::unique_ptr<Communicator> connect_tcp(const TcpOptions& opts);

// Watches the connections of `tcp` (a connect_tcp communicator) from a thread of its own, without
// reading them, and calls lost(rank, why) once when a peer's connection closes or fails: for a
// group whose tensors go over NCCL, where a dead process leaves kernels waiting for ever and
// nothing reads the TCP sockets mid-step (`lost` aborts them), and for an idle rank 0 that would
// otherwise learn of it only at its next step. With grace_s > 0 it waits that long after the
// loss first, and calls nothing if the handle goes meanwhile (the run ended on its own, with its
// own message). The watch ends with the handle, which must go before `tcp` does.
std::shared_ptr<void> watch_peers(Communicator& tcp, std::function<void(int rank, const std::string& why)> lost,
                                  double grace_s = 0);

}  // namespace kiln::dist
