// `bench_fake_server --port 8123 --ttft-ms 50 --itl-ms 50`: the tests' fake OpenAI server as a
// program, to measure `kiln bench serve` itself (docs/results.md). Stops on Ctrl-C, SIGTERM or after
// --duration-s.
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <thread>

#include "fake_server.h"

namespace {
volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_signal(int) {
  g_stop = 1;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fake OpenAI-compatible server streaming at a fixed rate (127.0.0.1 only)"};
  kiln::bench::test::FakeServerOptions o;
  int port = 8123;
  double duration_s = 600;
  app.add_option("--port", port, "TCP port on 127.0.0.1 (0: any)")->capture_default_str();
  app.add_option("--ttft-ms", o.ttft_ms, "first token delay")->capture_default_str();
  app.add_option("--itl-ms", o.itl_ms, "gap between tokens")->capture_default_str();
  app.add_option("--fail-every", o.fail_every, "every Nth request answers HTTP 500");
  app.add_option("--duration-s", duration_s, "exit after this long")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  kiln::bench::test::FakeServer server(o, port);
  std::printf("listening on %s\n", server.url().c_str());
  std::fflush(stdout);
  for (double t = 0; t < duration_s && !g_stop; t += 0.1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::printf("requests %lld, tokens %lld, most open streams %lld\n", static_cast<long long>(server.requests()),
              static_cast<long long>(server.tokens_sent()), static_cast<long long>(server.max_open_streams()));
  return 0;
}
