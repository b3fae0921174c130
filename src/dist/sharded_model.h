// A DeepseekV3Model split over ranks (DESIGN.md §7): one backend, communicator and worker thread
// per rank of this process, each rank's weights read from the checkpoint as its slices. The
// returned model is this process's first rank and owns the others; in rank 0's process the engine
// and the CLI use it exactly as a one-device model (every step runs on every rank, rank 0's logits
// come back). Over several processes each loads its own ranks, and rank 0's model sends the others
// its pools and steps (dist/process_ranks.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/parallel_layout.h"
#include "model/deepseek_v3.h"

namespace kiln::dist {

struct ShardedModelOptions {
  ParallelConfig parallel;
  // A multi-process run: this process drives ranks first_rank .. first_rank + local_ranks - 1 of
  // parallel.world_size (local_ranks 0: all of them), and process_comm joins it to the others'
  // processes (rank 0's process then sends them every pool and step: dist/process_ranks.h).
  int first_rank = 0, local_ranks = 0;
  std::shared_ptr<Communicator> process_comm;
  // Abort the ranks' communicators when another process's connection closes (watch_peers): for
  // NCCL, whose kernels would wait for a dead process for ever. The CPU's TCP groups see it anyway.
  bool watch_process_peers = false;
  // Called (from a watch thread) when another process's connection has closed and this run has
  // not ended within 2 s on its own: how an idle rank 0 ends a run that can take no more steps.
  std::function<void(int rank, const std::string& why)> on_peer_lost;
  // The backend of this process's i-th rank, made on that rank's thread (after thread_init(i),
  // which may choose its GPU).
  std::function<std::unique_ptr<ops::Backend>(int local)> make_backend;
  std::function<void(int local)> thread_init;
  // The communicator of rank `rank` (of the whole group), made on its thread after its backend,
  // concurrently on every local rank (NCCL's init is a collective), with `host` this process's
  // thread group (which can carry the NCCL id). Null: the thread group itself (host memory: the
  // CPU backend in one process).
  std::function<std::unique_ptr<Communicator>(int rank, Communicator& host, ops::Backend& backend)> make_comm;
  bool random_weights = false;  // random slices of the checkpoint's shapes (`dir` may be empty)
  uint64_t seed = 0;
};

struct ShardedModel {
  std::unique_ptr<ops::Backend> backend;  // rank 0's (declared first: the model goes before it)
  std::unique_ptr<DeepseekV3Model> model;
};

// Throws a kiln::Error naming the first parallel size that does not fit the model, or the first
// rank that failed to load.
ShardedModel load_sharded_model(const ModelConfig& config, const std::string& dir, const ShardedModelOptions& options);

}  // namespace kiln::dist
