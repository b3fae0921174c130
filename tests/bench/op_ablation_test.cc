// scripts/op-ablation.sh: its arithmetic against a stub `kiln` whose step time depends on
// KILN_OP_SKIP (known costs, a median over jittered repeats, a prefix that names no op, a failing
// bench), then end to end on the CPU backend, which does not honour KILN_OP_SKIP.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::string script() {
  return (test::repo_root() / "scripts" / "op-ablation.sh").string();
}

// A directory with an executable stub of `kiln bench model --json FILE`: a step takes 10 ms at
// batch 1 and 20 at batch 2, less without "moe" (3 ms a batch row) or "linear " (1 ms); calls
// add 0, 0.3 and 0.1 ms in turn, so three repeats have a median of +0.1. "typo" matches no op
// (warned as the CUDA backend does); "fail" makes the bench fail.
struct Stub {
  fs::path dir = fs::temp_directory_path() / ("op_ablation_stub_" + std::to_string(getpid()));
  Stub() {
    fs::create_directories(dir);
    std::ofstream f(dir / "kiln");
    f << R"(#!/usr/bin/env bash
json=""
while [ $# -gt 0 ]; do [ "$1" = "--json" ] && json=$2; shift; done
n=$(cat ")"
      << dir.string() << R"(/calls" 2>/dev/null || echo 0); echo $((n + 1)) > ")" << dir.string() << R"(/calls"
jitter=$(echo "0 0.3 0.1" | cut -d' ' -f$((n % 3 + 1)))
case "$KILN_OP_SKIP" in
  "") base=10 ;; moe) base=7 ;; "linear ") base=9 ;;
  typo) echo "[warning] KILN_OP_SKIP: 'typo' matched no op" >&2; base=10 ;;
  fail) echo "error: no such model" >&2; exit 3 ;;
esac
python3 -c "
import json, sys
b, j = $base, $jitter
rows = [{'batch_size': s, 'decode_ms_per_step': s * b + j} for s in (1, 2)]
json.dump({'device': 'stub', 'activation_dtype': 'F32', 'prompt_len': 8, 'decode_steps': 2, 'results': rows}, open('$json', 'w'))
"
)";
    f.close();
    chmod((dir / "kiln").c_str(), 0755);
  }
  ~Stub() { fs::remove_all(dir); }
  test::RunResult run(const std::string& ops, const std::string& out) const {
    return test::run_shell("bash " + script() + " --kiln " + (dir / "kiln").string() + " --repeats 3 --ops '" + ops +
                           "' --out " + out + " -- --device cuda --batch-sizes 1,2");
  }
};

TEST(OpAblation, CostIsTheMedianStepMinusTheStepWithoutTheOp) {
  Stub stub;
  const std::string out = (stub.dir / "out.json").string();
  const auto r = stub.run("moe;linear ", out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("batch 2: whole step 20.100 ms"), std::string::npos) << r.out;
  const nlohmann::json j = test::read_json(out);
  EXPECT_EQ(j.at("aggregate"), "median");
  EXPECT_NEAR(j.at("whole_ms_per_step").at("1").get<double>(), 10.1, 1e-9);
  ASSERT_EQ(j.at("ops").size(), 2u);
  EXPECT_EQ(j["ops"][0].at("op"), "moe");
  EXPECT_NEAR(j["ops"][0]["ms_per_step_cost"].at("1").get<double>(), 3.0, 1e-9);
  EXPECT_NEAR(j["ops"][0]["ms_per_step_cost"].at("2").get<double>(), 6.0, 1e-9);
  EXPECT_EQ(j["ops"][1].at("op"), "linear ");
  EXPECT_NEAR(j["ops"][1]["ms_per_step_without"].at("2").get<double>(), 18.1, 1e-9);
  EXPECT_NEAR(j["ops"][1]["ms_per_step_cost"].at("1").get<double>(), 1.0, 1e-9);
}

TEST(OpAblation, FailsOnAPrefixThatNamesNoOpAndOnAFailingBench) {
  Stub stub;
  auto r = stub.run("moe;typo", (stub.dir / "out.json").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("'typo' names no op"), std::string::npos) << r.out;
  r = stub.run("fail", (stub.dir / "out.json").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("error: no such model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the bench failed"), std::string::npos) << r.out;
}

TEST(OpAblation, RefusesArgumentsItDoesNotKnow) {
  auto expect_usage = [](const std::string& args, const std::string& message) {
    const auto r = test::run_shell("bash " + script() + " " + args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_NE(r.out.find(message), std::string::npos) << args << ": " << r.out;
  };
  expect_usage("--repeat 3 -- --device cpu", "unknown argument --repeat");
  expect_usage("--repeats 1", "give the kiln bench model arguments");
  expect_usage("--repeats 0 -- --device cpu", "is not a positive count");
  expect_usage("--ops 'moe;;linear ' -- --device cpu", "has an empty entry");
  expect_usage("--out", "--out needs a value");
}

TEST(OpAblation, RunsEndToEndOnTheCpu) {
  const auto json = fs::temp_directory_path() / ("op_ablation_" + std::to_string(getpid()) + ".json");
  const auto r = test::run_shell("bash " + script() + " --kiln " + KILN_BINARY +
                                 " --repeats 1 --ops 'moe;linear ' --out " + json.string() +
                                 " -- --device cpu --model " + (test::repo_root() / "models" / "kiln-tiny").string() +
                                 " --batch-sizes 1,2 --prompt-len 8 --decode-steps 2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = test::read_json(json.string());
  fs::remove(json);
  for (const char* b : {"1", "2"}) EXPECT_GT(j.at("whole_ms_per_step").at(b).get<double>(), 0.0) << b;
  ASSERT_EQ(j.at("ops").size(), 2u);
  for (const auto& op : j["ops"]) EXPECT_GT(op.at("ms_per_step_without").at("2").get<double>(), 0.0) << op.dump();
}

}  // namespace
}  // namespace kiln
