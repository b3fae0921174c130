#include "dist/launch.h"

#include <unistd.h>

#include <charconv>

#include "core/error.h"

extern char** environ;

namespace kiln::dist {
namespace {

const std::string* find(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

// A whole non-negative decimal number, or an error naming where it came from.
int parse_count(const std::string& text, const std::string& source) {
  int v = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  KILN_CHECK(ec == std::errc() && end == text.data() + text.size() && v >= 0, "{}='{}' is not a whole number", source,
             text);
  return v;
}

struct LauncherEnv {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
};

// In the order they are looked for: an mpirun or srun job may also carry torchrun-style variables
// a user exported, but not the other way round.
constexpr LauncherEnv kLaunchers[] = {
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
};

}  // namespace

InitAddress parse_init_address(const std::string& text) {
  InitAddress a;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    KILN_CHECK(close != std::string::npos && close + 1 < text.size() && text[close + 1] == ':',
               "--dist-init-addr '{}': an IPv6 address is written [addr]:port", text);
    a.host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    KILN_CHECK(colon != std::string::npos, "--dist-init-addr '{}': expected host:port", text);
    a.host = text.substr(0, colon);
    port = text.substr(colon + 1);
    KILN_CHECK(a.host.find(':') == std::string::npos, "--dist-init-addr '{}': write an IPv6 address as [addr]:port",
               text);
  }
  KILN_CHECK(!a.host.empty(), "--dist-init-addr '{}': no host", text);
  int p = -1;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  KILN_CHECK(ec == std::errc() && end == port.data() + port.size() && p >= 1 && p <= 65535,
             "--dist-init-addr '{}': port '{}' is not a number in 1..65535", text, port);
  a.port = p;
  return a;
}

Environment process_environment() {
  Environment env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

LaunchInfo resolve_launch(const LaunchFlags& flags, const Environment& env) {
  LaunchInfo info;
  for (const LauncherEnv& l : kLaunchers) {
    const std::string *rank = find(env, l.rank), *size = find(env, l.size);
    if (!rank || !size) continue;
    info.launcher = l.name;
    info.node_rank = parse_count(*rank, l.rank);
    info.nnodes = parse_count(*size, l.size);
    if (const std::string* local = find(env, l.local_rank)) info.local_rank = parse_count(*local, l.local_rank);
    break;
  }
  const bool from_launcher = info.launcher != "single";
  KILN_CHECK(flags.nnodes >= 0, "--nnodes {}: needs at least 1", flags.nnodes);
  if (flags.nnodes > 0) {
    KILN_CHECK(!from_launcher || flags.nnodes == info.nnodes, "--nnodes {} but {} started {} processes", flags.nnodes,
               info.launcher, info.nnodes);
    info.nnodes = flags.nnodes;
  }
  if (flags.node_rank >= 0) {
    KILN_CHECK(!from_launcher || flags.node_rank == info.node_rank, "--node-rank {} but {} gave this process rank {}",
               flags.node_rank, info.launcher, info.node_rank);
    KILN_CHECK(from_launcher || flags.nnodes > 0, "--node-rank {} needs --nnodes", flags.node_rank);
    info.node_rank = flags.node_rank;
  }
  if (!from_launcher && flags.nnodes > 1) {
    KILN_CHECK(flags.node_rank >= 0, "--nnodes {} needs --node-rank (this process's rank, 0..{})", flags.nnodes,
               flags.nnodes - 1);
    info.launcher = "flags";
  }
  KILN_CHECK(info.nnodes >= 1, "{}: a run of {} processes", info.launcher, info.nnodes);
  KILN_CHECK(info.node_rank < info.nnodes, "{}: rank {} is outside 0..{}",
             info.launcher == "flags" ? "--node-rank" : info.launcher, info.node_rank, info.nnodes - 1);

  if (!flags.init_addr.empty()) {
    info.init_addr = parse_init_address(flags.init_addr);
  } else if (const std::string* host = find(env, "MASTER_ADDR")) {
    const std::string* port = find(env, "MASTER_PORT");
    KILN_CHECK(port, "MASTER_ADDR is set but MASTER_PORT is not");
    const bool v6 = host->find(':') != std::string::npos;
    info.init_addr = parse_init_address((v6 ? "[" + *host + "]" : *host) + ":" + *port);
  }
  KILN_CHECK(info.nnodes == 1 || info.init_addr,
             "a run of {} processes needs rank 0's address: --dist-init-addr host:port (or MASTER_ADDR and "
             "MASTER_PORT)",
             info.nnodes);
  return info;
}

TcpOptions tcp_options(const LaunchInfo& info, double rendezvous_timeout_s) {
  TcpOptions o;
  o.rank = info.node_rank;
  o.world_size = info.nnodes;
  if (info.init_addr) {
    o.host = info.init_addr->host;
    o.port = info.init_addr->port;
  }
  o.rendezvous_timeout_s = rendezvous_timeout_s;
  return o;
}

std::string describe(const LaunchInfo& info) {
  if (info.nnodes == 1 && info.launcher == "single") return "one process";
  std::string s =
      fmt::format("process {} of {} ({}, local rank {})", info.node_rank, info.nnodes, info.launcher, info.local_rank);
  if (info.init_addr) {
    const bool v6 = info.init_addr->host.find(':') != std::string::npos;
    s += fmt::format(", rendezvous at {}{}{}:{}", v6 ? "[" : "", info.init_addr->host, v6 ? "]" : "",
                     info.init_addr->port);
  }
  return s;
}

}  // namespace kiln::dist
