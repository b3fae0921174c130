// Expert parallelism's all-to-all plan (DESIGN.md §7): which token rows each rank computes its
// routed experts for, and where the results go. With attention TP every rank holds every token's
// hidden row and runs the same router, so the plan is computed identically on every rank from the
// replicated top-k ids: no counts need exchanging, and dispatch moves no rows (each rank already
// holds the rows it needs). Token t is owned by rank t / ceil(T / world); the owner receives the
// other ranks' partial expert sums for its tokens, adds them in rank order (deterministic on every
// rank) and the owners' blocks are all-gathered.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kiln {

struct EpDispatchPlan {
  int64_t per = 0;  // tokens per owner block (the last blocks may be short or empty)
  // Tokens this rank's experts serve, ascending (so grouped by owner): the rows it computes and sends.
  std::vector<int32_t> mine;
  std::vector<int64_t> send_rows;  // [world]: rows of `mine` for owner o
  // [world]: for each source rank, the tokens of this rank's block it sends partial sums for,
  // ascending; recv_rows[s] = recv_tokens[s].size().
  std::vector<std::vector<int32_t>> recv_tokens;
  std::vector<int64_t> recv_rows;
  int64_t own_begin = 0, own_end = 0;  // this rank's block of tokens [begin, end)
};

// topk_ids [T, k]: global routed expert ids. Experts split into `ep` equal groups of
// `experts_per_group`; rank s serves group s / (world / ep) (TP inside an expert group shares it).
EpDispatchPlan plan_ep_dispatch(std::span<const int32_t> topk_ids, int64_t T, int64_t k, int rank, int world, int ep,
                                int64_t experts_per_group);

// Rows one token's hidden state makes over the wire under this plan, summed over all ranks:
// partial sums sent to a token's owner by every other rank serving it (dispatch sends none).
int64_t ep_combine_rows_sent(std::span<const int32_t> topk_ids, int64_t T, int64_t k, int world, int ep,
                             int64_t experts_per_group);

}  // namespace kiln
