// Shared test helpers: run the kiln binary, read fixtures, write small safetensors files.
#pragma once

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace kiln::test {

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

// Runs a shell command line and captures its output (stdout and stderr of the whole line).
inline RunResult run_shell(const std::string& command) {
  RunResult r;
  const std::string cmd = "{ " + command + "\n} 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// Runs `kiln <args>` through the shell and captures its output.
inline RunResult run_kiln(const std::string& args) {
  return run_shell(std::string(KILN_BINARY) + " --log-level warn " + args);
}

// A loopback socket bound to `port` (0: any free one); -1 when that port is taken. Sets `port`
// to the one bound.
inline int bind_loopback(int& port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

// A loopback TCP port that was free a moment ago (for servers started by tests).
inline int free_port() {
  int port = 0;
  const int fd = bind_loopback(port);
  if (fd >= 0) close(fd);
  return port;
}

// A free port whose next one is free too: a multi-process run with several ranks per process
// forms its second group on the rendezvous port + 1.
inline int free_port_pair() {
  for (int attempt = 0; attempt < 100; ++attempt) {
    int port = 0;
    const int fd = bind_loopback(port);
    int next = port + 1;
    const int next_fd = port < 65535 ? bind_loopback(next) : -1;
    if (next_fd >= 0) close(next_fd);
    if (fd >= 0) close(fd);
    if (fd >= 0 && next_fd >= 0) return port;
  }
  return free_port();
}

// The checkout this test was built from (KILN_TEST_DATA is its tests/data).
inline std::filesystem::path repo_root() {
  return std::filesystem::path(KILN_TEST_DATA).parent_path().parent_path();
}

inline std::string data_path(const std::string& rel) {
  return std::string(KILN_TEST_DATA) + "/" + rel;
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

inline std::string join_ids(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s.push_back(',');
    s.append(std::to_string(ids[i]));
  }
  return s;
}

// A tensor to write: dtype name as safetensors spells it, shape, raw bytes.
struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

inline void write_safetensors(const std::string& path, const std::map<std::string, RawTensor>& tensors) {
  nlohmann::json h = nlohmann::json::object();
  size_t off = 0;
  std::string data;
  for (const auto& [name, t] : tensors) {
    h[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
    data += t.bytes;
  }
  std::string hs = h.dump();
  uint64_t n = hs.size();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(hs.data(), static_cast<std::streamsize>(hs.size()));
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// The fixture model directories under tests/data/fixtures.
inline std::vector<std::string> fixture_dirs() {
  std::vector<std::string> out;
  for (auto& e : std::filesystem::directory_iterator(data_path("fixtures")))
    if (std::filesystem::exists(e.path() / "expected.json")) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kiln::test
