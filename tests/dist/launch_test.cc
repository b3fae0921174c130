// Launcher detection (OpenMPI, Slurm, torchrun variables, kiln's flags), --dist-init-addr parsing,
// their conflicts, and two processes that find each other through each launcher's variables.
#include <gtest/gtest.h>

#include "child_process.h"
#include "collective_expect.h"
#include "core/error.h"
#include "dist/launch.h"
#include "test_util.h"

namespace kiln::test {
namespace {

using dist::Environment;
using dist::LaunchFlags;
using dist::resolve_launch;

// The message resolve_launch fails with, or "" when it succeeds.
std::string launch_error(const LaunchFlags& flags, const Environment& env) {
  try {
    resolve_launch(flags, env);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(InitAddress, HostAndPort) {
  auto a = dist::parse_init_address("10.1.2.3:29500");
  EXPECT_EQ(a.host, "10.1.2.3");
  EXPECT_EQ(a.port, 29500);
  a = dist::parse_init_address("node-0.cluster:1234");
  EXPECT_EQ(a.host, "node-0.cluster");
  a = dist::parse_init_address("[::1]:8000");
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 8000);
}

TEST(InitAddress, BadTextIsNamed) {
  for (const auto& [text, why] :
       std::vector<std::pair<std::string, std::string>>{{"10.1.2.3", "expected host:port"},
                                                        {":29500", "no host"},
                                                        {"h:0", "port '0' is not a number in 1..65535"},
                                                        {"h:65536", "port '65536'"},
                                                        {"h:29x", "port '29x'"},
                                                        {"h:", "port ''"},
                                                        {"::1:8000", "write an IPv6 address as [addr]:port"},
                                                        {"[::1]8000", "an IPv6 address is written [addr]:port"}}) {
    try {
      dist::parse_init_address(text);
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << text << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("'" + text + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(Launch, NothingMeansOneProcess) {
  const auto info = resolve_launch({}, {{"PATH", "/bin"}});
  EXPECT_EQ(info.launcher, "single");
  EXPECT_EQ(info.nnodes, 1);
  EXPECT_EQ(info.node_rank, 0);
  EXPECT_FALSE(info.init_addr);
  EXPECT_EQ(dist::describe(info), "one process");
}

TEST(Launch, OpenMpiVariables) {
  const auto info = resolve_launch({}, {{"OMPI_COMM_WORLD_RANK", "1"},
                                        {"OMPI_COMM_WORLD_SIZE", "2"},
                                        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                        {"MASTER_ADDR", "10.0.0.1"},
                                        {"MASTER_PORT", "29500"}});
  EXPECT_EQ(info.launcher, "openmpi");
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.nnodes, 2);
  ASSERT_TRUE(info.init_addr);
  EXPECT_EQ(info.init_addr->host, "10.0.0.1");
  EXPECT_EQ(dist::describe(info), "process 1 of 2 (openmpi, local rank 0), rendezvous at 10.0.0.1:29500");
}

TEST(Launch, SlurmVariablesWithTheAddressFlag) {
  LaunchFlags f;
  f.init_addr = "node0:6000";
  const auto info =
      resolve_launch(f, {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}, {"RANK", "9"}});
  EXPECT_EQ(info.launcher, "slurm");
  EXPECT_EQ(info.node_rank, 3);
  EXPECT_EQ(info.nnodes, 4);
  EXPECT_EQ(info.init_addr->host, "node0");
  EXPECT_EQ(info.init_addr->port, 6000);
}

TEST(Launch, TorchrunVariables) {
  const auto info = resolve_launch(
      {},
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "fe80::1"}, {"MASTER_PORT", "29400"}});
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.init_addr->host, "fe80::1");
  EXPECT_EQ(dist::describe(info), "process 0 of 2 (torchrun, local rank 1), rendezvous at [fe80::1]:29400");
}

TEST(Launch, Flags) {
  LaunchFlags f;
  f.nnodes = 2;
  f.node_rank = 1;
  f.init_addr = "127.0.0.1:29500";
  const auto info = resolve_launch(f, {});
  EXPECT_EQ(info.launcher, "flags");
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.nnodes, 2);
  const auto o = dist::tcp_options(info, 7);
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.world_size, 2);
  EXPECT_EQ(o.host, "127.0.0.1");
  EXPECT_EQ(o.port, 29500);
  EXPECT_EQ(o.rendezvous_timeout_s, 7);
}

TEST(Launch, FlagsThatAgreeWithTheLauncherAreAccepted) {
  LaunchFlags f;
  f.nnodes = 2;
  f.node_rank = 1;
  f.init_addr = "h:1";
  EXPECT_EQ(launch_error(f, {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}), "");
}

TEST(Launch, ContradictionsAndGapsAreNamed) {
  const Environment mpi2 = {
      {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}};
  LaunchFlags f;
  f.nnodes = 4;
  EXPECT_EQ(launch_error(f, mpi2), "--nnodes 4 but openmpi started 2 processes");
  f = {};
  f.node_rank = 0;
  EXPECT_EQ(launch_error(f, mpi2), "--node-rank 0 but openmpi gave this process rank 1");
  EXPECT_EQ(launch_error(f, {}), "--node-rank 0 needs --nnodes");
  f = {};
  f.nnodes = 2;
  f.init_addr = "h:1";
  EXPECT_EQ(launch_error(f, {}), "--nnodes 2 needs --node-rank (this process's rank, 0..1)");
  f.node_rank = 2;
  EXPECT_EQ(launch_error(f, {}), "--node-rank: rank 2 is outside 0..1");
  f.init_addr = "";
  f.node_rank = 1;
  EXPECT_NE(launch_error(f, {}).find("a run of 2 processes needs rank 0's address: --dist-init-addr"),
            std::string::npos);
  EXPECT_NE(launch_error({}, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}).find("needs rank 0's address"),
            std::string::npos);
  EXPECT_EQ(
      launch_error({}, {{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}),
      "slurm: rank 4 is outside 0..1");
  EXPECT_EQ(launch_error({}, {{"RANK", "x1"}, {"WORLD_SIZE", "2"}}), "RANK='x1' is not a whole number");
  EXPECT_EQ(launch_error({}, {{"MASTER_ADDR", "h"}}), "MASTER_ADDR is set but MASTER_PORT is not");
  f = {};
  f.nnodes = -1;
  EXPECT_EQ(launch_error(f, {}), "--nnodes -1: needs at least 1");
}

// Two processes that learn their ranks from a launcher's variables (or the flags) form one group
// and give the rank-order all-reduce, as one process computes it.
class LaunchedPair : public ::testing::TestWithParam<std::string> {};

TEST_P(LaunchedPair, FormsAGroupAndAllReduces) {
  const int port = free_port();
  auto env_for = [&](int rank) -> std::pair<LaunchFlags, Environment> {
    const std::string r = std::to_string(rank);
    Environment env = {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}};
    LaunchFlags f;
    if (GetParam() == "openmpi") {
      env["OMPI_COMM_WORLD_RANK"] = r;
      env["OMPI_COMM_WORLD_SIZE"] = "2";
    } else if (GetParam() == "slurm") {
      env["SLURM_PROCID"] = r;
      env["SLURM_NTASKS"] = "2";
    } else {
      env.clear();
      f.nnodes = 2;
      f.node_rank = rank;
      f.init_addr = "127.0.0.1:" + std::to_string(port);
    }
    return {f, env};
  };
  auto run_rank = [&](int rank) {
    const auto [flags, env] = env_for(rank);
    const auto info = resolve_launch(flags, env);
    if (info.launcher != GetParam()) throw Error("detected " + info.launcher);
    auto comm = dist::connect_tcp(dist::tcp_options(info, 20));
    std::vector<float> x = rank_input(comm->rank(), 9);
    comm->all_reduce(x.data(), x.data(), x.size(), DType::F32);
    if (x != rank_order_sum(2, 9)) throw Error("wrong all-reduce");
  };
  Child other = spawn_child([&] { run_rank(1); });
  EXPECT_NO_THROW(run_rank(0));
  const ChildEnd end = wait_child(other, std::chrono::seconds(30));
  EXPECT_EQ(end.exit_code, 0) << end.message;
}

INSTANTIATE_TEST_SUITE_P(Launchers, LaunchedPair, ::testing::Values("openmpi", "slurm", "flags"));

}  // namespace
}  // namespace kiln::test
