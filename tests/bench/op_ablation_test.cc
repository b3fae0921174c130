// scripts/op-ablation.sh end to end on the CPU backend, which does not honour KILN_OP_SKIP (the
// costs read about zero there): the script benches the step whole and once without each op, and
// reports every op at every batch size in its table and JSON.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "test_util.h"

namespace kiln {
namespace {

std::string repo_path(const std::string& rel) {
  return test::data_path("../../" + rel);
}

TEST(OpAblation, TimesTheStepWholeAndWithoutEachOp) {
  const auto json = std::filesystem::temp_directory_path() / ("op_ablation_" + std::to_string(getpid()) + ".json");
  const auto r =
      test::run_shell("bash " + repo_path("scripts/op-ablation.sh") + " --kiln " + KILN_BINARY +
                      " --repeats 1 --ops 'moe;linear ' --out " + json.string() + " -- --device cpu --model " +
                      repo_path("models/kiln-tiny") + " --batch-sizes 1,2 --prompt-len 8 --decode-steps 2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("batch 2: whole step"), std::string::npos) << r.out;
  const nlohmann::json j = test::read_json(json.string());
  std::filesystem::remove(json);
  for (const char* b : {"1", "2"}) EXPECT_GT(j.at("whole_ms_per_step").at(b).get<double>(), 0.0) << b;
  ASSERT_EQ(j.at("ops").size(), 2u);
  EXPECT_EQ(j["ops"][0].at("op"), "moe");
  EXPECT_EQ(j["ops"][1].at("op"), "linear ");
  for (const auto& op : j["ops"]) {
    EXPECT_TRUE(op.at("ms_per_step_cost").contains("2")) << op.dump();
    EXPECT_GT(op.at("ms_per_step_without").at("1").get<double>(), 0.0) << op.dump();
  }
}

TEST(OpAblation, RefusesArgumentsItDoesNotKnow) {
  auto r = test::run_shell("bash " + repo_path("scripts/op-ablation.sh") + " --repeat 3 -- --device cpu");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("unknown argument --repeat"), std::string::npos) << r.out;
  r = test::run_shell("bash " + repo_path("scripts/op-ablation.sh") + " --repeats 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("give the kiln bench model arguments"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kiln
