#include "fake_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <fmt/format.h>
#include <chrono>
#include <cstring>
#include <queue>
#include <stdexcept>
#include <unordered_map>

namespace kiln::bench::test {
namespace {

using Clock = std::chrono::steady_clock;

enum class Mode { kNormal, kHang, kDrop, kErrorEvent };

struct Conn {
  int fd = -1;
  std::string in, out;  // unread request bytes; unwritten response bytes
  bool streaming = false, close_after = false, chat = false, usage = false;
  Mode mode = Mode::kNormal;
  int64_t seq = 0, max_tokens = 0, sent = 0, prompt_tokens = 0;
  Clock::time_point start;
};

struct Due {
  Clock::time_point t;
  uint64_t id;
  bool operator>(const Due& o) const { return t > o.t; }
};

std::string chunk(const std::string& payload) {
  return fmt::format("{:x}\r\n{}\r\n", payload.size(), payload);
}

std::string event(const nlohmann::json& j) {
  return chunk("data: " + j.dump() + "\n\n");
}

std::string http_json(int status, const char* reason, const std::string& body) {
  return fmt::format("HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}", status, reason,
                     body.size(), body);
}

int64_t approx_tokens(size_t bytes) {
  return static_cast<int64_t>((bytes + 3) / 4);
}

}  // namespace

FakeServer::FakeServer(FakeServerOptions opt, int port) : opt_(std::move(opt)) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(listen_fd_, 4096) != 0)
    throw std::runtime_error(std::string("fake server: cannot listen: ") + std::strerror(errno));
  socklen_t len = sizeof a;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  for (int fd : {listen_fd_, timer_fd_, wake_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = static_cast<uint64_t>(fd) | (1ULL << 63);  // high bit: not a connection
    epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
  }
  thread_ = std::thread([this] { loop(); });
}

FakeServer::~FakeServer() {
  stop_ = true;
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
  thread_.join();
  for (int fd : {listen_fd_, epfd_, timer_fd_, wake_fd_}) close(fd);
}

void FakeServer::loop() {
  std::unordered_map<uint64_t, Conn> conns;
  std::priority_queue<Due, std::vector<Due>, std::greater<>> due;
  uint64_t next_id = 1;
  int64_t open_streams = 0;
  auto flush = [&](uint64_t id, Conn& c) {
    while (!c.out.empty()) {
      const ssize_t n = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n <= 0) break;
      c.out.erase(0, static_cast<size_t>(n));
    }
    epoll_event ev{};
    ev.events = EPOLLIN | (c.out.empty() ? 0u : EPOLLOUT);
    ev.data.u64 = id;
    epoll_ctl(epfd_, EPOLL_CTL_MOD, c.fd, &ev);
  };
  auto drop = [&](uint64_t id) {
    auto it = conns.find(id);
    if (it == conns.end()) return;
    if (it->second.streaming) --open_streams;
    close(it->second.fd);
    conns.erase(it);
  };
  auto end_stream = [&](Conn& c) {
    c.streaming = false;
    --open_streams;
  };
  auto arm = [&] {
    itimerspec ts{};
    if (!due.empty()) {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(due.top().t.time_since_epoch()).count();
      ts.it_value.tv_sec = ns / 1000000000;
      ts.it_value.tv_nsec = std::max<long>(1, ns % 1000000000);
    }
    timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &ts, nullptr);
  };
  // Token events are formatted directly (no JSON object per token): the server must stay far
  // cheaper than the client it measures.
  auto token = [&](Conn& c) -> std::string {
    const bool last = c.sent + 1 >= c.max_tokens;
    const char* finish = last ? "\"length\"" : "null";
    std::string s;
    if (c.chat && c.sent == 0)  // the role-only opening delta, as vLLM sends it with the first token
      s += chunk(fmt::format(R"(data: {{"id":{},"object":"chat.completion.chunk","model":"{}","choices":)"
                             R"([{{"index":0,"delta":{{"role":"assistant","content":""}},"finish_reason":null}}]}})"
                             "\n\n",
                             c.seq, opt_.model));
    if (c.chat)
      s += chunk(fmt::format(R"(data: {{"id":{},"object":"chat.completion.chunk","model":"{}","choices":)"
                             R"([{{"index":0,"delta":{{"content":" tok"}},"finish_reason":{}}}]}})"
                             "\n\n",
                             c.seq, opt_.model, finish));
    else
      s += chunk(fmt::format(R"(data: {{"id":{},"object":"text_completion","model":"{}","choices":)"
                             R"([{{"index":0,"text":" tok","logprobs":null,"finish_reason":{}}}]}})"
                             "\n\n",
                             c.seq, opt_.model, finish));
    return s;
  };
  auto handle_request = [&](uint64_t id, Conn& c, const std::string& method, const std::string& path,
                            const std::string& body) {
    if (method == "GET" && path == "/v1/models") {
      c.out += http_json(
          200, "OK", nlohmann::json{{"object", "list"}, {"data", {{{"id", opt_.model}, {"object", "model"}}}}}.dump());
      return;
    }
    if (method != "POST" || (path != "/v1/completions" && path != "/v1/chat/completions")) {
      c.out += http_json(404, "Not Found", R"({"error":{"message":"no such route"}})");
      return;
    }
    const int64_t seq = ++requests_;
    nlohmann::json req = nlohmann::json::parse(body, nullptr, false);
    if (req.is_discarded() || !req.value("stream", false)) {
      c.out += http_json(400, "Bad Request", R"({"error":{"message":"the fake server only streams"}})");
      return;
    }
    if (opt_.fail_every > 0 && seq % opt_.fail_every == 0) {
      c.out += http_json(500, "Internal Server Error", R"({"error":{"message":"injected failure"}})");
      return;
    }
    c.seq = seq;
    c.chat = path == "/v1/chat/completions";
    c.max_tokens = std::max<int64_t>(1, req.value("max_tokens", int64_t{16}));
    c.usage = opt_.usage && req.contains("stream_options") && req["stream_options"].value("include_usage", false);
    size_t prompt_bytes = 0;
    if (c.chat) {
      for (const auto& m : req.value("messages", nlohmann::json::array()))
        prompt_bytes += m.value("content", std::string()).size();
    } else {
      prompt_bytes = req.value("prompt", std::string()).size();
    }
    c.prompt_tokens = approx_tokens(prompt_bytes);
    c.mode = opt_.hang_every > 0 && seq % opt_.hang_every == 0                 ? Mode::kHang
             : opt_.drop_every > 0 && seq % opt_.drop_every == 0               ? Mode::kDrop
             : opt_.error_event_every > 0 && seq % opt_.error_event_every == 0 ? Mode::kErrorEvent
                                                                               : Mode::kNormal;
    c.sent = 0;
    c.streaming = true;
    max_open_ = std::max<int64_t>(max_open_, ++open_streams);
    c.start = Clock::now();
    c.out +=
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        "Transfer-Encoding: chunked\r\n\r\n";
    if (c.mode != Mode::kHang)
      due.push({c.start + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double, std::milli>(opt_.ttft_ms)),
                id});
  };
  auto on_readable = [&](uint64_t id) {
    Conn& c = conns[id];
    char buf[65536];
    while (true) {
      const ssize_t n = recv(c.fd, buf, sizeof buf, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return drop(id);
      if (n < 0) break;
      c.in.append(buf, static_cast<size_t>(n));
    }
    // Requests on a keep-alive connection are served one at a time, as HTTP/1.1 clients send them.
    while (!c.streaming) {
      const size_t head_end = c.in.find("\r\n\r\n");
      if (head_end == std::string::npos) break;
      const std::string head = c.in.substr(0, head_end);
      size_t content_length = 0;
      std::string lower = head;
      for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (auto p = lower.find("\r\ncontent-length:"); p != std::string::npos)
        content_length = std::stoul(lower.substr(p + 17));
      c.close_after = lower.find("\r\nconnection: close") != std::string::npos;
      if (c.in.size() < head_end + 4 + content_length) break;
      const std::string body = c.in.substr(head_end + 4, content_length);
      c.in.erase(0, head_end + 4 + content_length);
      const size_t sp1 = head.find(' '), sp2 = head.find(' ', sp1 + 1);
      handle_request(id, c, head.substr(0, sp1), head.substr(sp1 + 1, sp2 - sp1 - 1), body);
    }
    flush(id, c);
  };
  auto on_due = [&](uint64_t id) {
    auto it = conns.find(id);
    if (it == conns.end() || !it->second.streaming) return;
    Conn& c = it->second;
    const bool cut_here = c.sent == 2 && c.max_tokens > 2;
    if (cut_here && c.mode == Mode::kDrop) return drop(id);
    if (cut_here && c.mode == Mode::kErrorEvent) {
      c.out += event({{"error", {{"message", "injected error event"}, {"code", 500}}}});
      c.out += chunk("data: [DONE]\n\n") + "0\r\n\r\n";
      end_stream(c);
      flush(id, c);
      return;
    }
    c.out += token(c);
    ++c.sent;
    ++tokens_;
    if (c.sent < c.max_tokens) {
      // Absolute schedule: token k is due at start + ttft + k * itl, however late this one ran.
      const double at_ms = opt_.ttft_ms + static_cast<double>(c.sent) * opt_.itl_ms;
      due.push({c.start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(at_ms)),
                id});
    } else {
      if (c.usage)
        c.out += event({{"id", c.seq},
                        {"object", c.chat ? "chat.completion.chunk" : "text_completion"},
                        {"model", opt_.model},
                        {"choices", nlohmann::json::array()},
                        {"usage",
                         {{"prompt_tokens", c.prompt_tokens},
                          {"completion_tokens", c.sent},
                          {"total_tokens", c.prompt_tokens + c.sent}}}});
      c.out += chunk("data: [DONE]\n\n") + "0\r\n\r\n";
      end_stream(c);
    }
    flush(id, c);
    if (!c.streaming && c.close_after && c.out.empty()) drop(id);
  };

  epoll_event evs[512];
  while (!stop_) {
    const int n = epoll_wait(epfd_, evs, 512, 200);
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = evs[i].data.u64;
      if (tag & (1ULL << 63)) {
        const int fd = static_cast<int>(tag & 0xffffffff);
        if (fd == listen_fd_) {
          while (true) {
            const int cfd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (cfd < 0) break;
            int one = 1;
            setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            const uint64_t id = next_id++;
            conns[id].fd = cfd;
            epoll_event ev{};
            ev.events = EPOLLIN;
            ev.data.u64 = id;
            epoll_ctl(epfd_, EPOLL_CTL_ADD, cfd, &ev);
          }
        } else if (fd == timer_fd_) {
          uint64_t expirations;
          (void)!read(timer_fd_, &expirations, sizeof expirations);
        }
        continue;
      }
      if (!conns.count(tag)) continue;
      if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_readable(tag);
      if (conns.count(tag) && (evs[i].events & EPOLLOUT)) flush(tag, conns[tag]);
    }
    const auto now = Clock::now();
    while (!due.empty() && due.top().t <= now) {
      const uint64_t id = due.top().id;
      due.pop();
      on_due(id);
    }
    arm();
  }
  for (auto& [id, c] : conns) close(c.fd);
}

}  // namespace kiln::bench::test
