// kiln_fake_serve_old: the OLD front end (cpp-httplib 0.11, a thread per connection, as `kiln serve`
// had it before commit 98572c9) in front of the same fake engine as tests/server/fake_engine_serve.cc,
// so that scripts/http-frontend-ab.sh compares the two HTTP layers alone (issue 38, docs/results.md).
//
// Not part of the build: scripts/frontend-ab/build-old.sh compiles it inside a worktree of 98572c9^
// against that tree's src/engine/stream.{h,cc} (the engine -> front end hand-off of the time) and the
// system cpp-httplib, linked as the old src/server/CMakeLists.txt did (pkg-config cpp-httplib).
//
//   kiln_fake_serve_old [--port 8000] [--step-ms 20] [--http-threads 1100] [--max-pending 1024]
//
// What is kept from the old src/server (server.cc, generate.cc, response.cc at 98572c9^): the
// httplib settings of Server's constructor (pool size, timeouts, TCP_NODELAY, backlog 4096, body
// limit), bodies read through the ContentReader, the --max-pending-requests 503, and the chunked
// content provider of respond_stream / respond_json that waits on the RequestStream 200 ms at a time
// and writes a keep-alive comment after 1 s of silence. What is the fake's: no model, no tokenizer,
// no request validation; one token per stream per step, each written as its own event in the same
// bytes as kiln_fake_serve's (so `kiln bench serve` reads both alike).
#include <httplib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/stream.h"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// The fake engine: every step_ms its thread pushes one token into every live stream's StreamState
// (as the old Engine did after each step), the last one with finish set. With step_ms 0 a stream
// gets all its tokens when it is admitted.
class FakeEngine {
 public:
  explicit FakeEngine(int step_ms) : step_ms_(step_ms) {
    if (step_ms_ > 0) thread_ = std::thread([this] { loop(); });
  }
  ~FakeEngine() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  kiln::RequestStream submit(int64_t max_tokens) {
    auto s = std::make_shared<kiln::StreamState>(++ids_);
    if (step_ms_ <= 0 || max_tokens <= 0) {  // nothing to wait for: everything now
      kiln::OutputChunk c;
      for (int64_t i = 0; i < max_tokens; ++i) c.token_ids.push_back(static_cast<int32_t>(i));
      finish(c, max_tokens);
      s->push(std::move(c));
    } else {
      std::lock_guard l(mu_);
      live_.push_back({s, 0, max_tokens});
    }
    return kiln::RequestStream(s);
  }

 private:
  struct Live {
    std::weak_ptr<kiln::StreamState> s;
    int64_t next = 0, max = 0;
  };
  static void finish(kiln::OutputChunk& c, int64_t max_tokens) {
    c.finish = kiln::FinishReason::Length;
    c.output_tokens = max_tokens;
  }
  void loop() {
    auto next = Clock::now();
    while (!stop_) {
      next += std::chrono::milliseconds(step_ms_);
      std::this_thread::sleep_until(next);
      std::lock_guard l(mu_);
      // A stream whose connection dropped its RequestStream (a cancel) or that finished is removed.
      std::erase_if(live_, [](Live& v) {
        auto s = v.s.lock();
        if (!s || s->cancel_requested) return true;
        kiln::OutputChunk c;
        c.token_ids.push_back(static_cast<int32_t>(v.next));
        if (++v.next == v.max) finish(c, v.max);
        s->push(std::move(c));
        return v.next == v.max;
      });
    }
  }
  const int step_ms_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> ids_{0};
  std::mutex mu_;
  std::vector<Live> live_;
  std::thread thread_;
};

// The event for token i, byte for byte what kiln_fake_serve writes.
std::string token_event(const std::string& id, bool chat, int64_t i, bool last) {
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", last ? json("length") : json(nullptr)}};
  if (chat)
    choice["delta"] = {{"content", " tok" + std::to_string(i)}};
  else
    choice["text"] = " tok" + std::to_string(i);
  const json j = {{"id", id},
                  {"object", chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", 0},
                  {"model", "fake"},
                  {"choices", json::array({choice})}};
  return "data: " + j.dump() + "\n\n";
}

std::string whole_body(bool chat, int64_t max_tokens) {
  std::string text;
  for (int64_t i = 0; i < max_tokens; ++i) text += " tok" + std::to_string(i);
  json choice = {{"index", 0}, {"finish_reason", "length"}, {"logprobs", nullptr}};
  if (chat)
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  else
    choice["text"] = text;
  return json{{"id", "cmpl-fake"},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"model", "fake"},
              {"choices", json::array({choice})},
              {"usage", {{"prompt_tokens", 1}, {"completion_tokens", max_tokens}, {"total_tokens", max_tokens + 1}}}}
      .dump();
}

void send_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(
      json{{"error", {{"message", message}, {"type", "invalid_request_error"}, {"param", nullptr}, {"code", nullptr}}}}
              .dump() +
          "\n",
      "application/json");
}

struct Config {
  int port = 8000, step_ms = 20, threads = 1100;  // threads: old ServerConfig::threads default
  int64_t max_pending = 1024;                     // old ServerConfig::max_pending_requests default
  size_t max_body_bytes = 8u << 20;               // old ServerConfig::max_body_bytes default
};

class OldServer {
 public:
  OldServer(const Config& cfg, FakeEngine& engine) : cfg_(cfg), engine_(engine) {
    // As the old Server's constructor (server.cc at 98572c9^), comments there.
    const int threads = std::max(cfg_.threads, 2);
    http_.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
    http_.set_payload_max_length(cfg_.max_body_bytes);
    http_.set_keep_alive_timeout(30);
    http_.set_read_timeout(30);
    http_.set_write_timeout(30);
    http_.set_tcp_nodelay(true);
    http_.set_socket_options([this](int sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listen_fd_ = sock;
    });
    http_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    http_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake","object":"model","owned_by":"kiln"}]})",
                      "application/json");
    });
    http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res,
                                         const httplib::ContentReader& body) { generate(req, res, body, false); });
    http_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res,
                                              const httplib::ContentReader& body) { generate(req, res, body, true); });
  }
  bool bind(int port) {
    if (!http_.bind_to_port("127.0.0.1", port)) return false;
    if (listen_fd_ >= 0) ::listen(listen_fd_, 4096);
    return true;
  }
  void run() { http_.listen_after_bind(); }

 private:
  // One request in flight: holds its slot of max_pending until the provider lets go of it.
  struct Job {
    OldServer* srv = nullptr;
    kiln::RequestStream stream;
    std::string id;
    bool chat = false;
    int64_t max_tokens = 0, sent = 0;
    bool done = false;
    Job(OldServer* s, kiln::RequestStream st) : srv(s), stream(std::move(st)) {}
    ~Job() {
      std::lock_guard l(srv->mu_);
      --srv->jobs_;
    }
  };

  void generate(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader, bool chat) {
    // The old read_body: read through httplib's reader, bounded (drain past the limit elided).
    std::string text;
    bool over = false;
    const bool complete = reader([&](const char* data, size_t n) {
      if (text.size() + n > cfg_.max_body_bytes) {
        over = true;
        return false;
      }
      text.append(data, n);
      return true;
    });
    if (over || res.status == 413) return send_error(res, 413, "the request body is larger than the server's limit");
    if (!complete) return send_error(res, 400, "the request body could not be read");
    const json b = json::parse(text, nullptr, false);
    if (!b.is_object()) return send_error(res, 400, "the body is not a JSON object");
    const int64_t max_tokens = b.value("max_tokens", int64_t{16});
    const bool stream = b.value("stream", false);
    {
      std::lock_guard l(mu_);
      if (jobs_ >= cfg_.max_pending)
        return send_error(
            res, 503, "the server is at its limit of " + std::to_string(cfg_.max_pending) + " requests; retry later");
      ++jobs_;
    }
    auto job = std::make_shared<Job>(this, engine_.submit(max_tokens));
    job->id = "cmpl-fake" + std::to_string(++ids_);
    job->chat = chat;
    job->max_tokens = max_tokens;
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    if (stream) {
      res.set_header("X-Accel-Buffering", "no");
      respond_stream(job, res);
    } else {
      respond_json(job, res);
    }
  }

  // The old respond_stream's loop for one choice: wait up to 200 ms for output, write it, and after
  // 1 s with nothing written an SSE comment (how a departed client was noticed).
  static void respond_stream(const std::shared_ptr<Job>& job, httplib::Response& res) {
    auto last_write = std::make_shared<Clock::time_point>(Clock::now());
    res.set_chunked_content_provider("text/event-stream", [job, last_write](size_t, httplib::DataSink& sink) {
      if (!job->done) {
        auto chunk = job->stream.next_for(std::chrono::milliseconds(200));
        if (chunk) {
          for (size_t t = 0; t < chunk->token_ids.size(); ++t, ++job->sent) {
            const std::string ev = token_event(job->id, job->chat, job->sent, job->sent + 1 == job->max_tokens);
            *last_write = Clock::now();
            if (!sink.write(ev.data(), ev.size())) return false;
          }
          if (chunk->finish) job->done = true;
        } else if (job->stream.done()) {
          job->done = true;
        }
      }
      if (job->done) {
        static const std::string done = "data: [DONE]\n\n";
        if (!sink.write(done.data(), done.size())) return false;
        sink.done();
        return true;
      }
      if (Clock::now() - *last_write > std::chrono::seconds(1)) {
        static const std::string ping = ": keep-alive\n\n";
        *last_write = Clock::now();
        if (!sink.write(ping.data(), ping.size())) return false;
      }
      return true;
    });
  }

  // The old respond_json: the same wait, a space every 500 ms to notice a departed client.
  static void respond_json(const std::shared_ptr<Job>& job, httplib::Response& res) {
    auto last_write = std::make_shared<Clock::time_point>(Clock::now());
    res.set_chunked_content_provider("application/json; charset=utf-8",
                                     [job, last_write](size_t, httplib::DataSink& sink) {
                                       if (!job->done) {
                                         job->stream.next_for(std::chrono::milliseconds(200));
                                         job->done = job->stream.done();
                                       }
                                       if (job->done) {
                                         const std::string s = whole_body(job->chat, job->max_tokens) + "\n";
                                         if (!sink.write(s.data(), s.size())) return false;
                                         sink.done();
                                         return true;
                                       }
                                       if (Clock::now() - *last_write > std::chrono::milliseconds(500)) {
                                         *last_write = Clock::now();
                                         if (!sink.write(" ", 1)) return false;
                                       }
                                       return true;
                                     });
  }

  Config cfg_;
  FakeEngine& engine_;
  httplib::Server http_;
  int listen_fd_ = -1;
  std::mutex mu_;
  int64_t jobs_ = 0;  // under mu_
  std::atomic<uint64_t> ids_{0};
};

void on_signal(int) {
  std::_Exit(0);  // as kiln_fake_serve: a benchmark server needs no graceful stop
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (k == "--port")
      cfg.port = static_cast<int>(v);
    else if (k == "--step-ms")
      cfg.step_ms = static_cast<int>(v);
    else if (k == "--http-threads")
      cfg.threads = static_cast<int>(v);
    else if (k == "--max-pending")
      cfg.max_pending = v;
    else {
      std::fprintf(stderr, "unknown option %s (--port, --step-ms, --http-threads, --max-pending)\n", k.c_str());
      return 2;
    }
  }
  // As the old `kiln serve` (cmd_serve.cc): the most file descriptors allowed, SIGPIPE ignored.
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  FakeEngine engine(cfg.step_ms);
  OldServer server(cfg, engine);
  if (!server.bind(cfg.port)) {
    std::fprintf(stderr, "cannot listen on 127.0.0.1:%d\n", cfg.port);
    return 1;
  }
  std::printf(
      "kiln_fake_serve_old on http://127.0.0.1:%d (cpp-httplib, %d threads; one token per stream every %d ms)\n",
      cfg.port, cfg.threads, cfg.step_ms);
  std::fflush(stdout);
  server.run();
  return 0;
}
