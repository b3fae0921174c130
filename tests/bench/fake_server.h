// A fake OpenAI-compatible server for the benchmark's tests: it streams SSE at a programmed rate
// (first token `ttft_ms` after the request is read, then one every `itl_ms`, on an absolute
// schedule so lateness never accumulates), so the metric code can be checked against known values,
// and it fails on demand (HTTP 500, cut connections, silence, error events) so error handling can
// be. One thread on epoll with a timerfd serves thousands of streams: it must never be the
// bottleneck of the load-generator measurement. Listens on 127.0.0.1 only.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

namespace kiln::bench::test {

struct FakeServerOptions {
  double ttft_ms = 20;            // request fully read -> first token event
  double itl_ms = 5;              // between token events
  int64_t fail_every = 0;         // every Nth completion request gets HTTP 500 (0: never)
  int64_t drop_every = 0;         // every Nth: the connection is cut after 2 tokens
  int64_t hang_every = 0;         // every Nth: headers, then silence until the client gives up
  int64_t error_event_every = 0;  // every Nth: an SSE error event after 2 tokens
  bool usage = true;              // honour stream_options.include_usage
  std::string model = "fake-model";
};

class FakeServer {
 public:
  // port 0: any free port.
  explicit FakeServer(FakeServerOptions opt, int port = 0);
  ~FakeServer();
  FakeServer(const FakeServer&) = delete;
  FakeServer& operator=(const FakeServer&) = delete;

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int64_t requests() const { return requests_.load(); }          // completion requests received
  int64_t max_open_streams() const { return max_open_.load(); }  // most streams open at once
  int64_t tokens_sent() const { return tokens_.load(); }

 private:
  void loop();
  FakeServerOptions opt_;
  int port_ = 0, listen_fd_ = -1, epfd_ = -1, timer_fd_ = -1, wake_fd_ = -1;
  std::atomic<int64_t> requests_{0}, max_open_{0}, tokens_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kiln::bench::test
