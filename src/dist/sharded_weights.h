// One rank's weights of a model split under a ParallelLayout: read straight from the checkpoint,
// each tensor's rows or columns as weight_shard() gives them (a rank touches only its own slices
// of the memory-mapped files; FP8 blocks are dequantised with the scales of the blocks they lie
// in), or random ones of the same shapes for benchmarks. The layouts match what the forward of a
// DeepseekV3Model with model_shard(layout, rank) expects.
#pragma once

#include <cstdint>

#include "dist/communicator.h"
#include "dist/parallel_layout.h"
#include "model/model_shard.h"
#include "model/weights.h"

namespace kiln::dist {

ModelWeights load_rank_weights(const ModelConfig& c, const Checkpoint& ckpt, ops::Backend& be,
                               const ParallelLayout& layout, int rank);

// Projections uniform with unit output variance, norms 1, router biases 0, as random_weights; W_uk
// is the true transpose of the rank's kv_b rows.
ModelWeights random_rank_weights(const ModelConfig& c, ops::Backend& be, const ParallelLayout& layout, int rank,
                                 uint64_t seed);

// What the forward of rank `rank` needs to know about its share; comm may be null only for a
// layout of one rank.
ModelShard model_shard(const ParallelLayout& layout, int rank, Communicator* comm);

}  // namespace kiln::dist
