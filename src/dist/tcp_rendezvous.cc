// The rendezvous that forms a TCP group (see tcp_communicator.h): rank 0 listens and waits for
// every other rank's hello, then welcomes them all at once; a rank that never comes, or comes
// with another idea of the group, ends the rendezvous on every rank with a message naming it.
#include <set>

#include "core/error.h"
#include "dist/tcp_wire.h"

namespace kiln::dist {
namespace {

constexpr uint32_t kProtocolVersion = 1;

std::string addr_text(const TcpOptions& o) {
  return o.host.find(':') != std::string::npos ? fmt::format("[{}]:{}", o.host, o.port)
                                               : fmt::format("{}:{}", o.host, o.port);
}

std::vector<uint8_t> text_bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

// Rank 0 gives up: every rank already connected hears why, then rank 0 throws the same.
[[noreturn]] void refuse_all(const std::vector<Fd>& peers, const std::string& why) {
  for (const Fd& fd : peers)
    if (fd.valid()) try {
        send_frame(fd, WireOp::Refuse, 0, text_bytes(why), "peer");
      } catch (const Error&) {
      }
  throw Error(why);
}

std::vector<Fd> rendezvous_root(const TcpOptions& o) {
  const auto deadline = deadline_after(o.rendezvous_timeout_s);
  // Rank 0 listens on every interface, as the name others reach it by may resolve differently on
  // its own machine (Debian maps the host name to 127.0.1.1); a loopback address stays loopback.
  const bool loopback = o.host == "localhost" || o.host.rfind("127.", 0) == 0 || o.host == "::1";
  Fd listener = listen_tcp(loopback ? o.host : "", o.port);
  std::vector<Fd> peers(o.world_size);
  int arrived = 1;
  while (arrived < o.world_size) {
    Fd fd = accept_until(listener, deadline);
    if (!fd.valid()) {
      std::vector<int> missing;
      for (int r = 1; r < o.world_size; ++r)
        if (!peers[r].valid()) missing.push_back(r);
      refuse_all(peers, fmt::format("rendezvous at {} timed out after {} s: {} of {} never arrived (rank {} missing)",
                                    addr_text(o), o.rendezvous_timeout_s, missing.size() == 1 ? "a rank" : "ranks",
                                    o.world_size, fmt::join(missing, ", rank ")));
    }
    tune_peer_socket(fd, o.keepalive_s);
    Frame hello;
    // A connection that never says hello (not a kiln rank) must not hold up the others for long.
    const auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(10));
    if (read_wire_frame(fd, hello, hello_deadline, -1, "a connecting rank") != ReadStatus::Done ||
        hello.op != WireOp::Hello || hello.payload.size() != 12)
      continue;
    uint32_t version;
    int32_t rank, world;
    std::memcpy(&version, hello.payload.data(), 4);
    std::memcpy(&rank, hello.payload.data() + 4, 4);
    std::memcpy(&world, hello.payload.data() + 8, 4);
    std::string fault;
    if (version != kProtocolVersion)
      fault = fmt::format("rank {} speaks rendezvous protocol {}, rank 0 speaks {} (different kiln builds?)", rank,
                          version, kProtocolVersion);
    else if (world != o.world_size)
      fault = fmt::format("rank {} was started for a group of {} ranks, rank 0 for {}", rank, world, o.world_size);
    else if (rank <= 0 || rank >= o.world_size)
      fault = fmt::format("a process claims rank {}, outside 1..{}", rank, o.world_size - 1);
    else if (peers[rank].valid())
      fault = fmt::format("two processes claim rank {} (check --node-rank or the launcher's ranks)", rank);
    if (!fault.empty()) {
      try {
        send_frame(fd, WireOp::Refuse, 0, text_bytes("rendezvous: " + fault), "peer");
      } catch (const Error&) {
      }
      refuse_all(peers, "rendezvous at " + addr_text(o) + ": " + fault);
    }
    peers[rank] = std::move(fd);
    ++arrived;
  }
  for (int r = 1; r < o.world_size; ++r) send_frame(peers[r], WireOp::Welcome, 0, {}, fmt::format("rank {}", r));
  return peers;
}

std::vector<Fd> rendezvous_peer(const TcpOptions& o) {
  const auto deadline = deadline_after(o.rendezvous_timeout_s);
  std::vector<Fd> peers(1);
  peers[0] = connect_until(o.host, o.port, deadline);
  tune_peer_socket(peers[0], o.keepalive_s);
  std::vector<uint8_t> hello(12);
  const uint32_t version = kProtocolVersion;
  const int32_t rank = o.rank, world = o.world_size;
  std::memcpy(hello.data(), &version, 4);
  std::memcpy(hello.data() + 4, &rank, 4);
  std::memcpy(hello.data() + 8, &world, 4);
  send_frame(peers[0], WireOp::Hello, 0, hello, "rank 0");
  Frame reply;
  // Rank 0 answers once the last rank has come, or when its own timeout passes: wait a little
  // longer than that, so its message (naming the missing rank) is the one that arrives.
  const auto wait_deadline = o.rendezvous_timeout_s > 0 ? deadline + std::chrono::seconds(5) : deadline;
  const ReadStatus s = read_wire_frame(peers[0], reply, wait_deadline, -1, "rank 0");
  KILN_CHECK(s != ReadStatus::TimedOut, "rendezvous at {}: rank 0 did not gather the group of {} within {} s",
             addr_text(o), o.world_size, o.rendezvous_timeout_s);
  KILN_CHECK(s != ReadStatus::Closed, "rendezvous at {}: rank 0 closed the connection before the group formed",
             addr_text(o));
  if (reply.op == WireOp::Refuse) fail("{}", std::string(reply.payload.begin(), reply.payload.end()));
  KILN_CHECK(reply.op == WireOp::Welcome, "rendezvous at {}: rank 0 answered with a {} frame", addr_text(o),
             wire_op_name(reply.op));
  return peers;
}

}  // namespace

std::vector<Fd> rendezvous(const TcpOptions& o) {
  KILN_CHECK(o.world_size >= 1, "tcp group: world size {} (needs at least 1)", o.world_size);
  KILN_CHECK(o.rank >= 0 && o.rank < o.world_size, "tcp group: rank {} is outside 0..{}", o.rank, o.world_size - 1);
  KILN_CHECK(o.port >= 1 && o.port <= 65535, "tcp group: port {} is outside 1..65535", o.port);
  KILN_CHECK(!o.host.empty(), "tcp group: no rendezvous host given");
  if (o.world_size == 1) return std::vector<Fd>(1);
  return o.rank == 0 ? rendezvous_root(o) : rendezvous_peer(o);
}

}  // namespace kiln::dist
