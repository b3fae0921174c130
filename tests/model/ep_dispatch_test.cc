// The all-to-all plan of expert parallelism (model/ep_dispatch.h): each rank computes only the
// tokens its experts serve, each owner expects exactly what the others send it, a token whose
// every choice lies on one rank goes to that rank alone, and blocks may be short or empty.
#include "model/ep_dispatch.h"

#include <gtest/gtest.h>

#include <vector>

namespace kiln {
namespace {

// Every rank's plan; checks that rank s's send to o equals o's receive from s.
std::vector<EpDispatchPlan> plans(const std::vector<int32_t>& ids, int64_t T, int64_t k, int world, int ep,
                                  int64_t per_group) {
  std::vector<EpDispatchPlan> out;
  for (int r = 0; r < world; ++r) out.push_back(plan_ep_dispatch(ids, T, k, r, world, ep, per_group));
  for (int s = 0; s < world; ++s)
    for (int o = 0; o < world; ++o) EXPECT_EQ(out[s].send_rows[o], out[o].recv_rows[s]) << "rank " << s << " to " << o;
  return out;
}

TEST(EpDispatch, ATokenOnOneRankGoesThereAlone) {
  // EP2 with 4 experts a rank, top-3: token 0 picks 0, 1, 3 (all rank 0), token 1 picks 4, 5, 7
  // (all rank 1), token 2 picks 2, 6, 1 (both ranks).
  const std::vector<int32_t> ids = {0, 1, 3, 4, 5, 7, 2, 6, 1};
  const auto p = plans(ids, 3, 3, 2, 2, 4);
  EXPECT_EQ(p[0].mine, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(p[1].mine, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(p[0].per, 2);  // rank 0 owns tokens 0 and 1, rank 1 token 2
  EXPECT_EQ(p[0].recv_tokens[1], (std::vector<int32_t>{1}));
  EXPECT_EQ(p[1].recv_tokens[0], (std::vector<int32_t>{2}));
  // Off-rank rows: token 1 from rank 1 to owner 0, token 2 from rank 0 to owner 1.
  EXPECT_EQ(ep_combine_rows_sent(ids, 3, 3, 2, 2, 4), 2);
}

TEST(EpDispatch, FewerTokensThanRanksAndTpInsideGroups) {
  // World 4, EP2 (ranks 0-1 share experts 0..2, ranks 2-3 experts 3..5), one token picking 1, 4.
  const std::vector<int32_t> ids = {1, 4};
  const auto p = plans(ids, 1, 2, 4, 2, 3);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(p[r].mine, (std::vector<int32_t>{0})) << r;
  EXPECT_EQ(p[0].own_end - p[0].own_begin, 1);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(p[r].own_end, p[r].own_begin) << "rank " << r << " owns nothing";
  EXPECT_EQ(p[0].recv_rows, (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(ep_combine_rows_sent(ids, 1, 2, 4, 2, 3), 3);
}

TEST(EpDispatch, NoTokens) {
  const auto p = plans({}, 0, 2, 2, 2, 2);
  EXPECT_TRUE(p[0].mine.empty());
  EXPECT_EQ(p[1].own_end - p[1].own_begin, 0);
}

}  // namespace
}  // namespace kiln
