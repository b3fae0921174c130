// The ranks of a model split over devices in one process (DESIGN.md §7: one worker thread per
// GPU, SPMD over the same ForwardBatch). Rank 0 is the DeepseekV3Model the engine holds; it owns
// this group, which holds ranks 1..N-1 (their backends and models), every rank's communicator and
// the worker threads that run them. A step runs on every rank at once, rank 0 on the caller's
// thread, and returns when all have finished. Over several processes each process's first rank
// holds the group of its own ranks, and rank 0's group also tells the other processes each pool
// and step (RemoteRanks).
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/communicator.h"
#include "ops/backend.h"

namespace kiln {

class DeepseekV3Model;
struct ForwardBatch;
struct LatentKvPool;

// The ranks of a split model that live in other processes (a multi-process run, DESIGN.md §7):
// rank 0's process tells them every pool it makes and every step it runs, in order, and they
// follow (dist/process_ranks.h). Rank 0 is the only scheduler, so the others need nothing else.
class RemoteRanks {
 public:
  virtual ~RemoteRanks() = default;
  // Makes the matching pool in every other process; the handle names it there, and its end frees
  // those copies (told with the next message, so that no message leaves at an arbitrary moment).
  virtual std::shared_ptr<const int64_t> new_pool(const LatentKvPool& pool) = 0;
  // Sends the step (a MlaForm, as an int) before rank 0's process runs its own share of it.
  virtual void step(const ForwardBatch& batch, const LatentKvPool& pool, int form) = 0;
};

class RankWorkers {
 public:
  // world_size - 1 threads; thread_init(r) runs first on rank r's thread (e.g. choosing its GPU).
  explicit RankWorkers(int world_size, std::function<void(int)> thread_init = {});
  ~RankWorkers();
  RankWorkers(const RankWorkers&) = delete;
  RankWorkers& operator=(const RankWorkers&) = delete;

  int world_size() const { return world_; }
  // Runs fn(r) for every rank r, rank 0 on this thread; returns when every rank has returned. A
  // rank that throws calls on_error(r, message) at once (so that its peers' collectives fail
  // rather than wait for it), and the first rank's error (lowest rank) is rethrown here.
  void run(const std::function<void(int)>& fn, const std::function<void(int, const std::string&)>& on_error = {});

 private:
  void loop(int rank);

  int world_;
  std::function<void(int)> init_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  const std::function<void(int)>* fn_ = nullptr;
  const std::function<void(int, const std::string&)>* on_error_ = nullptr;
  std::vector<std::string> errors_;
  std::vector<std::thread> threads_;
};

struct RankGroup {
  // Members are destroyed bottom up: the threads stop first, then the models, their backends and
  // last the communicators the models point to.
  std::shared_ptr<dist::Communicator> process_comm;  // multi-process: the group of processes (or null)
  std::unique_ptr<RemoteRanks> remote;               // rank 0 of a multi-process run: the other processes
  int first_rank = 0;                                // this process's first rank (comms[i] is rank first_rank + i)
  std::vector<std::unique_ptr<dist::Communicator>> host_comms;  // the thread group NCCL's id came over (or empty)
  std::vector<std::unique_ptr<dist::Communicator>> comms;       // [world]: rank r's
  std::vector<std::unique_ptr<ops::Backend>> backends;          // [world - 1]: ranks 1..
  std::vector<std::unique_ptr<DeepseekV3Model>> peers;          // [world - 1]: ranks 1..
  std::unique_ptr<RankWorkers> workers;
  // Multi-process runs: the watches on the other processes (dist/tcp_communicator.h's
  // watch_peers), ended first, before rank 0 tells the others to stop.
  std::vector<std::shared_ptr<void>> peer_watches;

  // The ranks this process drives (all of them in a one-process run).
  int world_size() const { return static_cast<int>(comms.size()); }
  // workers->run, aborting the failing rank's communicator so that no peer hangs.
  void run(const std::function<void(int)>& fn);
  ~RankGroup();
};

}  // namespace kiln
