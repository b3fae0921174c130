// A response ends with the pull that takes its final chunk. The engine signals a stream only when it
// has output, so a response that waited for one more pull after the final chunk sat until the
// connection's periodic pull (1 s): every streamed request of session 27's front end ended up to a
// second late, halving single-stream throughput through the API. Here the periodic pull is set to
// an hour, so a response that still needs it never ends and the client's deadline fails the test.
#include <gtest/gtest.h>

#include <thread>

#include "engine/engine.h"
#include "model/deepseek_v3.h"
#include "serve_fixture.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server::test {
namespace {

std::string completion_request(bool stream, int n) {
  const std::string body = std::string(R"({"model":"kiln-tiny","prompt":[5,6,7,8,9,10,11,12],"max_tokens":12,)") +
                           R"("temperature":0,"ignore_eos":true,"n":)" + std::to_string(n) +
                           ",\"stream\":" + (stream ? "true" : "false") + "}";
  return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
         "Content-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

TEST(ServerStreamEnd, ResponsesEndWithoutWaitingForThePeriodicPull) {
  if (!have_tiny_weights()) GTEST_SKIP() << "needs the weights of models/kiln-tiny";
  auto be = ops::make_cpu_backend();
  auto model = DeepseekV3Model::load(tiny_model().string(), *be);
  EngineConfig ec;
  ec.kv.num_blocks = 64;
  Engine engine(*model, ec);
  const tok::Tokenizer tokenizer = tok::Tokenizer::load(tiny_model().string());
  ServerConfig sc;
  sc.port = 0;
  sc.model_name = "kiln-tiny";
  sc.pull_interval = std::chrono::hours(1);
  Server server(engine, tokenizer, std::nullopt, sc);
  ASSERT_TRUE(server.bind());
  std::thread loop([&] { server.run(); });

  for (const bool stream : {true, false})
    for (const int n : {1, 3}) {
      // Connection: close, so the read ends when the answer does; 60 s without a byte is a hang.
      const std::string r = http_exchange(server.port(), completion_request(stream, n), 60);
      const std::string what = std::string(stream ? "streamed" : "JSON") + ", n=" + std::to_string(n);
      ASSERT_NE(r.find("200 OK"), std::string::npos) << what << ": " << r.substr(0, 300);
      if (stream)
        EXPECT_NE(r.find("data: [DONE]"), std::string::npos) << what << " never ended: " << r.substr(0, 300);
      else
        EXPECT_NE(r.find("\"finish_reason\":\"length\""), std::string::npos) << what << " never ended: " << r;
    }
  server.shutdown();
  loop.join();
}

}  // namespace
}  // namespace kiln::server::test
