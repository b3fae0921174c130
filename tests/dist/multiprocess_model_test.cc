// The model split over two processes (one rank each, the TCP process group on the CPU backend),
// started by mpirun and by the --nnodes/--node-rank/--dist-init-addr flags: `kiln generate` gives
// the greedy tokens one process gives and `kiln score` its logprobs within 1e-4; a rank killed
// mid-run ends the other with an error naming it within 30 s; contradicting flags are refused by
// name. Every child runs under `timeout`, so that a hang fails the test instead of CI.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "test_util.h"

namespace kiln::test {
namespace {

std::string kiln() {
  return KILN_BINARY;
}

std::string tiny() {
  return std::string(KILN_TEST_DATA) + "/../../models/kiln-tiny";
}

std::string fixture() {
  return data_path("fixtures/h12_qlora_grouped_yarn");
}

std::vector<int> fixture_ids() {
  auto ids = read_json(fixture() + "/expected.json")["ids"].get<std::vector<int>>();
  ids.resize(12);
  return ids;
}

bool have_mpirun() {
  return run_shell("command -v mpirun").exit_code == 0;
}

// The JSON line of a command's output that starts with `head` (the workers print nothing).
nlohmann::json json_line(const RunResult& r, const std::string& head) {
  const size_t at = r.out.find(head);
  if (at == std::string::npos) return nullptr;
  return nlohmann::json::parse(r.out.substr(at, r.out.find('\n', at) - at), nullptr, false);
}

// Two processes started by hand: rank 1 in the background, rank 0 in front; both under timeout.
RunResult two_by_flags(const std::string& args) {
  const std::string addr = " --nnodes 2 --dist-init-addr 127.0.0.1:" + std::to_string(free_port_pair());
  const std::string cmd = "timeout 120 " + kiln() + " --log-level warn " + args + addr;
  return run_shell(cmd + " --node-rank 1 & " + cmd + " --node-rank 0; r=$?; wait $! && exit $r");
}

// OpenMPI refuses root without --allow-run-as-root (CI runs as root) and a 2-core machine without
// --oversubscribe.
RunResult two_by_mpirun(const std::string& args) {
  return run_shell(
      "timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=" +
      std::to_string(free_port_pair()) + " " + kiln() + " --log-level warn " + args);
}

std::vector<double> logprobs(const RunResult& r) {
  const nlohmann::json j = json_line(r, "{\"ids\"");
  std::vector<double> out;
  if (!j.is_object()) return out;
  for (size_t i = 1; i < j["logprobs"].size(); ++i) out.push_back(j["logprobs"][i].get<double>());
  return out;
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << what << " token " << i + 1;
}

TEST(MultiProcessModel, ScoreMatchesOneProcess) {
  const std::string args = "score --model " + fixture() + " --ids " + join_ids(fixture_ids()) + " --json";
  const RunResult one = run_kiln(args);
  ASSERT_EQ(one.exit_code, 0) << one.out;
  const std::vector<double> want = logprobs(one);
  ASSERT_FALSE(want.empty()) << one.out;

  const RunResult flags = two_by_flags(args + " --tp 2");
  ASSERT_EQ(flags.exit_code, 0) << flags.out;
  expect_near(logprobs(flags), want, "--nnodes 2 --tp 2");
  // Expert parallelism across the processes, combined by all-reduce and by all-to-all over TCP.
  const RunResult ep = two_by_flags(args + " --tp 2 --enable-expert-parallel");
  ASSERT_EQ(ep.exit_code, 0) << ep.out;
  expect_near(logprobs(ep), want, "--nnodes 2 --tp 2 --enable-expert-parallel");
  const RunResult a2a = two_by_flags(args + " --tp 4 --enable-expert-parallel --ep-combine alltoall");
  ASSERT_EQ(a2a.exit_code, 0) << a2a.out;
  expect_near(logprobs(a2a), want, "--nnodes 2 --tp 4 --enable-expert-parallel --ep-combine alltoall");
  // Two ranks per process: threads inside each, a TCP group of all four ranks between them.
  const RunResult four = two_by_flags(args + " --tp 4");
  ASSERT_EQ(four.exit_code, 0) << four.out;
  expect_near(logprobs(four), want, "--nnodes 2 --tp 4");
  // Decode context parallelism: each process keeps every other token's latent row.
  const RunResult dcp = two_by_flags(args + " --tp 2 --dcp 2");
  ASSERT_EQ(dcp.exit_code, 0) << dcp.out;
  expect_near(logprobs(dcp), want, "--nnodes 2 --tp 2 --dcp 2");

  if (!have_mpirun()) GTEST_SKIP() << "no mpirun (scripts/setup.sh installs openmpi-bin)";
  const RunResult mpi = two_by_mpirun(args + " --tp 2");
  ASSERT_EQ(mpi.exit_code, 0) << mpi.out;
  expect_near(logprobs(mpi), want, "mpirun -np 2 --tp 2");
}

TEST(MultiProcessModel, GenerateGivesOneProcessesTokens) {
  // The engine's overlapped loop included: the second step's tokens come from the first's samples.
  const std::string args =
      "generate --model " + tiny() + " --prompt-ids 1,2,3,4,5 --max-tokens 12 --temperature 0 --ignore-eos --json";
  auto tokens = [](const RunResult& r) {
    const nlohmann::json j = json_line(r, "{\"");
    return j.is_object() ? j["output_ids"].get<std::vector<int>>() : std::vector<int>{};
  };
  const RunResult one = run_kiln(args);
  ASSERT_EQ(one.exit_code, 0) << one.out;
  const std::vector<int> want = tokens(one);
  ASSERT_EQ(want.size(), 12u) << one.out;

  const RunResult flags = two_by_flags(args + " --tp 2");
  ASSERT_EQ(flags.exit_code, 0) << flags.out;
  EXPECT_EQ(tokens(flags), want) << flags.out;
  const RunResult eager = two_by_flags(args + " --tp 2 --disable-overlap-schedule");
  ASSERT_EQ(eager.exit_code, 0) << eager.out;
  EXPECT_EQ(tokens(eager), want) << eager.out;

  if (!have_mpirun()) GTEST_SKIP() << "no mpirun (scripts/setup.sh installs openmpi-bin)";
  const RunResult mpi = two_by_mpirun(args + " --tp 2");
  ASSERT_EQ(mpi.exit_code, 0) << mpi.out;
  EXPECT_EQ(tokens(mpi), want) << mpi.out;
  // Only rank 0 prints the result.
  EXPECT_EQ(mpi.out.find("output_ids"), mpi.out.rfind("output_ids")) << mpi.out;
}

// `kiln bench model` (random weights, the engine at several batch sizes) over two processes: it
// runs to the end, rank 0 prints the table once and every process exits 0.
TEST(MultiProcessModel, BenchModelRunsOverTwoProcesses) {
  const RunResult r =
      two_by_flags("bench model --config " + fixture() +
                   "/config.json --random-weights --prompt-len 8 --decode-steps 4 --batch-sizes 1,3 --tp 2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("kiln bench model:"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("kiln bench model:"), r.out.rfind("kiln bench model:")) << r.out;
}

// A long generation over two processes; one is killed once the run is under way and the other
// must end with an error naming it (`timeout 30` turns a hang into exit code 124, a failure).
TEST(MultiProcessModel, KillingARankMidRunEndsTheOtherNamingIt) {
  for (int killed : {1, 0}) {
    const int survivor = 1 - killed;
    const std::string addr = " --nnodes 2 --dist-init-addr 127.0.0.1:" + std::to_string(free_port_pair());
    auto rank = [&](int r) {
      return kiln() + " generate --model " + tiny() +
             " --prompt-ids 1,2,3,4,5 --max-tokens 2000 --temperature 0 --ignore-eos --tp 2 --node-rank " +
             std::to_string(r) + addr;
    };
    // The victim runs bare, so that the kill reaches kiln itself and not a wrapper, and is killed
    // a moment after its first step (rank 1 says it follows rank 0; rank 0 logs its KV cache).
    const std::string log = ::testing::TempDir() + "multiprocess_victim_" + std::to_string(getpid()) + "_" +
                            std::to_string(killed) + ".log";
    const RunResult res =
        run_shell(rank(killed) + " >/dev/null 2>" + log + " & victim=$!; timeout 30 " + rank(survivor) +
                  " >/dev/null & other=$!; for i in $(seq 600); do grep -q 'following\\|KV cache' " + log +
                  " && break; sleep 0.1; done; sleep 1; kill -9 $victim; wait $other; echo \"survivor exit $?\"");
    std::filesystem::remove(log);
    EXPECT_NE(res.out.find("survivor exit 1"), std::string::npos) << res.out;
    EXPECT_NE(res.out.find("rank " + std::to_string(killed) + " exited or was killed"), std::string::npos) << res.out;
  }
}

// A serving rank 0 that sits idle when a worker is killed ends too (after a short grace for a step
// in flight to fail with its own message), naming the worker, rather than serve a broken group.
TEST(MultiProcessModel, IdleServerEndsWhenAWorkerIsKilled) {
  const std::string args = " serve --model " + tiny() + " --port 0 --tp 2 --nnodes 2 --dist-init-addr 127.0.0.1:" +
                           std::to_string(free_port_pair()) + " --node-rank ";
  const std::string log = ::testing::TempDir() + "multiprocess_serve_" + std::to_string(getpid()) + ".log";
  const RunResult res = run_shell("timeout 30 " + kiln() + args + "0 2>" + log + " & other=$!; " + kiln() + args +
                                  "1 2>/dev/null & victim=$!; for i in $(seq 600); do grep -q 'serving' " + log +
                                  " && break; sleep 0.1; done; sleep 0.5; kill -9 $victim; wait $other; echo "
                                  "\"survivor exit $?\"; cat " +
                                  log);
  std::filesystem::remove(log);
  EXPECT_NE(res.out.find("survivor exit 1"), std::string::npos) << res.out;
  EXPECT_NE(res.out.find("kiln: error: rank 1 exited or was killed"), std::string::npos) << res.out;
}

TEST(MultiProcessModel, ContradictingFlagsAreNamed) {
  const std::string score = "score --model " + tiny() + " --ids 1,2,3 --dist-init-addr 127.0.0.1:1 ";
  RunResult r = run_kiln(score + "--nnodes 2 --node-rank 0");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("2 processes (--nnodes) with --tp 1"), std::string::npos) << r.out;
  r = run_kiln(score + "--nnodes 3 --node-rank 0 --tp 4");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--tp 4 over 3 processes (--nnodes)"), std::string::npos) << r.out;
  r = run_shell("OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 timeout 30 " + kiln() + " " + score +
                "--nnodes 3 --tp 2");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--nnodes 3 but openmpi started 2 processes"), std::string::npos) << r.out;
  // A rank that never comes: the rendezvous names it.
  r = run_kiln("score --model " + tiny() + " --ids 1,2,3 --tp 2 --nnodes 2 --node-rank 0 --dist-timeout 1 " +
               "--dist-init-addr 127.0.0.1:" + std::to_string(free_port_pair()));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("rank 1 missing"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kiln::test
