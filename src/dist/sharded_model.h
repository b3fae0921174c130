// A DeepseekV3Model split over ranks in one process (DESIGN.md §7): one backend, communicator
// and worker thread per rank, each rank's weights read from the checkpoint as its slices. The
// returned model is rank 0 and owns the others; the engine and the CLI use it exactly as a
// one-device model (every step runs on every rank, rank 0's logits come back).
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
  // Rank r's backend, made on rank r's thread (after thread_init(r), which may choose its GPU).
  std::function<std::unique_ptr<ops::Backend>(int rank)> make_backend;
  std::function<void(int rank)> thread_init;
  // Rank r's communicator, made on rank r's thread after its backend, concurrently on every rank
  // (NCCL's init is a collective), over `host` (a thread group that can carry the NCCL id). Null:
  // the thread group itself (host memory: the CPU backend).
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
