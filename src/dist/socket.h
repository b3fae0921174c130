// Blocking TCP sockets with deadlines, for the rendezvous and the TCP communicator: every wait is
// a poll() with a bound, so a peer that never answers becomes an error rather than a hang.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::dist {

using Clock = std::chrono::steady_clock;

// An owned file descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// Listens on host:port (host "" or "0.0.0.0" for every interface). Errors name the address.
Fd listen_tcp(const std::string& host, int port);

// Accepts one connection; returns an invalid Fd when `deadline` passes first.
Fd accept_until(const Fd& listener, Clock::time_point deadline);

// Connects to host:port, retrying while the listener is not up yet, until `deadline`; throws a
// kiln::Error naming the address and the last failure when it passes.
Fd connect_until(const std::string& host, int port, Clock::time_point deadline);

// Turns on TCP keepalive with short probes, so that a peer whose machine vanishes (no FIN ever
// comes) surfaces as a socket error within about `seconds`, and disables Nagle's delay.
void tune_peer_socket(const Fd& fd, int seconds);

// Writes all `bytes`; throws naming `peer` when the connection is gone.
void send_all(const Fd& fd, const void* data, size_t bytes, const std::string& peer);

// How a bounded read ended.
enum class ReadStatus { Done, Closed, TimedOut, Woken };

// Reads exactly `bytes`, waiting until `deadline` (Clock::time_point::max() for none). When
// `wake_fd` >= 0 becomes readable first, returns Woken. Throws on a socket error, naming `peer`.
ReadStatus read_all(const Fd& fd, void* data, size_t bytes, Clock::time_point deadline, int wake_fd,
                    const std::string& peer);

// A deadline `seconds` from now; 0 or less means none.
Clock::time_point deadline_after(double seconds);

}  // namespace kiln::dist
