// The speculative-decoding flags of `kiln generate` and `kiln bench model` on the bundled models:
// the same greedy ids with and without a draft model, the statistics in bench model's table and
// JSON, and clear refusals of what is not built or not consistent.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dspark_util.h"
#include "test_util.h"

namespace kiln::test {
namespace {

std::string model(const std::string& name) {
  return (repo_root() / "models" / name).string();
}
const std::string kDraft = " --speculative-algorithm draft --speculative-model " + model("kiln-tiny-draft");

nlohmann::json last_json_line(const std::string& out) {
  const size_t start = out.rfind("\n{");
  return nlohmann::json::parse(out.substr(start == std::string::npos ? 0 : start + 1));
}

TEST(SpecCli, GenerateGivesTheSameGreedyIdsWithADraftModel) {
  const std::string base = "generate --device cpu --model " + model("kiln-tiny") +
                           " --prompt-ids 0,3280,759,1356,1142 --max-tokens 20 --temperature 0 --json";
  const RunResult plain = run_kiln(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  const RunResult spec = run_kiln(base + kDraft + " --speculative-num-tokens 3");
  ASSERT_EQ(spec.exit_code, 0) << spec.out;
  const auto a = last_json_line(plain.out), b = last_json_line(spec.out);
  EXPECT_EQ(a["output_ids"], b["output_ids"]);
  ASSERT_EQ(b["logprobs"].size(), b["output_ids"].size());  // verified tokens carry logprobs too
  for (size_t i = 0; i < a["logprobs"].size(); ++i)
    EXPECT_NEAR(a["logprobs"][i].get<double>(), b["logprobs"][i].get<double>(), 1e-3) << "token " << i;
}

TEST(SpecCli, BenchModelReportsAcceptance) {
  const std::string json = (std::filesystem::temp_directory_path() / "kiln_spec_bench_model_test.json").string();
  const RunResult r = run_kiln("bench model --model " + model("kiln-tiny") +
                               " --batch-sizes 1,2 --prompt-len 8 --decode-steps 12 --no-warmup --json " + json +
                               kDraft + " --speculative-num-tokens 2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("acceptance per draft position"), std::string::npos) << r.out;
  std::ifstream f(json);
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["speculative"]["algorithm"], "draft");
  EXPECT_EQ(j["speculative"]["num_tokens"], 2);
  for (const auto& row : j["results"]) {
    const auto& s = row["speculative"];
    EXPECT_GT(s["verifies"].get<int64_t>(), 0);
    EXPECT_LE(s["accepted_tokens"].get<int64_t>(), s["draft_tokens"].get<int64_t>());
    EXPECT_EQ(s["proposed_at"].size(), 2u);
    EXPECT_GE(s["mean_accepted_length"].get<double>(), 1.0);
  }
}

TEST(SpecCli, GenerateGivesTheSameGreedyIdsWithTheMtpLayer) {
  // The layer comes from --model itself; deepseek_mtp is vLLM's spelling of the same.
  const std::string base = "generate --device cpu --model " + model("kiln-tiny") +
                           " --prompt-ids 0,3280,759,1356,1142 --max-tokens 20 --temperature 0 --json";
  const RunResult plain = run_kiln(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  for (const char* algo : {"mtp", "deepseek_mtp"}) {
    const RunResult spec = run_kiln(base + " --speculative-algorithm " + algo + " --speculative-num-tokens 3");
    ASSERT_EQ(spec.exit_code, 0) << spec.out;
    EXPECT_EQ(last_json_line(plain.out)["output_ids"], last_json_line(spec.out)["output_ids"]) << algo;
  }
  const RunResult no_layer =
      run_kiln(base + " --speculative-algorithm mtp --speculative-model " + model("kiln-tiny-draft"));
  EXPECT_NE(no_layer.exit_code, 0);
  EXPECT_NE(no_layer.out.find("kiln-tiny-draft"), std::string::npos) << no_layer.out;
}

TEST(SpecCli, BenchModelReportsMtpAcceptance) {
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("kiln_spec_bench_model_mtp_test_" + std::to_string(::getpid()) + ".json"))
                               .string();
  const RunResult r = run_kiln("bench model --model " + model("kiln-tiny") +
                               " --batch-sizes 1,2 --prompt-len 8 --decode-steps 12 --no-warmup --json " + json +
                               " --speculative-algorithm mtp --speculative-num-tokens 2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("acceptance per draft position"), std::string::npos) << r.out;
  std::ifstream f(json);
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["speculative"]["algorithm"], "mtp");
  for (const auto& row : j["results"]) EXPECT_GT(row["speculative"]["verifies"].get<int64_t>(), 0);
}

TEST(SpecCli, GenerateGivesTheSameGreedyIdsWithADsparkDraft) {
  // A random-weight block draft of kiln-tiny's shapes (dspark_util.h): whatever it drafts, the
  // verified output is plain decoding's.
  const std::string dir = write_dspark_draft("cli", dspark_tiny_config());
  const std::string base = "generate --device cpu --model " + model("kiln-tiny") +
                           " --prompt-ids 0,3280,759,1356,1142 --max-tokens 20 --temperature 0 --json";
  const RunResult plain = run_kiln(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  const RunResult spec =
      run_kiln(base + " --speculative-algorithm dspark --speculative-num-tokens 3 --speculative-model " + dir);
  ASSERT_EQ(spec.exit_code, 0) << spec.out;
  EXPECT_EQ(last_json_line(plain.out)["output_ids"], last_json_line(spec.out)["output_ids"]);
  const RunResult too_many =
      run_kiln(base + " --speculative-algorithm dspark --speculative-num-tokens 5 --speculative-model " + dir);
  EXPECT_NE(too_many.exit_code, 0);
  EXPECT_NE(too_many.out.find("block_size"), std::string::npos) << too_many.out;
}

TEST(SpecCli, RefusesWhatIsNotBuiltOrInconsistent) {
  const std::string base = "generate --device cpu --model " + model("kiln-tiny") + " --prompt-ids 0,5 --max-tokens 2";
  const RunResult dspark = run_kiln(base + " --speculative-algorithm dspark");
  EXPECT_NE(dspark.exit_code, 0);
  EXPECT_NE(dspark.out.find("--speculative-model"), std::string::npos) << dspark.out;
  const RunResult unknown = run_kiln(base + " --speculative-algorithm eagle");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.out.find("unknown --speculative-algorithm"), std::string::npos) << unknown.out;
  const RunResult no_model = run_kiln(base + " --speculative-algorithm draft");
  EXPECT_NE(no_model.exit_code, 0);
  EXPECT_NE(no_model.out.find("--speculative-model"), std::string::npos) << no_model.out;
  const RunResult no_algo = run_kiln(base + " --speculative-model " + model("kiln-tiny-draft"));
  EXPECT_NE(no_algo.exit_code, 0);
  EXPECT_NE(no_algo.out.find("--speculative-algorithm"), std::string::npos) << no_algo.out;
  const RunResult bad_k = run_kiln(base + kDraft + " --speculative-num-tokens 0");
  EXPECT_NE(bad_k.exit_code, 0);
  EXPECT_NE(bad_k.out.find("--speculative-num-tokens"), std::string::npos) << bad_k.out;
  const RunResult bad_policy = run_kiln(base + kDraft + " --speculative-policy sometimes");
  EXPECT_NE(bad_policy.exit_code, 0);
  EXPECT_NE(bad_policy.out.find("--speculative-policy"), std::string::npos) << bad_policy.out;
  const RunResult fixed = run_kiln(base + kDraft + " --speculative-policy fixed");
  EXPECT_EQ(fixed.exit_code, 0) << fixed.out;
  // The policy's longest interval is 16x this one: a value that overflows it is refused by name.
  const RunResult huge_probe = run_kiln(base + kDraft + " --speculative-probe-interval 1000000000000000000");
  EXPECT_NE(huge_probe.exit_code, 0);
  EXPECT_NE(huge_probe.out.find("--speculative-probe-interval"), std::string::npos) << huge_probe.out;
}

}  // namespace
}  // namespace kiln::test
