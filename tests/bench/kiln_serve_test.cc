// `kiln bench serve` against `kiln serve` on the small bundled model: a two-point sweep gives a
// well-formed JSON and SVG, TTFT < E2E for every request, and token counts equal the server's
// usage. Skipped until `kiln serve` exists (issue 7) and models/kiln-tiny has weights.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <filesystem>
#include <sstream>

#include "bench/client.h"
#include "bench_json_check.h"
#include "bench_test_util.h"
#include "test_util.h"

namespace kiln::bench {
namespace {

namespace fs = std::filesystem;

bool kiln_has_serve() {
  std::istringstream help(kiln::test::run_kiln("--help").out);
  for (std::string line; std::getline(help, line);) {
    const size_t p = line.find_first_not_of(' ');
    if (p != std::string::npos && line.compare(p, 6, "serve ") == 0) return true;
  }
  return false;
}

TEST(BenchServeKiln, TwoPointSweepAgainstKilnServe) {
  if (!kiln_has_serve()) GTEST_SKIP() << "needs kiln serve";
  const fs::path model = fs::path(KILN_TEST_DATA) / ".." / ".." / "models" / "kiln-tiny";
  if (!fs::exists(model / "model.safetensors.index.json") && !fs::exists(model / "model.safetensors"))
    GTEST_SKIP() << "needs the weights of models/kiln-tiny";
  const fs::path tmp = fs::temp_directory_path() / ("kiln_bench_serve_" + std::to_string(getpid()));
  fs::create_directories(tmp);
  const int port = kiln::test::free_port();
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  test::Child server(test::words(std::string(KILN_BINARY) + " serve --model " + model.string() +
                                 " --host 127.0.0.1 --port " + std::to_string(port) + " --device cpu"),
                     (tmp / "server.log").string());
  ASSERT_TRUE(server.started());
  bool up = false;
  for (int i = 0; i < 600 && !up; ++i) {  // up to 60 s to load
    up = fetch_models(url, "", 1).contains("data");
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(up) << test::slurp((tmp / "server.log").string());
  const std::string out = (tmp / "kiln.json").string();
  auto r = kiln::test::run_kiln("bench serve --base-url " + url + " --tokenizer " + model.string() +
                                " --concurrency 1,2 --num-prompts 4 --input-len 32 --output-len 8"
                                " --request-timeout 120 --gpus 1 --gpu-price 2 --out " +
                                out);
  ASSERT_EQ(r.exit_code, 0) << r.out << test::slurp((tmp / "server.log").string());
  const nlohmann::json j = kiln::test::read_json(out);
  test::expect_well_formed(j, 2, 4, 8);
  for (const auto& s : j["summary"]) {
    EXPECT_EQ(s["failed"], 0) << s["errors"].dump();
    // A Kiln server: the engine's time by phase over the point, from its /metrics.
    ASSERT_TRUE(s.contains("engine")) << s.dump();
    EXPECT_GT(s["engine"]["steps"].get<double>(), 0);
    EXPECT_GT(s["engine"]["forward_s"].get<double>(), 0);
    const double busy = s["engine"]["busy_fraction"].get<double>();
    EXPECT_GT(busy, 0);
    EXPECT_LE(busy, 1.05);  // the steps run inside the point's wall time
  }
  EXPECT_NE(r.out.find("Kiln device busy"), std::string::npos) << r.out;
  // Exact prompt lengths through the model's tokenizer: the server counts what we meant to send.
  for (const auto& rec : j["requests"]) EXPECT_NEAR(rec["prompt_tokens"].get<double>(), 32, 4) << rec.dump();
  test::expect_chart(test::slurp((tmp / "kiln.svg").string()), 2);
  server.signal(SIGTERM);
  server.wait(20);
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace kiln::bench
