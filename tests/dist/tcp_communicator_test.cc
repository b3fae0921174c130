// The TCP communicator across processes on loopback: the same bits as the thread group, and every
// way a group can fail (a killed rank, a rank that never comes, a misconfigured one, an abort, a
// hung peer) ending each surviving rank with an error that names the rank at fault.
#include <gtest/gtest.h>

#include <signal.h>

#include <condition_variable>
#include <limits>
#include <mutex>

#include "child_process.h"
#include "collective_expect.h"
#include "core/error.h"
#include "dist/socket.h"
#include "dist/tcp_communicator.h"
#include "test_util.h"

namespace kiln::test {
namespace {

using namespace std::chrono_literals;

dist::TcpOptions options(int rank, int world, int port) {
  dist::TcpOptions o;
  o.rank = rank;
  o.world_size = world;
  o.host = "127.0.0.1";
  o.port = port;
  o.rendezvous_timeout_s = 20;
  return o;
}

void verify_or_throw(dist::Communicator& c) {
  for (size_t count : {size_t{1}, size_t{13}, size_t{1001}}) {
    const std::string wrong = verify_collectives(c, count);
    if (!wrong.empty()) throw Error("wrong result: " + wrong);
  }
}

class TcpCollectives : public ::testing::TestWithParam<int> {};

// Rank 0 here, the others in child processes: all check the rank-order results bit for bit.
TEST_P(TcpCollectives, ProcessesGiveTheRankOrderResults) {
  const int world = GetParam(), port = free_port();
  std::vector<Child> children;
  for (int r = 1; r < world; ++r)
    children.push_back(spawn_child([&, r] { verify_or_throw(*dist::connect_tcp(options(r, world, port))); }));
  auto comm = dist::connect_tcp(options(0, world, port));
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), world);
  EXPECT_EQ(comm->kind(), "tcp");
  EXPECT_NO_THROW(verify_or_throw(*comm));
  for (int r = 1; r < world; ++r) {
    const ChildEnd end = wait_child(children[r - 1], 60s);
    EXPECT_EQ(end.exit_code, 0) << "rank " << r << ": " << end.message;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, TcpCollectives, ::testing::Values(1, 2, 3));

TEST(TcpCommunicator, KilledRankIsNamedOnEverySurvivor) {
  const int port = free_port();
  // Rank 2 joins and then waits for ever; rank 0 (a child) and rank 1 (here) run an all-reduce
  // after rank 2 is killed, so neither can finish it.
  Child rank2 = spawn_child([&] {
    auto c = dist::connect_tcp(options(2, 3, port));
    pause();
  });
  Child rank0 = spawn_child([&] {
    auto c = dist::connect_tcp(options(0, 3, port));
    float x = 1;
    c->all_reduce(&x, &x, 1, DType::F32);
  });
  auto comm = dist::connect_tcp(options(1, 3, port));
  kill_child(rank2);
  float x = 1;
  try {
    comm->all_reduce(&x, &x, 1, DType::F32);
    ADD_FAILURE() << "the all-reduce finished without rank 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 exited or was killed"), std::string::npos) << e.what();
  }
  const ChildEnd end = wait_child(rank0, 30s);
  EXPECT_EQ(end.exit_code, 1);
  EXPECT_NE(end.message.find("all_reduce #1: rank 2 exited or was killed"), std::string::npos) << end.message;
  // The group is over: later calls fail at once with the same reason.
  EXPECT_THROW(comm->barrier(), Error);
}

TEST(TcpCommunicator, KilledRankZeroIsNamed) {
  const int port = free_port();
  Child rank0 = spawn_child([&] {
    auto c = dist::connect_tcp(options(0, 2, port));
    pause();
  });
  auto comm = dist::connect_tcp(options(1, 2, port));
  kill_child(rank0);
  float x = 1;
  try {
    comm->all_reduce(&x, &x, 1, DType::F32);
    ADD_FAILURE() << "the all-reduce finished without rank 0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce #1: rank 0 exited or was killed"), std::string::npos) << e.what();
  }
}

// watch_peers (what aborts NCCL when a process dies mid-step): it names a peer whose process is
// killed while nobody reads the sockets, on rank 0 and on another rank; data the peers send stays
// for the collectives; a watch that ends first calls nothing.
TEST(TcpCommunicator, PeerWatchNamesAKilledProcessWithoutReading) {
  for (int watcher : {0, 1}) {
    const int port = free_port();
    Child other = spawn_child([&] {
      auto c = dist::connect_tcp(options(1 - watcher, 2, port));
      float x = 2;
      c->all_reduce(&x, &x, 1, DType::F32);
      pause();
    });
    auto comm = dist::connect_tcp(options(watcher, 2, port));
    std::mutex mu;
    std::condition_variable cv;
    std::string lost;
    auto watch = dist::watch_peers(*comm, [&](int, const std::string& why) {
      std::lock_guard lock(mu);
      lost = why;
      cv.notify_all();
    });
    float x = 1;
    comm->all_reduce(&x, &x, 1, DType::F32);
    EXPECT_EQ(x, 3.0f);
    {
      std::unique_lock lock(mu);
      EXPECT_FALSE(cv.wait_for(lock, 200ms, [&] { return !lost.empty(); })) << lost;
    }
    kill_child(other);
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return !lost.empty(); })) << "watcher " << watcher;
    EXPECT_EQ(lost, "rank " + std::to_string(1 - watcher) + " exited or was killed (its connection closed)");
  }
  // Ended before the peer goes: nothing is called.
  const int port = free_port();
  Child other = spawn_child([&] {
    auto c = dist::connect_tcp(options(1, 2, port));
    pause();
  });
  auto comm = dist::connect_tcp(options(0, 2, port));
  bool called = false;
  dist::watch_peers(*comm, [&](int, const std::string&) { called = true; }).reset();
  // With a grace period: a watch that ends within it calls nothing either.
  auto graced = dist::watch_peers(
      *comm, [&](int, const std::string&) { called = true; }, 5.0);
  kill_child(other);
  std::this_thread::sleep_for(100ms);
  graced.reset();
  EXPECT_FALSE(called);
}

// --dist-timeout and the op timeout are user doubles: one past what a steady_clock duration holds
// (1e300, inf) means no deadline, not a float-to-integer overflow that lands in the past.
TEST(TcpCommunicator, HugeTimeoutsMeanNoDeadline) {
  const auto never = dist::Clock::time_point::max();
  EXPECT_EQ(dist::deadline_after(0), never);
  EXPECT_EQ(dist::deadline_after(1e300), never);
  EXPECT_EQ(dist::deadline_after(std::numeric_limits<double>::infinity()), never);
  EXPECT_GT(dist::deadline_after(1e6), dist::Clock::now() + std::chrono::hours(24));
}

TEST(TcpCommunicator, RendezvousWithAMissingRankTimesOutOnEveryRank) {
  const int port = free_port();
  // Rank 1 waits longer than rank 0, so that even a slow start reaches rank 0 before it gives up.
  auto opts = [&](int rank) {
    auto o = options(rank, 3, port);
    o.rendezvous_timeout_s = rank == 0 ? 2 : 20;
    return o;
  };
  Child rank1 = spawn_child([&] { dist::connect_tcp(opts(1)); });
  const std::string want = "timed out after 2 s: a rank of 3 never arrived (rank 2 missing)";
  try {
    dist::connect_tcp(opts(0));
    ADD_FAILURE() << "a group of 3 formed from 2 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  const ChildEnd end = wait_child(rank1, 30s);
  EXPECT_EQ(end.exit_code, 1);
  EXPECT_NE(end.message.find(want), std::string::npos) << end.message;
}

TEST(TcpCommunicator, RankWithoutRankZeroTimesOut) {
  const int port = free_port();
  auto o = options(1, 2, port);
  o.rendezvous_timeout_s = 0.5;
  try {
    dist::connect_tcp(o);
    ADD_FAILURE() << "connected to nobody";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("could not reach rank 0 at 127.0.0.1:" + std::to_string(port)),
              std::string::npos)
        << e.what();
  }
}

TEST(TcpCommunicator, RankStartedForAnotherWorldSizeIsRefused) {
  const int port = free_port();
  Child rank1 = spawn_child([&] { dist::connect_tcp(options(1, 3, port)); });
  const std::string want = "rank 1 was started for a group of 3 ranks, rank 0 for 2";
  try {
    dist::connect_tcp(options(0, 2, port));
    ADD_FAILURE() << "formed a group of mismatched sizes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  const ChildEnd end = wait_child(rank1, 30s);
  EXPECT_NE(end.message.find(want), std::string::npos) << end.message;
}

TEST(TcpCommunicator, DisagreeingCallsFailOnEveryRankAndTheGroupGoesOn) {
  const int port = free_port();
  Child rank1 = spawn_child([&] {
    auto c = dist::connect_tcp(options(1, 2, port));
    std::vector<float> x(4, 1.0f);
    try {
      c->all_reduce(x.data(), x.data(), 3, DType::F32);
    } catch (const Error& e) {
      if (std::string(e.what()).find("rank 1 of 2: it called all_reduce(3 x F32") == std::string::npos) throw;
    }
    verify_or_throw(*c);
  });
  auto comm = dist::connect_tcp(options(0, 2, port));
  std::vector<float> x(4, 1.0f);
  try {
    comm->all_reduce(x.data(), x.data(), 4, DType::F32);
    ADD_FAILURE() << "ranks with different counts were summed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce: rank 1 of 2: it called all_reduce(3 x F32, root 0) while rank 0 "
                                         "called all_reduce(4 x F32, root 0)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(verify_or_throw(*comm));
  const ChildEnd end = wait_child(rank1, 30s);
  EXPECT_EQ(end.exit_code, 0) << end.message;
}

TEST(TcpCommunicator, BadArgumentsOnOneRankFailOnEveryRank) {
  const int port = free_port();
  Child rank1 = spawn_child([&] {
    auto c = dist::connect_tcp(options(1, 2, port));
    int32_t v = 1;
    c->all_reduce(&v, &v, 1, DType::I32);
  });
  auto comm = dist::connect_tcp(options(0, 2, port));
  int32_t v = 1;
  EXPECT_THROW(comm->all_reduce(&v, &v, 1, DType::I32), Error);
  const ChildEnd end = wait_child(rank1, 30s);
  EXPECT_NE(end.message.find("all_reduce: rank 0 of 2: sums F32 or BF16, not I32"), std::string::npos) << end.message;
}

TEST(TcpCommunicator, AbortIsNamedOnThePeers) {
  const int port = free_port();
  Child rank1 = spawn_child([&] {
    auto c = dist::connect_tcp(options(1, 2, port));
    c->abort("could not load shard 3");
  });
  auto comm = dist::connect_tcp(options(0, 2, port));
  try {
    comm->barrier();
    ADD_FAILURE() << "the barrier passed an aborted rank";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 ended the group: could not load shard 3"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(wait_child(rank1, 30s).exit_code, 0);
}

TEST(TcpCommunicator, HungPeerIsNamedAfterTheOperationTimeout) {
  const int port = free_port();
  Child rank1 = spawn_child([&] {
    auto c = dist::connect_tcp(options(1, 2, port));
    pause();
  });
  auto o = options(0, 2, port);
  o.op_timeout_s = 0.5;
  auto comm = dist::connect_tcp(o);
  try {
    comm->barrier();
    ADD_FAILURE() << "the barrier passed a rank that never came";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("barrier #1: rank 1 did not reach it within 0.5 s"), std::string::npos)
        << e.what();
  }
  kill_child(rank1);
}

TEST(TcpCommunicator, BadOptionsAreNamed) {
  auto o = options(2, 2, 29500);
  EXPECT_THROW(
      {
        try {
          dist::connect_tcp(o);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("rank 2 is outside 0..1"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  o = options(0, 2, 70000);
  EXPECT_THROW(dist::connect_tcp(o), Error);
  o = options(0, 0, 29500);
  EXPECT_THROW(dist::connect_tcp(o), Error);
}

}  // namespace
}  // namespace kiln::test
