// One rank's part of a model split over ranks (DESIGN.md §7), as the forward sees it: how many
// attention heads, which routed experts and which vocabulary rows its weights hold, and the group
// it sums partial results over. The default is the whole model on one device: no communicator,
// and the forward calls no collective.
#pragma once

#include <cstdint>

namespace kiln::dist {
class Communicator;  // dist/communicator.h; the model calls its interface only
}

namespace kiln {

struct ModelShard {
  dist::Communicator* comm = nullptr;  // null: one rank (TP1)
  int rank = 0, world = 1;
  int64_t heads = 0;                      // attention heads held (their q/kv_b rows, o_proj columns); 0: all
  int64_t expert_begin = 0, experts = 0;  // routed experts held, whole or an intermediate slice; 0: all
  // Embedding and lm_head rows [vocab_begin, vocab_begin + vocab_rows); lm_head is padded with zero
  // rows to vocab_per_rank so every rank's logits block has one width for the gather. 0: all.
  int64_t vocab_begin = 0, vocab_rows = 0, vocab_per_rank = 0;
  // Decode context parallelism over every rank of the group (dcp == world): token position p's
  // latent row lives only on rank p % dcp, at the sequence's local index p / dcp (its own block
  // table's first slots); other ranks write it to one spare row past the pool's slots. Each rank
  // attends over its own rows for every rank's heads and the parts merge by log-sum-exp.
  int dcp = 1, dcp_rank = 0;
  // Expert parallelism's combine (model/ep_dispatch.h): false sums every rank's partial [T, H] by
  // all-reduce; true sends each rank's routed partials only for the tokens its experts serve to the
  // token's owner (all-to-all), the owner adds the (replicated) shared experts and the residual, and
  // the owners' blocks are all-gathered. `ep` expert groups of `experts` each (TP inside a group).
  bool ep_alltoall = false;
  int ep = 1;

  bool sharded() const { return comm != nullptr; }
};

}  // namespace kiln
