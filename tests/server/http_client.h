// A bare loopback HTTP client for the front end's tests: raw bytes out, raw bytes in, every read
// bounded by a deadline, so that what the server does with malformed or hostile input is seen
// exactly as a client sees it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

namespace kiln::server::test {

class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~RawClient() {
    if (fd_ >= 0) close(fd_);
  }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return connected_; }
  // Sends all of `s`; false once the server closed or reset the connection.
  bool send_all(const std::string& s) {
    size_t sent = 0;
    while (sent < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + sent, s.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }
  void shut_write() { shutdown(fd_, SHUT_WR); }
  // Reads until the server closes, `until` appears, or the deadline passes; returns what came.
  std::string read(double deadline_s, const std::string& until = "") {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
    while (std::chrono::steady_clock::now() < end) {
      if (!until.empty() && got_.find(until) != std::string::npos) break;
      pollfd p{fd_, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (poll(&p, 1, static_cast<int>(std::max<long>(left.count(), 1))) <= 0) continue;
      char buf[16384];
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      got_.append(buf, static_cast<size_t>(n));
    }
    return got_;
  }
  // Whether the server closed the connection (read() saw the end or a reset).
  bool closed() const { return closed_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_ = false;
  std::string got_;
};

// How many times `needle` occurs in `hay`.
inline size_t count_of(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace kiln::server::test
