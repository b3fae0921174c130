// Where this process stands in a multi-process run, from the launcher clusters already use or from
// kiln's own flags: OpenMPI's mpirun (OMPI_COMM_WORLD_*), Slurm's srun (SLURM_*), torchrun-style
// variables (RANK, WORLD_SIZE, LOCAL_RANK), or --nnodes / --node-rank by hand. Rank 0's rendezvous
// address comes from --dist-init-addr or MASTER_ADDR / MASTER_PORT. One process runs per node and
// drives that node's GPUs with one thread each (DESIGN.md §7), so "node rank" is the process rank.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "dist/tcp_communicator.h"

namespace kiln::dist {

struct InitAddress {
  std::string host;  // a name, an IPv4 address, or an IPv6 address (given in brackets)
  int port = 0;
};

// Parses "host:port" or "[v6addr]:port"; errors quote the text and say what is wrong.
InitAddress parse_init_address(const std::string& text);

// What the command line said; the defaults mean "not given".
struct LaunchFlags {
  int nnodes = 0;         // --nnodes
  int node_rank = -1;     // --node-rank
  std::string init_addr;  // --dist-init-addr host:port
};

struct LaunchInfo {
  std::string launcher = "single";  // "single", "flags", "openmpi", "slurm" or "torchrun"
  int node_rank = 0;                // this process among all of the run's processes
  int nnodes = 1;
  int local_rank = 0;                    // this process among those on its machine
  std::optional<InitAddress> init_addr;  // rank 0's rendezvous address; absent for one process
};

using Environment = std::map<std::string, std::string>;

// The process's environment, for resolve_launch.
Environment process_environment();

// Combines flags and environment. Flags the launcher contradicts are an error naming both (a
// silent pick would start a group that can never form); so are a rank outside the group and a
// multi-process run without a rendezvous address.
LaunchInfo resolve_launch(const LaunchFlags& flags, const Environment& env);

// The TCP group options for this process (its rank, the group size and rank 0's address).
TcpOptions tcp_options(const LaunchInfo& info, double rendezvous_timeout_s);

// One line for the startup log, e.g. "process 1 of 2 (openmpi, local rank 0), rendezvous at 10.0.0.1:29500".
std::string describe(const LaunchInfo& info);

}  // namespace kiln::dist
