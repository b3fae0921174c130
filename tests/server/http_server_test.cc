// The event-loop front end (src/server/http) against hostile and unusual clients, with a fake
// handler in place of the engine: pipelining, smuggling, framing, limits, deadlines, half-close,
// backpressure, the connection cap and shutdown. Deadlines are shortened for the test; every
// bound on time here is a generous functional one (seconds against configured deadlines of about
// one), never a measured latency.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "http_client.h"
#include "server/http/http_server.h"

namespace kiln::server::test {
namespace {

using namespace std::chrono_literals;

class FakeHandler : public http::Handler {
 public:
  std::optional<http::Response> screen(const http::Request& head) override {
    if (head.path == "/secret" && head.header("Authorization") != "yes") return error(401, "no key");
    if (head.path == "/nope") return error(404, "no route");
    return std::nullopt;
  }
  void handle(http::Request& req, http::Response& res) override {
    {
      std::lock_guard l(mu);
      executed.push_back(req.method + " " + req.path);
    }
    if (req.path == "/flood") {
      // Far more than a client that stops reading may leave pending: its end must be the close.
      auto alive = std::make_shared<int>(0);
      dropped = alive;
      res.provider = [alive](http::DataSink& sink) {
        const std::string piece(64 << 10, 'x');
        for (int i = 0; i < 16; ++i)
          if (!sink.write(piece.data(), piece.size())) return false;
        return true;
      };
      return;
    }
    if (req.path == "/woken") {
      // Writes one event each time its source wakes the connection; three, then the end.
      auto count = std::make_shared<int>(0);
      res.subscribe = [this](http::Wake w) {
        std::lock_guard l(mu);
        wake = std::move(w);
      };
      res.provider = [count](http::DataSink& sink) {
        const std::string ev = "event " + std::to_string(++*count) + "\n";
        if (!sink.write(ev.data(), ev.size())) return false;
        if (*count >= 4) sink.done();
        return true;
      };
      return;
    }
    res.set_content("path=" + req.path + " body=" + req.body, "text/plain");
  }
  http::Response error(int status, const std::string& message) override {
    http::Response r;
    r.status = status;
    if (status == 503) r.set_header("Retry-After", "1");
    r.set_content("error: " + message, "text/plain");
    return r;
  }
  void answered(const http::Request&, const http::Response&) override {}

  std::vector<std::string> ran() {
    std::lock_guard l(mu);
    return executed;
  }
  std::mutex mu;
  std::vector<std::string> executed;
  std::weak_ptr<int> dropped;
  http::Wake wake;
};

class HttpFrontEnd : public ::testing::Test {
 protected:
  void start(http::Limits limits = {}) {
    server_ = std::make_unique<http::HttpServer>(limits, handler_, 2);
    ASSERT_TRUE(server_->bind("127.0.0.1", 0));
    loop_ = std::thread([this] { server_->run(); });
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (loop_.joinable()) loop_.join();
  }
  int port() const { return server_->port(); }
  FakeHandler handler_;
  std::unique_ptr<http::HttpServer> server_;
  std::thread loop_;
};

std::string get(const std::string& path, const std::string& extra = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + extra + "\r\n";
}

TEST_F(HttpFrontEnd, PipelinedRequestsAnsweredInOrder) {
  start();
  RawClient c(port());
  ASSERT_TRUE(c.send_all(get("/a") + "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nxyz" + get("/c")));
  const std::string r = c.read(10, "path=/c");
  const size_t a = r.find("path=/a"), b = r.find("path=/b body=xyz"), cc = r.find("path=/c");
  ASSERT_NE(a, std::string::npos) << r;
  ASSERT_NE(b, std::string::npos) << r;
  ASSERT_NE(cc, std::string::npos) << r;
  EXPECT_LT(a, b);
  EXPECT_LT(b, cc);
}

TEST_F(HttpFrontEnd, RequestInsideABodyIsNeverExecuted) {
  start();
  RawClient c(port());
  const std::string inner = get("/smuggled");
  ASSERT_TRUE(c.send_all("POST /outer HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(inner.size()) +
                         "\r\n\r\n" + inner + get("/after")));
  const std::string r = c.read(10, "path=/after");
  EXPECT_NE(r.find("path=/outer body=GET /smuggled"), std::string::npos) << r;
  EXPECT_NE(r.find("path=/after"), std::string::npos) << r;
  for (const auto& e : handler_.ran()) EXPECT_EQ(e.find("/smuggled"), std::string::npos) << e;
}

// RFC 9112 §6.3: a request whose length cannot be told for sure is refused and its connection
// closed; nothing after it on that connection runs.
TEST_F(HttpFrontEnd, ConflictingFramingRefusedAndClosed) {
  start();
  const std::vector<std::string> heads = {
      "Content-Length: 3\r\nContent-Length: 40\r\n",
      "Content-Length: 12abc\r\n",
      "Content-Length: -1\r\n",
      "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
      "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
      "Transfer-Encoding: gzip\r\n",
      "Transfer-Encoding: chunked, gzip\r\n",
  };
  for (const auto& h : heads) {
    RawClient c(port());
    ASSERT_TRUE(c.send_all("POST /framed HTTP/1.1\r\nHost: x\r\n" + h + "\r\n3\r\nabc\r\n0\r\n\r\n" + get("/next")));
    const std::string r = c.read(10);
    EXPECT_EQ(r.rfind("HTTP/1.1 400", 0), 0u) << h << r;
    EXPECT_TRUE(c.closed()) << h;
    EXPECT_EQ(r.find("path=/next"), std::string::npos) << h << r;
  }
  for (const auto& e : handler_.ran()) EXPECT_EQ(e, "never") << "a request with bad framing ran";
}

TEST_F(HttpFrontEnd, ChunkedBodyRead) {
  start();
  RawClient c(port());
  ASSERT_TRUE(
      c.send_all("POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"));
  EXPECT_NE(c.read(10, "body=abcde").find("body=abcde"), std::string::npos);
}

// A request line or head past its limit is refused while it is still arriving, so the server
// never holds more than the limit of it.
TEST_F(HttpFrontEnd, HugeRequestLineAndHeadersRefused) {
  start();
  {
    RawClient c(port());
    c.send_all("GET /" + std::string(1 << 20, 'a'));
    const std::string r = c.read(10);
    EXPECT_EQ(r.rfind("HTTP/1.1 414", 0), 0u) << r.substr(0, 200);
  }
  {
    RawClient c(port());
    std::string many = "GET / HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < 10000; ++i) many += "X-" + std::to_string(i) + ": y\r\n";
    c.send_all(many + "\r\n");
    const std::string r = c.read(10);
    EXPECT_EQ(r.rfind("HTTP/1.1 431", 0), 0u) << r.substr(0, 200);
  }
  {
    RawClient c(port());
    std::string few = "GET / HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < 200; ++i) few += "X-" + std::to_string(i) + ": y\r\n";
    c.send_all(few + "\r\n");
    const std::string r = c.read(10);
    EXPECT_EQ(r.rfind("HTTP/1.1 431", 0), 0u) << r.substr(0, 200);
  }
  {
    RawClient c(port());
    c.send_all("GET / HTTP/1.1\r\nX-Big: " + std::string(16 << 20, 'b') + "\r\n\r\n");
    const std::string r = c.read(10);
    EXPECT_EQ(r.rfind("HTTP/1.1 431", 0), 0u) << r.substr(0, 200);
  }
  RawClient ok(port());
  ok.send_all(get("/fine"));
  EXPECT_NE(ok.read(10, "path=/fine").find("path=/fine"), std::string::npos);
}

TEST_F(HttpFrontEnd, OversizedBodyRefusedFromItsHeadAndDropped) {
  http::Limits l;
  l.max_body_bytes = 1000;
  start(l);
  RawClient c(port());
  // The 413 comes from the head, before the body is sent; the body then read on and dropped
  // keeps the connection in step for the next request.
  ASSERT_TRUE(c.send_all("POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n"));
  EXPECT_EQ(c.read(10, "\r\n\r\n").rfind("HTTP/1.1 413", 0), 0u);
  ASSERT_TRUE(c.send_all(std::string(5000, 'z') + get("/next")));
  EXPECT_NE(c.read(10, "path=/next").find("path=/next"), std::string::npos);
  for (const auto& e : handler_.ran()) EXPECT_NE(e, "POST /big");
  // Past the drain bound (8 times the limit) the connection is closed instead.
  RawClient d(port());
  ASSERT_TRUE(d.send_all("POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 9000000\r\n\r\n"));
  EXPECT_EQ(d.read(10).rfind("HTTP/1.1 413", 0), 0u);
  EXPECT_TRUE(d.closed());
}

TEST_F(HttpFrontEnd, KeyCheckedBeforeAnyBodyIsRead) {
  start();
  RawClient c(port());
  ASSERT_TRUE(c.send_all("POST /secret HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n"));
  EXPECT_EQ(c.read(10, "no key").rfind("HTTP/1.1 401", 0), 0u);
  EXPECT_TRUE(handler_.ran().empty());
}

TEST_F(HttpFrontEnd, HalfClosedClientIsAnswered) {
  start();
  RawClient c(port());
  ASSERT_TRUE(c.send_all("POST /half HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"));
  c.shut_write();
  const std::string r = c.read(10);
  EXPECT_NE(r.find("path=/half body=hi"), std::string::npos) << r;
  EXPECT_TRUE(c.closed());
}

// Slow clients (a byte now and then) are closed by the header deadline while a normal client is
// answered meanwhile: the loop is never theirs to hold.
TEST_F(HttpFrontEnd, SlowlorisClosedByHeaderDeadline) {
  http::Limits l;
  l.header_timeout = 1000ms;
  start(l);
  std::vector<std::unique_ptr<RawClient>> slow;
  for (int i = 0; i < 200; ++i) {
    slow.push_back(std::make_unique<RawClient>(port()));
    slow.back()->send_all("GET / HTTP/1.1\r\n");
  }
  RawClient normal(port());
  normal.send_all(get("/normal"));
  EXPECT_NE(normal.read(5, "path=/normal").find("path=/normal"), std::string::npos);
  // A byte every 200 ms for up to 10 s: each is cut off by the 1 s header deadline.
  const auto end = std::chrono::steady_clock::now() + 10s;
  size_t open = slow.size();
  while (open > 0 && std::chrono::steady_clock::now() < end) {
    open = 0;
    for (auto& s : slow)
      if (s->send_all("X")) ++open;
    std::this_thread::sleep_for(200ms);
  }
  EXPECT_EQ(open, 0u) << "slow clients still connected after 10 s against a 1 s header deadline";
}

TEST_F(HttpFrontEnd, ConnectionCapAnswers503WithRetryAfter) {
  http::Limits l;
  l.max_connections = 4;
  start(l);
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 4; ++i) held.push_back(std::make_unique<RawClient>(port()));
  std::this_thread::sleep_for(200ms);  // lets the loop accept them (not a timing assertion)
  RawClient extra(port());
  const std::string r = extra.read(10);
  EXPECT_EQ(r.rfind("HTTP/1.1 503", 0), 0u) << r;
  EXPECT_NE(r.find("Retry-After: 1"), std::string::npos) << r;
}

// A client that stops reading a stream is disconnected once its pending bytes pass the bound,
// and the stream's source is dropped (in the server: its request cancelled, its KV freed).
TEST_F(HttpFrontEnd, StreamToAClientThatStopsReadingIsDropped) {
  http::Limits l;
  l.max_pending_bytes = 1 << 20;
  start(l);
  RawClient c(port());
  const int small = 4096;
  setsockopt(c.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  ASSERT_TRUE(c.send_all(get("/flood")));
  // The provider writes 1 MiB per pull (on the first pull and once a second after).
  bool gone = false;
  for (int i = 0; i < 300 && !gone; ++i) {
    std::this_thread::sleep_for(100ms);
    gone = handler_.executed.size() == 1 && handler_.dropped.expired();
  }
  EXPECT_TRUE(gone) << "the stream's source was still held after 30 s";
}

TEST_F(HttpFrontEnd, StreamPulledWhenItsSourceWakes) {
  start();
  RawClient c(port());
  ASSERT_TRUE(c.send_all(get("/woken")));
  EXPECT_NE(c.read(10, "event 1").find("event 1"), std::string::npos);
  for (int i = 0; i < 3; ++i) {
    http::Wake w;
    for (int t = 0; t < 100 && !w; ++t) {
      {
        std::lock_guard l(handler_.mu);
        w = handler_.wake;
      }
      if (!w) std::this_thread::sleep_for(10ms);
    }
    ASSERT_TRUE(w);
    w();
  }
  const std::string r = c.read(10, "0\r\n\r\n");
  EXPECT_NE(r.find("event 4"), std::string::npos) << r;
  EXPECT_NE(r.find("Transfer-Encoding: chunked"), std::string::npos) << r;
}

TEST_F(HttpFrontEnd, ShutdownClosesConnectionsStillSendingHeaders) {
  start();
  RawClient slow(port());
  slow.send_all("GET / HTTP/1.1\r\nX-Slow: ");
  std::this_thread::sleep_for(200ms);
  server_->stop_accepting();
  slow.read(10);
  EXPECT_TRUE(slow.closed());
}

}  // namespace
}  // namespace kiln::server::test
