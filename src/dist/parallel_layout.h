// Which part of the model each rank owns, from the parallel sizes and the model's config
// (DESIGN.md §7): attention heads split by tensor parallelism (TP); routed experts split across
// expert-parallel groups and each expert's intermediate dim across the ranks of a group; shared
// experts, dense MLPs and the vocabulary (embedding rows and lm_head rows) split by TP; decode
// context parallelism (DCP) spreading one sequence's latent KV over the ranks of a DCP group by
// token. Every split is checked up front, each fault named with the numbers that do not divide.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"

namespace kiln::dist {

struct ParallelConfig {
  int world_size = 1;  // ranks (GPUs) in the group
  int tp = 1;          // attention tensor parallelism; equals world_size (no attention data parallelism yet)
  // Expert-parallel size: the routed experts split into `ep` groups, each expert's intermediate dim
  // over the world_size / ep ranks of its group. 1: TP inside every expert; world_size: whole
  // experts per rank (--enable-expert-parallel).
  int ep = 1;
  // How expert parallelism combines the experts' outputs (--ep-combine): false, an all-reduce of
  // every rank's dense partial (the reference); true, an all-to-all of only the rows each rank's
  // experts serve to the tokens' owners, then an all-gather (model/ep_dispatch.h). Needs ep > 1;
  // replicates the shared experts on every rank (each owner runs them over its own tokens).
  bool ep_alltoall = false;
  int dcp = 1;             // decode context parallelism: divides tp; ranks r and r + 1 .. share a DCP group
  int dcp_interleave = 1;  // consecutive tokens stored on one DCP rank before the next takes over
};

// A half-open range [begin, end).
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool contains(int64_t i) const { return i >= begin && i < end; }
  bool operator==(const Range&) const = default;
};

// One rank's share.
struct RankShare {
  int rank = 0;
  Range heads;            // attention heads whose q/kv up-projection rows and o_proj columns it holds
  Range experts;          // routed experts it holds (all of them when ep == 1)
  Range expert_inter;     // rows of each held expert's gate/up (columns of its down) projection
  Range shared_inter;     // the shared experts' intermediate slice (their widths concatenated)
  Range dense_inter;      // the dense layers' MLP intermediate slice
  Range vocab;            // embedding rows and lm_head rows (may be empty on the last ranks)
  int dcp_rank = 0;       // its place in its DCP group
  Range dcp_group_heads;  // the heads its DCP group attends over (its KV slice serves all of them)
};

class ParallelLayout {
 public:
  // Throws a kiln::Error naming the first size that does not fit the model.
  ParallelLayout(const ParallelConfig& parallel, const ModelConfig& model);

  const ParallelConfig& parallel() const { return p_; }
  int heads_per_rank() const { return heads_per_rank_; }
  int64_t experts_per_rank() const { return experts_per_rank_; }
  int64_t vocab_per_rank() const { return vocab_per_rank_; }  // padded: every rank's logits block in a gather
  int64_t vocab_size() const { return m_.vocab_size; }
  RankShare share(int rank) const;
  // The DCP rank that stores the latent KV row of token position `pos`.
  int kv_owner(int64_t pos) const { return static_cast<int>((pos / p_.dcp_interleave) % p_.dcp); }
  // One line per rank for the startup log.
  std::string describe(int rank) const;

 private:
  ParallelConfig p_;
  ModelConfig m_;
  int heads_per_rank_ = 0;
  int64_t experts_per_rank_ = 0, vocab_per_rank_ = 0;
};

}  // namespace kiln::dist
