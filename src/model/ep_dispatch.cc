#include "model/ep_dispatch.h"

#include <algorithm>

#include "core/error.h"

namespace kiln {
namespace {

// Whether token t's top-k touches rank s's expert group.
bool serves(std::span<const int32_t> ids, int64_t t, int64_t k, int group, int64_t per_group) {
  for (int64_t j = 0; j < k; ++j)
    if (ids[static_cast<size_t>(t * k + j)] / per_group == group) return true;
  return false;
}

}  // namespace

EpDispatchPlan plan_ep_dispatch(std::span<const int32_t> ids, int64_t T, int64_t k, int rank, int world, int ep,
                                int64_t per_group) {
  KILN_CHECK(world >= 1 && ep >= 1 && world % ep == 0 && per_group >= 1 && rank >= 0 && rank < world &&
                 static_cast<int64_t>(ids.size()) == T * k,
             "internal: EP dispatch plan for rank {} of {}, ep {}, {} experts a group, {} ids for {}x{}", rank, world,
             ep, per_group, ids.size(), T, k);
  const int moe_tp = world / ep;
  EpDispatchPlan p;
  p.per = (T + world - 1) / world;
  p.send_rows.assign(static_cast<size_t>(world), 0);
  p.recv_rows.assign(static_cast<size_t>(world), 0);
  p.recv_tokens.resize(static_cast<size_t>(world));
  p.own_begin = std::min<int64_t>(T, rank * p.per), p.own_end = std::min<int64_t>(T, (rank + 1) * p.per);
  for (int64_t t = 0; t < T; ++t) {
    if (!serves(ids, t, k, rank / moe_tp, per_group)) continue;
    p.mine.push_back(static_cast<int32_t>(t));
    ++p.send_rows[static_cast<size_t>(t / p.per)];
  }
  for (int s = 0; s < world; ++s)
    for (int64_t t = p.own_begin; t < p.own_end; ++t)
      if (serves(ids, t, k, s / moe_tp, per_group))
        p.recv_tokens[static_cast<size_t>(s)].push_back(static_cast<int32_t>(t));
  for (int s = 0; s < world; ++s)
    p.recv_rows[static_cast<size_t>(s)] = static_cast<int64_t>(p.recv_tokens[static_cast<size_t>(s)].size());
  return p;
}

int64_t ep_combine_rows_sent(std::span<const int32_t> ids, int64_t T, int64_t k, int world, int ep, int64_t per_group) {
  const int moe_tp = world / ep;
  const int64_t per = (T + world - 1) / world;
  int64_t rows = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int s = 0; s < world; ++s)
      if (s != t / per && serves(ids, t, k, s / moe_tp, per_group)) ++rows;
  return rows;
}

}  // namespace kiln
