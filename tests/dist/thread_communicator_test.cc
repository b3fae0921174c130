// The thread communicator: every collective at world sizes 1, 2, 3, 4 and 8 with odd counts,
// bitwise equal to the rank-order sums on every rank, and the errors it gives for bad calls.
#include <gtest/gtest.h>

#include <atomic>

#include "collective_expect.h"
#include "core/error.h"
#include "rank_threads.h"

namespace kiln::test {
namespace {

class ThreadCollectives : public ::testing::TestWithParam<int> {};

TEST_P(ThreadCollectives, EveryCollectiveMatchesTheRankOrderResult) {
  for (size_t count : {size_t{1}, size_t{13}, size_t{1001}})
    run_ranks(GetParam(), [&](dist::Communicator& c) {
      const std::string wrong = verify_collectives(c, count);
      if (!wrong.empty()) throw Error("wrong result: " + wrong + " at count " + std::to_string(count));
    });
}

TEST_P(ThreadCollectives, RepeatedCollectivesDoNotMixUpRounds) {
  // Back-to-back all-reduces reuse each rank's buffer at once: a rank that ran ahead would change
  // what a slower peer still reads.
  run_ranks(GetParam(), [](dist::Communicator& c) {
    std::vector<float> buf(5);
    for (int step = 0; step < 200; ++step) {
      for (float& x : buf) x = static_cast<float>(c.rank() + step);
      c.all_reduce(buf.data(), buf.data(), buf.size(), DType::F32);
      const float want = static_cast<float>(c.world_size() * step + c.world_size() * (c.world_size() - 1) / 2);
      for (float x : buf)
        if (x != want) throw Error("step " + std::to_string(step) + ": " + std::to_string(x));
    }
  });
}

TEST_P(ThreadCollectives, BarrierWaitsForEveryRank) {
  std::atomic<int> arrived{0};
  run_ranks(GetParam(), [&](dist::Communicator& c) {
    arrived.fetch_add(1);
    c.barrier();
    if (arrived.load() != c.world_size()) throw Error("left the barrier before every rank arrived");
  });
}

TEST_P(ThreadCollectives, BroadcastBlobReachesEveryRank) {
  run_ranks(GetParam(), [](dist::Communicator& c) {
    const int root = c.world_size() - 1;
    std::vector<uint8_t> blob;
    if (c.rank() == root)
      for (int i = 0; i < 128; ++i) blob.push_back(static_cast<uint8_t>(i * 7 + 1));
    const auto got = dist::broadcast_blob(c, blob, root);
    if (got.size() != 128 || got[5] != 36) throw Error("wrong blob");
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ThreadCollectives, ::testing::Values(1, 2, 3, 4, 8));

TEST(ThreadCommunicator, RanksAndKind) {
  auto comms = dist::make_thread_communicators(3);
  ASSERT_EQ(comms.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(comms[r]->rank(), r);
    EXPECT_EQ(comms[r]->world_size(), 3);
    EXPECT_EQ(comms[r]->kind(), "threads");
  }
  EXPECT_THROW(dist::make_thread_communicators(0), Error);
}

// Every rank fails with the same fault, none hangs.
void expect_all_fail(const std::vector<std::string>& errors, const std::string& needle) {
  for (size_t r = 0; r < errors.size(); ++r)
    EXPECT_NE(errors[r].find(needle), std::string::npos) << "rank " << r << ": '" << errors[r] << "'";
}

TEST(ThreadCommunicator, SumOfAnIntegerTypeFailsOnEveryRank) {
  const auto errors = run_ranks_collect(2, [](dist::Communicator& c) {
    int32_t x = 1;
    c.all_reduce(&x, &x, 1, DType::I32);
  });
  expect_all_fail(errors, "sums F32 or BF16, not I32");
}

TEST(ThreadCommunicator, DifferentCollectivesOnTwoRanksFailOnEveryRank) {
  const auto errors = run_ranks_collect(3, [](dist::Communicator& c) {
    float x[3] = {1, 2, 3};
    if (c.rank() == 1)
      c.broadcast(x, 3, DType::F32, 0);
    else
      c.all_reduce(x, x, 3, DType::F32);
  });
  expect_all_fail(errors,
                  "all_reduce: rank 1 of 3: it called broadcast(3 x F32, root 0) while rank 0 called all_reduce");
}

TEST(ThreadCommunicator, MismatchedCountsFailOnEveryRank) {
  const auto errors = run_ranks_collect(2, [](dist::Communicator& c) {
    std::vector<float> x(4, 1.0f);
    c.all_reduce(x.data(), x.data(), c.rank() == 0 ? 4 : 3, DType::F32);
  });
  expect_all_fail(errors, "all_reduce: rank 1 of 2: it called all_reduce(3 x F32");
}

TEST(ThreadCommunicator, AllToAllCountsThatDisagreeFailOnEveryRank) {
  const auto errors = run_ranks_collect(2, [](dist::Communicator& c) {
    std::vector<int32_t> send(4, 0), recv(8, 0);
    std::vector<size_t> send_counts = {1, 1}, recv_counts = {1, c.rank() == 0 ? size_t{2} : size_t{1}};
    c.all_to_all(send.data(), send_counts, recv.data(), recv_counts, DType::I32);
  });
  expect_all_fail(errors, "all_to_all: rank 0 expects 2 elements from rank 1, which sends it 1");
}

TEST(ThreadCommunicator, WrongNumberOfCountsFailsOnEveryRank) {
  const auto errors = run_ranks_collect(2, [](dist::Communicator& c) {
    std::vector<int32_t> send(4, 0), recv(4, 0);
    std::vector<size_t> send_counts = {1, 1, 1}, recv_counts = {1, 1};
    if (c.rank() == 0) send_counts = {1, 1};
    c.all_to_all(send.data(), send_counts, recv.data(), recv_counts, DType::I32);
  });
  expect_all_fail(errors, "rank 1 of 2: 3 send counts and 2 receive counts given for a group of 2 ranks");
}

TEST(ThreadCommunicator, BroadcastRootOutsideTheGroupFails) {
  const auto errors = run_ranks_collect(2, [](dist::Communicator& c) {
    float x = 0;
    c.broadcast(&x, 1, DType::F32, 2);
  });
  expect_all_fail(errors, "root rank 2 is outside the group of 2 ranks");
}

TEST(ThreadCommunicator, NullBufferFailsOnEveryRank) {
  const auto errors = run_ranks_collect(2, [](dist::Communicator& c) {
    float x = 0;
    c.all_gather(c.rank() == 1 ? nullptr : &x, &x, 1, DType::F32);
  });
  expect_all_fail(errors, "rank 1 of 2: a null send buffer");
}

TEST(ThreadCommunicator, AbortEndsThePeersWaitNamingTheRank) {
  const auto errors = run_ranks_collect(3, [](dist::Communicator& c) {
    if (c.rank() == 2) {
      c.abort("out of memory loading layer 7");
      return;
    }
    c.barrier();
  });
  EXPECT_EQ(errors[2], "");
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(errors[r].find("rank 2 ended the thread group: out of memory loading layer 7"), std::string::npos)
        << errors[r];
}

TEST(ThreadCommunicator, GroupStaysUsableAfterAFailedCollective) {
  run_ranks(2, [](dist::Communicator& c) {
    int32_t x = 1;
    try {
      c.all_reduce(&x, &x, 1, DType::I32);
    } catch (const Error&) {
    }
    const std::string wrong = verify_collectives(c, 3);
    if (!wrong.empty()) throw Error("after a failed call: " + wrong);
  });
}

}  // namespace
}  // namespace kiln::test
