// `kiln plan` end to end: the JSON fields scripts rely on, --compare, config files and presets,
// and errors that name the flag at fault.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "model/config.h"
#include "plan/presets.h"

namespace {

using json = nlohmann::json;

struct CliRun {
  int status;
  std::string out;
};

CliRun kiln(const std::string& args) {
  const std::string cmd = std::string(KILN_BINARY) + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  EXPECT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  const int status = pclose(f);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// `status`: 0 for a plan that fits, 3 for one that does not (the JSON is printed either way).
json kiln_json(const std::string& args, int status = 0) {
  CliRun r = kiln(args + " --json");
  EXPECT_EQ(r.status, status) << args << ": " << r.out;
  return json::parse(r.out);
}

TEST(PlanCli, JsonHasTheContractFields) {
  const json j = kiln_json("plan --model kimi-k3 --gpu B300 --gpus 8 --kv-pool 1000000");
  for (const char* key :
       {"fits", "weight_bytes_total", "weight_bytes_per_gpu", "kv_bytes_per_token", "kv_capacity_tokens",
        "decode_tok_s_per_stream_ceiling", "aggregate_tok_s_ceiling", "usd_per_million_tokens"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_GT(j["weight_bytes_total"].get<double>(), 1.5e12);
  EXPECT_EQ(j["kv_bytes_per_token"].get<int64_t>(), 61 * 576 * 2);
  EXPECT_GE(j["kv_capacity_tokens"].get<int64_t>(), 1000000);
  EXPECT_EQ(j["layout"]["tp"].get<int64_t>(), 8);
  EXPECT_EQ(j["weights"], "int4");
  EXPECT_GT(j["decode_tok_s_per_stream_ceiling"].get<double>(), 0);
  EXPECT_GT(j["usd_per_million_tokens"].get<double>(), 0);
}

TEST(PlanCli, ContractFlagsAndFitVerdicts) {
  // The DESIGN.md contract spelling: --gpus per node, --nodes, --weights, --kv, --context.
  json j = kiln_json("plan --model kimi-k3 --gpu B200 --gpus 8 --context 1000000", 3);
  EXPECT_FALSE(j["fits"].get<bool>());
  j = kiln_json("plan --model kimi-k3 --gpu B200 --gpus 8 --nodes 2 --context 1000000");
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_EQ(j["gpus"].get<int64_t>(), 16);
  j = kiln_json("plan --model kimi-k2 --gpu H200 --gpus 8 --weights bf16", 3);
  EXPECT_FALSE(j["fits"].get<bool>());
  j = kiln_json("plan --model kimi-k2 --gpu H200 --gpus 8 --weights int4 --kv fp8");
  EXPECT_TRUE(j["fits"].get<bool>());
  // The FP8 row kiln stores: 512 e4m3 c_kv + 4 f32 scales + 64 bf16 k_pe = 656 B a layer.
  EXPECT_EQ(j["kv_bytes_per_token"].get<int64_t>(), 61 * 656);
  // A price from the command line reaches the cost figures.
  const json cheap = kiln_json("plan --model kimi-k2 --gpu H200 --weights int4 --gpu-price 1.25");
  const json dear = kiln_json("plan --model kimi-k2 --gpu H200 --weights int4 --gpu-price 2.5");
  EXPECT_NEAR(dear["usd_per_million_tokens"].get<double>(), 2 * cheap["usd_per_million_tokens"].get<double>(), 1e-9);
}

// Scripts branch on the verdict: a plan that does not fit exits 3 (not 0, not an error's 1), and its
// cost figures are marked as what it would give if it fit.
TEST(PlanCli, APlanThatDoesNotFitExitsThree) {
  CliRun r = kiln("plan --model kimi-k2 --gpu H200 --gpus 8 --weights bf16");
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_NE(r.out.find("DOES NOT FIT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cost      if it fit: "), std::string::npos) << r.out;
  r = kiln("plan --model kimi-k2 --gpu H200 --gpus 8 --weights int4");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("if it fit"), std::string::npos) << r.out;
  // --compare: 3 only when no layout fits.
  EXPECT_EQ(kiln("plan --model kimi-k3 --kv-pool 1000000 --compare B200:8,B300:8").status, 0);
  r = kiln("plan --model kimi-k3 --kv-pool 1000000 --compare B200:8,H100:8");
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_EQ(kiln("plan --model kimi-k3 --kv-pool 1000000 --compare B200:8,H100:8 --json").status, 3);
}

// The catalog's prices are placeholders, and every output says so unless the user gave a price.
TEST(PlanCli, PlaceholderPricesAreLabelled) {
  CliRun r = kiln("plan --model kimi-k2 --gpu H200 --weights int4");
  EXPECT_NE(r.out.find("placeholder, not a quote: set yours with --gpu-price"), std::string::npos) << r.out;
  r = kiln("plan --model kimi-k2 --gpu H200 --weights int4 --gpu-price 3");
  EXPECT_NE(r.out.find("$3.00/GPU-hour, as given"), std::string::npos) << r.out;
  EXPECT_EQ(kiln_json("plan --model kimi-k2 --gpu H200 --weights int4")["usd_per_gpu_hour_source"],
            "catalog placeholder");
  EXPECT_EQ(kiln_json("plan --model kimi-k2 --gpu H200 --weights int4 --gpu-price 3")["usd_per_gpu_hour_source"],
            "given");
  r = kiln("plan --model kimi-k2 --weights int4 --compare H200:8,H200:8:price=3");
  EXPECT_NE(r.out.find("(placeholder)"), std::string::npos) << r.out;
  r = kiln("plan --list-gpus");
  EXPECT_EQ(r.out.find("benchmark issue"), std::string::npos) << r.out;
}

TEST(PlanCli, CompareSetsPlansSideBySide) {
  const json j = kiln_json("plan --model kimi-k3 --kv-pool 1000000 --compare B200:8,B200:8x2,B300:8,MI355X:8");
  ASSERT_EQ(j["plans"].size(), 4u);
  EXPECT_FALSE(j["plans"][0]["fits"].get<bool>());
  EXPECT_TRUE(j["plans"][1]["fits"].get<bool>());
  EXPECT_TRUE(j["plans"][2]["fits"].get<bool>());
  EXPECT_TRUE(j["plans"][3]["fits"].get<bool>());
  EXPECT_EQ(j["plans"][1]["gpus"].get<int64_t>(), 16);
  EXPECT_EQ(j["plans"][3]["gpu"], "MI355X");
  const CliRun table = kiln("plan --model kimi-k3 --compare B300:8,H200:8:weights=int4:dcp=8");
  EXPECT_EQ(table.status, 0) << table.out;
  EXPECT_NE(table.out.find("B300 x8"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("DCP8"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("tok/s per $/GPU-hr"), std::string::npos) << table.out;
}

TEST(PlanCli, ReadsAConfigFileOrDirectory) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kiln_plan_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "config.json");
    f << kiln::model_config_to_json(kiln::plan::find_preset("moonlight")->config).dump();
  }
  const json preset = kiln_json("plan --model moonlight-16b-a3b --gpu H100 --gpus 1");
  const json from_dir = kiln_json("plan --model " + dir.string() + " --gpu H100 --gpus 1");
  const json from_file = kiln_json("plan --model " + (dir / "config.json").string() + " --gpu H100 --gpus 1");
  EXPECT_EQ(from_dir["weight_bytes_total"], preset["weight_bytes_total"]);
  EXPECT_EQ(from_file["kv_capacity_tokens"], preset["kv_capacity_tokens"]);
  fs::remove_all(dir);
}

// `kiln model-info --model` takes the same names as `kiln plan --model`: every preset, in any
// spelling find_preset accepts, and the same error listing them for an unknown name.
TEST(PlanCli, ModelInfoTakesThePlansPresetNames) {
  for (const auto& p : kiln::plan::model_presets()) {
    CliRun r = kiln("model-info --model " + p.name + " --json");
    ASSERT_EQ(r.status, 0) << p.name << ": " << r.out;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["config"]["hidden_size"], p.config.hidden_size) << p.name;
    EXPECT_EQ(j["kv_values_per_token_per_layer"], p.config.kv_row_dim()) << p.name;
    // Both commands read the model alike: plan's KV bytes per token are model-info's.
    const json plan = kiln_json("plan --model " + p.name + " --gpu B300 --gpus 8 --weights int4 --kv-pool 1000");
    EXPECT_EQ(plan["kv_bytes_per_token"], j["kv_bytes_per_token"]) << p.name;
  }
  CliRun r = kiln("model-info --model Kimi_K2");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("kimi_k2"), std::string::npos) << r.out;  // its model_type
  r = kiln("model-info --model no-such-model");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("--model no-such-model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kimi-k2"), std::string::npos) << r.out;
}

TEST(PlanCli, ErrorsNameTheThingAtFault) {
  CliRun r = kiln("plan --model kimi-k3 --gpu A100");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("--gpu A100"), std::string::npos) << r.out;
  r = kiln("plan --model no-such-model --gpu H200");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("--model no-such-model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kimi-k3"), std::string::npos) << r.out;
  r = kiln("plan --model kimi-k2 --gpu H200 --gpus 6");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("--tp"), std::string::npos) << r.out;
  r = kiln("plan --model kimi-k2 --gpu H200 --weights int3");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("--weights int3"), std::string::npos) << r.out;
  r = kiln("plan --model kimi-k2 --compare H200:8:foo=1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("foo"), std::string::npos) << r.out;
}

// Values that were silently read as "not given", or overflowed into a plan that "FITS".
TEST(PlanCli, OutOfRangeValuesAreErrors) {
  struct Case {
    const char* args;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {"--input-len 9223372036854775807 --output-len 1", "--input-len"},
           {"--concurrency 9223372036854775807", "--concurrency"},
           {"--context 1", "--context 1 cannot hold one request"},
           {"--gpus 4611686018427387904 --nodes 3", "--gpus"},
           {"--gpu-price -5", "--gpu-price"},
           {"--gpu-price nan", "--gpu-price"},
           {"--gpu-price inf", "--gpu-price"},
           {"--reserve-gib nan", "--reserve-gib"},
           {"--pue inf", "--pue"},
       }) {
    CliRun r = kiln(std::string("plan --model deepseek-v3 --gpu H200 ") + c.args);
    EXPECT_EQ(r.status, 1) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << ": " << r.out;
  }
  for (const char* price : {"-7", "nan", "3abc"}) {
    CliRun r = kiln(std::string("plan --model deepseek-v3 --compare H200:price=") + price);
    EXPECT_EQ(r.status, 1) << price << ": " << r.out;
    EXPECT_NE(r.out.find("price must be"), std::string::npos) << price << ": " << r.out;
  }
  CliRun ok = kiln("plan --model deepseek-v3 --gpu H200 --gpu-price 0 --reserve-gib 0 --context 1424");
  EXPECT_EQ(ok.status, 0) << ok.out;
}

// A malformed --catalog names the file and the field, never a library's message.
TEST(PlanCli, MalformedCatalogNamesTheField) {
  const std::string dir = testing::TempDir() + "/kiln_catalog_test";
  std::filesystem::create_directories(dir);
  const auto catalog =
      std::filesystem::path(KILN_TEST_DATA).parent_path().parent_path() / "src" / "plan" / "hardware_catalog.json";
  const nlohmann::json base = nlohmann::json::parse(std::ifstream(catalog));
  auto run_with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = base;
    edit(j);
    std::ofstream(dir + "/c.json") << j.dump();
    return kiln("plan --model deepseek-v3 --gpu H200 --catalog " + dir + "/c.json");
  };
  CliRun r = run_with([](nlohmann::json& j) { j["gpus"][0]["aliases"] = "h2"; });
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("\"aliases\" must be a list of strings"), std::string::npos) << r.out;
  r = run_with([](nlohmann::json& j) { j["gpus"][0]["vendor"] = 5; });
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("\"vendor\" must be a string"), std::string::npos) << r.out;
  r = run_with([](nlohmann::json& j) { j["gpus"][0]["hbm_visible_bytes"] = 1e300; });
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("hbm_visible_bytes"), std::string::npos) << r.out;
  r = run_with([](nlohmann::json& j) { j["gpus"][1]["name"] = j["gpus"][0]["name"]; });
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("is taken by"), std::string::npos) << r.out;
  r = kiln("plan --model deepseek-v3 --gpu H200 --catalog " + dir);
  EXPECT_NE(r.out.find("a folder, not a file"), std::string::npos) << r.out;
  EXPECT_EQ(r.status, 1);
}

}  // namespace
