#include "dist/socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace kiln::dist {
namespace {

// Milliseconds left until `deadline`, for poll(): -1 waits for ever.
int poll_ms(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1000 * 1000));
}

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) freeaddrinfo(list);
  }
};

std::string address(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

// Resolves host:port for a TCP socket; `passive` for listening.
void resolve(const std::string& host, int port, bool passive, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  const std::string service = std::to_string(port);
  const bool any = host.empty() || host == "0.0.0.0";
  const int rc = getaddrinfo(any ? nullptr : host.c_str(), service.c_str(), &hints, &out.list);
  KILN_CHECK(rc == 0, "cannot resolve {}: {}", address(host, port), gai_strerror(rc));
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Clock::time_point deadline_after(double seconds) {
  const Clock::time_point now = Clock::now();
  // 0 (or less): none; so is a wait past what the clock can count (inf, 1e300), which converted
  // to its integer ticks would overflow (undefined, in practice a deadline already past).
  const double left = std::chrono::duration<double>(Clock::time_point::max() - now).count();
  if (seconds <= 0 || !(seconds < left / 2)) return Clock::time_point::max();
  return now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

Fd listen_tcp(const std::string& host, int port) {
  AddrInfo ai;
  resolve(host, port, true, ai);
  std::string last = "no address";
  for (addrinfo* a = ai.list; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) continue;
    const int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd.get(), 128) == 0) return fd;
    last = std::strerror(errno);
  }
  fail("cannot listen on {} for the rendezvous: {}", address(host, port), last);
}

Fd accept_until(const Fd& listener, Clock::time_point deadline) {
  while (true) {
    pollfd p{listener.get(), POLLIN, 0};
    const int rc = ::poll(&p, 1, poll_ms(deadline));
    if (rc < 0 && errno == EINTR) continue;
    KILN_CHECK(rc >= 0, "rendezvous: poll on the listening socket failed: {}", std::strerror(errno));
    if (rc == 0) return Fd();
    Fd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.valid()) return fd;
    if (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN)
      fail("rendezvous: accept failed: {}", std::strerror(errno));
  }
}

Fd connect_until(const std::string& host, int port, Clock::time_point deadline) {
  std::string last = "no attempt";
  while (true) {
    AddrInfo ai;
    resolve(host, port, false, ai);
    for (addrinfo* a = ai.list; a; a = a->ai_next) {
      Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (!fd.valid()) continue;
      if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) return fd;
      last = std::strerror(errno);
    }
    // Rank 0 may not be listening yet: launchers start ranks in any order.
    if (Clock::now() + std::chrono::milliseconds(100) >= deadline)
      fail("could not reach rank 0 at {} before the rendezvous timeout ({})", address(host, port), last);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void tune_peer_socket(const Fd& fd, int seconds) {
  const int one = 1;
  setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const int idle = std::max(1, seconds / 2), interval = 1, probes = std::max(1, seconds - idle);
  setsockopt(fd.get(), SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd.get(), IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd.get(), IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  setsockopt(fd.get(), IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
}

void send_all(const Fd& fd, const void* data, size_t bytes, const std::string& peer) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    // MSG_NOSIGNAL: a peer that died must become an error here, not a SIGPIPE that kills us.
    const ssize_t n = ::send(fd.get(), p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    KILN_CHECK(n > 0, "lost the connection to {} while sending ({}): it exited or was killed", peer,
               std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

ReadStatus read_all(const Fd& fd, void* data, size_t bytes, Clock::time_point deadline, int wake_fd,
                    const std::string& peer) {
  auto* p = static_cast<uint8_t*>(data);
  while (bytes > 0) {
    pollfd fds[2] = {{fd.get(), POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const int rc = ::poll(fds, wake_fd >= 0 ? 2 : 1, poll_ms(deadline));
    if (rc < 0 && errno == EINTR) continue;
    KILN_CHECK(rc >= 0, "poll on the connection to {} failed: {}", peer, std::strerror(errno));
    if (rc == 0) return ReadStatus::TimedOut;
    if (wake_fd >= 0 && (fds[1].revents & POLLIN)) return ReadStatus::Woken;
    const ssize_t n = ::recv(fd.get(), p, bytes, 0);
    if (n == 0) return ReadStatus::Closed;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == ECONNRESET || errno == ETIMEDOUT || errno == EPIPE) return ReadStatus::Closed;
      fail("reading from {} failed: {}", peer, std::strerror(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return ReadStatus::Done;
}

}  // namespace kiln::dist
