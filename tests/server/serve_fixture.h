// Runs `kiln serve` on models/kiln-tiny as a child process on a free loopback port, and the node
// test scripts against it. The child is killed in the destructor, so a failing test never leaves a
// server behind; every wait has a deadline.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

extern char** environ;

namespace kiln::server::test {

namespace fs = std::filesystem;

using kiln::test::repo_root;
inline fs::path tiny_model() {
  return repo_root() / "models" / "kiln-tiny";
}
inline bool have_tiny_weights() {
  return fs::exists(tiny_model() / "model.safetensors.index.json");
}
inline bool have_node_openai() {
  return fs::exists("/usr/bin/node") && fs::exists(repo_root() / "tests" / "npm" / "node_modules" / "openai");
}

using ::kiln::test::free_port;

inline std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Sends `request` (whole, however many writes it takes) to loopback `port` and reads until the
// server closes or `timeout_s` passes without a byte: the whole response, or "".
inline std::string http_exchange(int port, const std::string& request, int timeout_s) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return {};
  timeval tv{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (port > 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    size_t sent = 0;
    while (sent < request.size()) {
      const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    char buf[4096];
    for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

// A bare HTTP/1.0 GET on loopback (no client library needed): the whole response, or "".
inline std::string http_get(int port, const std::string& path) {
  return http_exchange(port, "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", 2);
}

// A field of /proc/PID/status in its unit (kB for memory, a count for Threads); -1 if absent.
inline long proc_status(pid_t pid, const std::string& key) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(key + ":", 0) == 0) return std::stol(line.substr(key.size() + 1));
  return -1;
}

inline int http_status(int port, const std::string& path) {
  const std::string r = http_get(port, path);
  return r.size() > 12 && r.compare(0, 5, "HTTP/") == 0 ? std::atoi(r.c_str() + 9) : -1;
}

struct CmdResult {
  int code = -1;
  std::string out;
};

// Runs a shell command (the caller bounds it in time, e.g. with `timeout`), capturing its output.
inline CmdResult sh(const std::string& cmd) {
  CmdResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

class ServeProcess {
 public:
  explicit ServeProcess(const std::vector<std::string>& extra = {}) {
    port_ = free_port();
    log_ =
        fs::temp_directory_path() / ("kiln_serve_" + std::to_string(getpid()) + "_" + std::to_string(port_) + ".log");
    std::vector<std::string> args = {KILN_BINARY, "--log-level",         "warn",     "serve",
                                     "--model",   tiny_model().string(), "--host",   "127.0.0.1",
                                     "--port",    std::to_string(port_), "--device", "cpu"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~ServeProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    fs::remove(log_, ec);
  }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return pid_; }
  std::string log() const { return slurp(log_); }

  // Polls /health until it answers 200 (up to `timeout_s`).
  bool wait_ready(double timeout_s = 60) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      if (pid_ <= 0 || waitpid(pid_, nullptr, WNOHANG) == pid_) return false;
      if (http_status(port_, "/health") == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  // Exit code, or -1 when it was still running at the deadline (then killed).
  int stop(int sig, double timeout_s) {
    kill(pid_, sig);
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

  // Resident memory of the server, in KiB (from /proc).
  long rss_kib() const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
    for (std::string line; std::getline(f, line);)
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    return -1;
  }

  // Runs one suite of tests/server/e2e.mjs against this server.
  CmdResult node(const std::string& suite, const std::string& extra = "", int deadline_s = 150) const {
    const fs::path script = repo_root() / "tests" / "server" / "e2e.mjs";
    return sh("timeout " + std::to_string(deadline_s + 10) + " /usr/bin/node " + script.string() + " --base-url " +
              url() + " --suite " + suite + " --deadline-s " + std::to_string(deadline_s) + " " + extra);
  }

 private:
  int port_ = 0;
  pid_t pid_ = -1;
  bool exited_ = false;
  fs::path log_;
};

}  // namespace kiln::server::test
