// kiln_fake_serve: the event-loop front end (src/server/http) in front of a fake engine that emits
// tokens at a fixed rate without a model, so that a load test measures the HTTP layer alone:
// streams held, requests/s, and server CPU per streamed token (docs/results.md, "HTTP front end").
// Test-only: built with the server tests, never installed.
//
//   kiln_fake_serve [--port 8000] [--step-ms 20] [--http-threads 2]
//
// POST /v1/completions (or /v1/chat/completions) with {"max_tokens": N, "stream": true|false}:
// one token per stream per engine step, every --step-ms (0: all at once), streamed as OpenAI
// chunks (one event per token, as `kiln serve` writes a one-token step), or answered whole at the
// end. GET /v1/models and /health answer as kiln serve does; /metrics is 404.
#include <sys/resource.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/http/handler.h"
#include "server/http/http_server.h"

namespace {

using namespace kiln::server;
using json = nlohmann::json;

// The fake engine: a step counter advanced every step_ms on its own thread, which then wakes every
// live stream (as the real engine's per-request streams signal their connections after a step).
class FakeEngine {
 public:
  struct Stream {
    http::Wake wake;
    uint64_t start = 0;  // the step it was admitted at
  };
  explicit FakeEngine(int step_ms) : step_ms_(step_ms) {
    if (step_ms_ > 0) thread_ = std::thread([this] { loop(); });
  }
  ~FakeEngine() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Tokens a stream admitted at `start` has by now (all of them when steps are off).
  int64_t ready(uint64_t start, int64_t max_tokens) const {
    if (step_ms_ <= 0) return max_tokens;
    return std::min<int64_t>(max_tokens, static_cast<int64_t>(step_.load() - start));
  }
  std::shared_ptr<Stream> admit() {
    auto s = std::make_shared<Stream>();
    s->start = step_.load();
    return s;
  }
  // Woken after each step from now on; `s->wake` is set before (this thread reads it after).
  void watch(const std::shared_ptr<Stream>& s) {
    std::lock_guard l(mu_);
    live_.push_back(s);
  }

 private:
  void loop() {
    auto next = std::chrono::steady_clock::now();
    while (!stop_) {
      next += std::chrono::milliseconds(step_ms_);
      std::this_thread::sleep_until(next);
      ++step_;
      std::vector<std::shared_ptr<Stream>> wake;
      {
        std::lock_guard l(mu_);
        // Streams whose connection let go of them (done or gone) are dropped here.
        std::erase_if(live_, [](const std::weak_ptr<Stream>& w) { return w.expired(); });
        for (auto& w : live_)
          if (auto s = w.lock()) wake.push_back(std::move(s));
      }
      for (auto& s : wake)
        if (s->wake) s->wake();
    }
  }
  const int step_ms_;
  std::atomic<uint64_t> step_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::weak_ptr<Stream>> live_;
  std::thread thread_;
};

std::string event(const json& j) {
  return "data: " + j.dump() + "\n\n";
}

class FakeHandler : public http::Handler {
 public:
  explicit FakeHandler(FakeEngine& e) : engine_(e) {}
  std::optional<http::Response> screen(const http::Request& head) override {
    const bool gen = head.path == "/v1/completions" || head.path == "/v1/chat/completions";
    if (gen && head.method != "POST") return error(405, "use POST");
    if (!gen && head.path != "/v1/models" && head.path != "/health") return error(404, "no such route");
    return std::nullopt;
  }
  void handle(http::Request& req, http::Response& res) override {
    if (req.path == "/health") return res.set_content(R"({"status":"ok"})", "application/json");
    if (req.path == "/v1/models")
      return res.set_content(R"({"object":"list","data":[{"id":"fake","object":"model","owned_by":"kiln"}]})",
                             "application/json");
    const json b = json::parse(req.body, nullptr, false);
    if (!b.is_object()) {
      res = error(400, "the body is not a JSON object");
      return;
    }
    const bool chat = req.path == "/v1/chat/completions";
    const int64_t max_tokens = b.value("max_tokens", int64_t{16});
    const bool stream = b.value("stream", false);
    auto s = engine_.admit();
    const std::string id = "cmpl-fake" + std::to_string(++ids_);
    auto piece = [chat, id](int64_t i, bool last) {
      json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", last ? json("length") : json(nullptr)}};
      if (chat)
        choice["delta"] = {{"content", " tok" + std::to_string(i)}};
      else
        choice["text"] = " tok" + std::to_string(i);
      return json{{"id", id},
                  {"object", chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", 0},
                  {"model", "fake"},
                  {"choices", json::array({choice})}};
    };
    auto sent = std::make_shared<int64_t>(0);
    res.set_header("Cache-Control", "no-cache");
    res.content_type = stream ? "text/event-stream" : "application/json";
    res.subscribe = [this, s](http::Wake w) {
      s->wake = std::move(w);
      engine_.watch(s);
    };
    res.provider = [this, s, sent, max_tokens, stream, piece, chat](http::DataSink& sink) {
      const int64_t ready = engine_.ready(s->start, max_tokens);
      if (stream) {
        for (; *sent < ready; ++*sent) {
          const std::string ev = event(piece(*sent, *sent + 1 == max_tokens));
          if (!sink.write(ev.data(), ev.size())) return false;
        }
      } else {
        *sent = ready;
      }
      if (*sent < max_tokens) return true;
      std::string tail;
      if (stream) {
        tail = "data: [DONE]\n\n";
      } else {
        std::string text;
        for (int64_t i = 0; i < max_tokens; ++i) text += " tok" + std::to_string(i);
        json choice = {{"index", 0}, {"finish_reason", "length"}, {"logprobs", nullptr}};
        if (chat)
          choice["message"] = {{"role", "assistant"}, {"content", text}};
        else
          choice["text"] = text;
        tail =
            json{{"id", "cmpl-fake"},
                 {"object", chat ? "chat.completion" : "text_completion"},
                 {"model", "fake"},
                 {"choices", json::array({choice})},
                 {"usage", {{"prompt_tokens", 1}, {"completion_tokens", max_tokens}, {"total_tokens", max_tokens + 1}}}}
                .dump();
      }
      if (!sink.write(tail.data(), tail.size())) return false;
      sink.done();
      return true;
    };
  }
  http::Response error(int status, const std::string& message) override {
    http::Response r;
    r.status = status;
    if (status == 503 || status == 429) r.set_header("Retry-After", "1");
    r.set_content(
        json{
            {"error", {{"message", message}, {"type", "invalid_request_error"}, {"param", nullptr}, {"code", nullptr}}}}
            .dump(),
        "application/json");
    return r;
  }
  void answered(const http::Request&, const http::Response&) override {}

 private:
  FakeEngine& engine_;
  std::atomic<uint64_t> ids_{0};
};

void on_signal(int) {
  // stop() is not async-signal-safe; exiting at once is what a benchmark server needs.
  std::_Exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  int port = 8000, step_ms = 20, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--port")
      port = v;
    else if (k == "--step-ms")
      step_ms = v;
    else if (k == "--http-threads")
      threads = v;
    else {
      std::fprintf(stderr, "unknown option %s (--port, --step-ms, --http-threads)\n", k.c_str());
      return 2;
    }
  }
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  FakeEngine engine(step_ms);
  FakeHandler handler(engine);
  http::HttpServer server(http::Limits{}, handler, threads);
  if (!server.bind("127.0.0.1", port)) {
    std::fprintf(stderr, "cannot listen on 127.0.0.1:%d\n", port);
    return 1;
  }
  std::printf("kiln_fake_serve on http://127.0.0.1:%d (one token per stream every %d ms, %d HTTP threads)\n",
              server.port(), step_ms, threads);
  std::fflush(stdout);
  server.run();
  return 0;
}
