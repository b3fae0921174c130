// `kiln dist-check` end to end: one process with two rank threads, two processes started with
// --nnodes/--node-rank, and two started by mpirun print the same digest line; a rank that never
// comes ends the run with an error naming it; the layout lines for a fixture.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cctype>
#include <filesystem>

#include "test_util.h"

namespace kiln::test {
namespace {

// The digest line of a dist-check run's output, "dist-check: N ranks, ..." ("" when there is none).
// Plain string search: std::regex trips GCC 12's -Wmaybe-uninitialized in the sanitizer build.
std::string digest_line(const std::string& out) {
  const std::string head = "dist-check: ";
  for (size_t at = out.find(head); at != std::string::npos; at = out.find(head, at + 1)) {
    size_t i = at + head.size(), digits = i;
    while (i < out.size() && std::isdigit(static_cast<unsigned char>(out[i]))) ++i;
    if (i == digits || out.compare(i, 8, " ranks, ") != 0) continue;
    return out.substr(at, out.find('\n', at) - at);
  }
  return "";
}

std::string kiln() {
  return KILN_BINARY;
}

TEST(DistCheck, TwoProcessesPrintWhatTwoThreadsPrint) {
  const RunResult threads = run_kiln("dist-check --threads 2");
  ASSERT_EQ(threads.exit_code, 0) << threads.out;
  const std::string want = digest_line(threads.out);
  ASSERT_NE(want, "") << threads.out;
  EXPECT_NE(want, digest_line(run_kiln("dist-check --threads 3").out));  // the digest depends on the group

  const std::string addr = "--dist-init-addr 127.0.0.1:" + std::to_string(free_port());
  const RunResult procs = run_shell(kiln() + " dist-check --nnodes 2 --node-rank 1 " + addr + " & " + kiln() +
                                    " dist-check --nnodes 2 --node-rank 0 " + addr + "; r=$?; wait $! && exit $r");
  ASSERT_EQ(procs.exit_code, 0) << procs.out;
  EXPECT_EQ(digest_line(procs.out), want) << procs.out;
}

TEST(DistCheck, UnderMpirunPrintsWhatTwoThreadsPrint) {
  if (run_shell("command -v mpirun").exit_code != 0)
    GTEST_SKIP() << "no mpirun (scripts/setup.sh installs openmpi-bin)";
  const std::string want = digest_line(run_kiln("dist-check --threads 2").out);
  // OpenMPI refuses root without --allow-run-as-root (CI runs as root) and a 2-core machine
  // without --oversubscribe.
  const RunResult r = run_shell(
      "mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_ADDR=127.0.0.1 -x "
      "MASTER_PORT=" +
      std::to_string(free_port()) + " " + kiln() + " dist-check");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("process 1 of 2 (openmpi"), std::string::npos) << r.out;
  EXPECT_EQ(digest_line(r.out), want) << r.out;
}

TEST(DistCheck, MissingRankIsNamed) {
  const RunResult r =
      run_kiln("dist-check --nnodes 2 --node-rank 0 --rendezvous-timeout 1 --dist-init-addr 127.0.0.1:" +
               std::to_string(free_port()));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("timed out after 1 s: a rank of 2 never arrived (rank 1 missing)"), std::string::npos) << r.out;
}

// Two ranks in a long soak; one is killed mid-run and the other must end with an error naming it
// (`timeout 30` turns a hang into exit code 124, which fails the test).
TEST(DistCheck, KillingARankMidRunEndsTheOtherNamingIt) {
  for (int killed : {0, 1}) {
    const int survivor = 1 - killed;
    const std::string addr = "--dist-init-addr 127.0.0.1:" + std::to_string(free_port());
    auto rank = [&](int r) {
      return kiln() + " dist-check --repeat 1000000000 --nnodes 2 --node-rank " + std::to_string(r) + " " + addr;
    };
    // The victim runs bare, so that the kill reaches kiln itself and not a wrapper, and is killed
    // only once it has said the group formed (a loaded machine may take a while to get there).
    const std::string log =
        ::testing::TempDir() + "dist_check_victim_" + std::to_string(getpid()) + "_" + std::to_string(killed) + ".log";
    const RunResult res =
        run_shell(rank(killed) + " 2>" + log + " & victim=$!; timeout 30 " + rank(survivor) +
                  " & other=$!; for i in $(seq 300); do grep -q 'formed' " + log +
                  " && break; sleep 0.1; done; kill -9 $victim; wait $other; echo \"survivor exit $?\"");
    std::filesystem::remove(log);
    EXPECT_NE(res.out.find("survivor exit 1"), std::string::npos) << res.out;
    EXPECT_NE(res.out.find("rank " + std::to_string(killed) + " exited or was killed"), std::string::npos) << res.out;
  }
}

TEST(DistCheck, PrintsEachRanksShareOfAModel) {
  const std::string config = std::string(KILN_TEST_DATA) + "/fixtures/h12_qlora_grouped_yarn/config.json";
  RunResult r = run_kiln("dist-check --threads 4 --config " + config);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("rank 3/4: heads 9..11 (3), experts 0..15 inter 18..23, vocab 120..159"), std::string::npos)
      << r.out;
  r = run_kiln("dist-check --threads 4 --ep 4 --config " + config);
  EXPECT_NE(r.out.find("rank 3/4: heads 9..11 (3), experts 12..15 inter 0..23"), std::string::npos) << r.out;
  r = run_kiln("dist-check --threads 8 --config " + config);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("--tp 8: the model's 12 attention heads do not split evenly"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kiln::test
