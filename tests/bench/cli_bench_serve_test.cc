// `kiln bench serve` end to end against the fake server: a two-point sweep writes a well-formed
// JSON and SVG; a server failing some requests is reported, not crashed on; Ctrl-C writes what was
// measured; bad flags name themselves.
#include <gtest/gtest.h>

#include <filesystem>

#include "bench_json_check.h"
#include "bench_test_util.h"
#include "fake_server.h"
#include "test_util.h"

namespace kiln::bench {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("kiln_bench_cli_" + std::to_string(getpid()) + "_" +
                                               std::to_string(reinterpret_cast<uintptr_t>(this)));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

TEST(BenchServeCli, TwoPointSweepWritesJsonAndSvg) {
  test::FakeServer server({.ttft_ms = 20, .itl_ms = 4});
  TempDir tmp;
  const std::string out = tmp.file("sweep.json");
  auto r = kiln::test::run_kiln("bench serve --base-url " + server.url() +
                                " --concurrency 1,2 --num-prompts 4 --input-len 32 --output-len 8 --gpus 2"
                                " --gpu-price 3 --power-kw-per-gpu 0.7 --usd-per-kwh 0.1 --pue 1.2 --label fake"
                                " --out " +
                                out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("| concurrency |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("J/output tok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fake (fake-model)"), std::string::npos) << r.out;
  const nlohmann::json j = kiln::test::read_json(out);
  test::expect_well_formed(j, 2, 4, 8);
  EXPECT_EQ(j["summary"][0]["concurrency"], 1);
  EXPECT_EQ(j["summary"][1]["concurrency"], 2);
  EXPECT_EQ(j["summary"][1]["max_in_flight"], 2);
  EXPECT_EQ(j["server"]["model"], "fake-model");
  EXPECT_EQ(j["cost"]["gpus"], 2);
  EXPECT_TRUE(j["summary"][0].contains("joules_per_output_token"));
  EXPECT_EQ(j["workload"]["tokenizer"], "approximate (4 bytes per token)");
  // The warm-up request is not measured: 1 + 2 x 4 requests reached the server.
  EXPECT_EQ(server.requests(), 9);
  test::expect_chart(test::slurp(tmp.file("sweep.svg")), 2);
}

// A client cannot see the server's accelerators: without --gpus the report says so and gives no
// per-GPU figure (it once assumed one GPU), and per-GPU prices need the count.
TEST(BenchServeCli, WithoutGpusTheAcceleratorsAreUnknown) {
  test::FakeServer server({.ttft_ms = 5, .itl_ms = 1});
  TempDir tmp;
  const std::string out = tmp.file("nogpus.json");
  auto r = kiln::test::run_kiln("bench serve --base-url " + server.url() +
                                " --concurrency 1 --num-prompts 2 --input-len 8 --output-len 4 --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("accelerators unknown (no --gpus)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("per GPU"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("GPU(s)"), std::string::npos) << r.out;
  const nlohmann::json j = kiln::test::read_json(out);
  EXPECT_TRUE(j["cost"]["gpus"].is_null()) << j["cost"].dump();
  EXPECT_TRUE(j["summary"][0]["gpus"].is_null());
  EXPECT_TRUE(j["summary"][0]["output_tok_s_per_gpu"].is_null());
  const std::string svg = test::slurp(tmp.file("nogpus.svg"));
  EXPECT_NE(svg.find("output tok/s (whole server)"), std::string::npos);
  EXPECT_EQ(svg.find("per GPU"), std::string::npos);

  for (const char* flags : {"--gpu-price 2", "--power-kw-per-gpu 0.7"}) {
    r = kiln::test::run_kiln("bench serve --base-url " + server.url() + " --num-prompts 1 " + flags);
    EXPECT_EQ(r.exit_code, 1) << flags << ": " << r.out;
    EXPECT_NE(r.out.find("give --gpus N too"), std::string::npos) << flags << ": " << r.out;
  }
  r = kiln::test::run_kiln("bench serve --base-url " + server.url() + " --num-prompts 1 --gpus 0");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--gpus must be at least 1"), std::string::npos) << r.out;
}

TEST(BenchServeCli, FailingRequestsAreReportedNotFatal) {
  test::FakeServer server({.ttft_ms = 5, .itl_ms = 1, .fail_every = 2});
  TempDir tmp;
  const std::string out = tmp.file("fail.json");
  auto r =
      kiln::test::run_kiln("bench serve --base-url " + server.url() +
                           " --concurrency 2 --num-prompts 8 --input-len 16 --output-len 4 --warmup 0 --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("4 request(s) failed with http_500"), std::string::npos) << r.out;
  const nlohmann::json j = kiln::test::read_json(out);
  EXPECT_EQ(j["summary"][0]["completed"], 4);
  EXPECT_EQ(j["summary"][0]["failed"], 4);
  EXPECT_EQ(j["summary"][0]["errors"]["http_500"], 4);
  int failed_records = 0;
  for (const auto& rec : j["requests"]) failed_records += rec["success"] == false && rec["http_status"] == 500;
  EXPECT_EQ(failed_records, 4);
}

TEST(BenchServeCli, NothingListeningIsReported) {
  int port;
  {
    test::FakeServer gone({});
    port = gone.port();
  }
  TempDir tmp;
  const std::string out = tmp.file("down.json");
  auto r = kiln::test::run_kiln("bench serve --base-url http://127.0.0.1:" + std::to_string(port) +
                                " --num-prompts 2 --warmup 0 --output-len 2 --input-len 4 --out " + out);
  EXPECT_EQ(r.exit_code, 1) << r.out;  // nothing completed
  EXPECT_NE(r.out.find("failed with connect"), std::string::npos) << r.out;
  EXPECT_EQ(kiln::test::read_json(out)["summary"][0]["errors"]["connect"], 2);
}

TEST(BenchServeCli, CtrlCWritesWhatWasMeasured) {
  // Every second request hangs: the run can only end by interruption.
  test::FakeServer server({.ttft_ms = 5, .itl_ms = 2, .hang_every = 2});
  TempDir tmp;
  const std::string out = tmp.file("cut.json");
  test::Child kiln(test::words(std::string(KILN_BINARY) + " --log-level warn bench serve --base-url " + server.url() +
                               " --concurrency 2 --num-prompts 20 --warmup 0 --input-len 8 --output-len 4"
                               " --request-timeout 60 --out " +
                               out),
                   tmp.file("log.txt"));
  ASSERT_TRUE(kiln.started());
  // Wait until both slots hang, then interrupt.
  for (int i = 0; i < 500 && server.requests() < 4; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  kiln.signal(SIGINT);
  const int code = kiln.wait(20);
  EXPECT_EQ(code, 130) << test::slurp(tmp.file("log.txt"));
  const nlohmann::json j = kiln::test::read_json(out);
  EXPECT_EQ(j["interrupted"], true);
  ASSERT_EQ(j["summary"].size(), 1u);
  EXPECT_GE(j["summary"][0]["completed"].get<int>(), 1);
  EXPECT_EQ(j["summary"][0]["interrupted"], 2);
  EXPECT_NE(test::slurp(tmp.file("log.txt")).find("interrupted"), std::string::npos);
}

TEST(BenchServeCli, BadFlagsNameThemselves) {
  auto r = kiln::test::run_kiln("bench serve --base-url http://127.0.0.1:1 --concurrency 0,4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--concurrency"), std::string::npos) << r.out;
  r = kiln::test::run_kiln("bench serve --base-url http://127.0.0.1:1 --workload nope");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--workload nope"), std::string::npos) << r.out;
  r = kiln::test::run_kiln("bench serve --base-url http://127.0.0.1:1 --pue 0.5");
  EXPECT_NE(r.out.find("--pue"), std::string::npos) << r.out;
  r = kiln::test::run_kiln("bench serve --base-url http://127.0.0.1:1 --extra-body [1]");
  EXPECT_NE(r.out.find("--extra-body"), std::string::npos) << r.out;
  r = kiln::test::run_kiln("bench --help");
  EXPECT_NE(r.out.find("serve"), std::string::npos) << r.out;
  // Outputs are checked before the run: an unwritable --out, and an --out whose chart (beside it,
  // .svg) would be written over it.
  r = kiln::test::run_kiln("bench serve --base-url http://127.0.0.1:1 --out /nonexistent/r.json");
  EXPECT_NE(r.out.find("--out /nonexistent/r.json: the folder"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("requests"), std::string::npos) << "ran before checking: " << r.out;
  r = kiln::test::run_kiln("bench serve --base-url http://127.0.0.1:1 --out " + testing::TempDir() + "/r.svg");
  EXPECT_NE(r.out.find("give the report another name"), std::string::npos) << r.out;
  r = kiln::test::run_kiln("bench serve --base-url http://127.0.0.1:1 --num-prompts 0");
  EXPECT_NE(r.out.find("--num-prompts must be positive"), std::string::npos) << r.out;
  // Other subcommands' flags found by the same audit.
  r = kiln::test::run_kiln("--log-level bogus plan --model deepseek-v3 --gpu H200");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--log-level"), std::string::npos) << r.out;
  r = kiln::test::run_kiln("bench model --config " +
                           kiln::test::data_path("fixtures/h5_noqlora_dense2_odd/config.json") +
                           " --random-weights --block-size 0");
  EXPECT_EQ(r.exit_code, 1) << r.out;  // was SIGFPE
  EXPECT_NE(r.out.find("--block-size"), std::string::npos) << r.out;
  r = kiln::test::run_kiln("bench model --config " +
                           kiln::test::data_path("fixtures/h5_noqlora_dense2_odd/config.json") +
                           " --random-weights --batch-sizes 1,,2");
  EXPECT_NE(r.out.find("--batch-sizes: \"\" is not a count"), std::string::npos) << r.out;
  r = kiln::test::run_kiln("bench model --config " +
                           kiln::test::data_path("fixtures/h5_noqlora_dense2_odd/config.json") +
                           " --random-weights --json /nonexistent/x.json");
  EXPECT_NE(r.out.find("--json /nonexistent/x.json: the folder"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kiln::bench
