#include "dist/tcp_wire.h"

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "dist/rank_order_sum.h"

namespace kiln::dist {
namespace {

constexpr uint32_t kMagic = 0x4b494c4e;                 // "KILN"
constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 34;  // 16 GiB: anything larger is not our peer

struct Header {
  uint32_t magic;
  uint32_t op;
  uint64_t seq;
  uint64_t bytes;
};

// Appends and reads fixed-size values in host byte order (every rank runs the same binary on the
// same architecture).
template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof v);
  std::memcpy(out.data() + at, &v, sizeof v);
}

struct Reader {
  const std::vector<uint8_t>& in;
  size_t at = 0;
  template <typename T>
  T get() {
    KILN_CHECK(at + sizeof(T) <= in.size(), "tcp communicator: a peer sent a truncated call");
    T v;
    std::memcpy(&v, in.data() + at, sizeof v);
    at += sizeof v;
    return v;
  }
};

std::string describe(const Call& c) {
  return fmt::format("{}({} x {}, root {})", wire_op_name(c.op), c.count, dtype_name(c.dtype), c.root);
}

// Bytes each rank contributes to a call that all ranks agree on.
size_t expected_send_bytes(const Call& c, int rank, int world) {
  const size_t elem = dtype_size(c.dtype);
  switch (c.op) {
    case WireOp::AllReduce:
    case WireOp::AllGather: return c.count * elem;
    case WireOp::ReduceScatter: return c.count * world * elem;
    case WireOp::Broadcast: return rank == c.root ? c.count * elem : 0;
    case WireOp::AllToAll: {
      size_t n = 0;
      for (size_t x : c.send_counts) n += x;
      return n * elem;
    }
    default: return 0;
  }
}

}  // namespace

const char* wire_op_name(WireOp op) {
  switch (op) {
    case WireOp::Hello: return "hello";
    case WireOp::Welcome: return "welcome";
    case WireOp::Refuse: return "refuse";
    case WireOp::AllReduce: return "all_reduce";
    case WireOp::AllGather: return "all_gather";
    case WireOp::ReduceScatter: return "reduce_scatter";
    case WireOp::AllToAll: return "all_to_all";
    case WireOp::Broadcast: return "broadcast";
    case WireOp::Barrier: return "barrier";
    case WireOp::Result: return "result";
    case WireOp::Fault: return "fault";
    case WireOp::Abort: return "abort";
  }
  return "unknown";
}

void send_frame(const Fd& fd, WireOp op, uint64_t seq, const std::vector<uint8_t>& payload, const std::string& peer) {
  const Header h{kMagic, static_cast<uint32_t>(op), seq, payload.size()};
  send_all(fd, &h, sizeof h, peer);
  if (!payload.empty()) send_all(fd, payload.data(), payload.size(), peer);
}

ReadStatus read_wire_frame(const Fd& fd, Frame& out, Clock::time_point deadline, int wake_fd, const std::string& peer) {
  Header h{};
  ReadStatus s = read_all(fd, &h, sizeof h, deadline, wake_fd, peer);
  if (s != ReadStatus::Done) return s;
  KILN_CHECK(h.magic == kMagic, "{} sent something that is not a kiln frame (is another program on that port?)", peer);
  KILN_CHECK(h.bytes <= kMaxFrameBytes, "{} announced a frame of {} bytes", peer, h.bytes);
  out.op = static_cast<WireOp>(h.op);
  out.seq = h.seq;
  out.payload.resize(h.bytes);
  // The header has come, so the rest is on its way: a closed socket now is still a death.
  return h.bytes == 0 ? ReadStatus::Done : read_all(fd, out.payload.data(), h.bytes, deadline, wake_fd, peer);
}

ReadStatus poll_any(std::vector<pollfd>& fds, Clock::time_point deadline) {
  while (true) {
    for (auto& p : fds) p.revents = 0;
    int ms = -1;
    if (deadline != Clock::time_point::max()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      ms = left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1000 * 1000));
    }
    const int rc = ::poll(fds.data(), fds.size(), ms);
    if (rc < 0 && errno == EINTR) continue;
    KILN_CHECK(rc >= 0, "tcp communicator: poll failed: {}", std::strerror(errno));
    if (rc == 0) return ReadStatus::TimedOut;
    if (fds.back().revents != 0) return ReadStatus::Woken;
    return ReadStatus::Done;
  }
}

std::vector<uint8_t> encode_call(const Call& c, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  out.reserve(64 + c.fault.size() + 16 * c.send_counts.size() + data.size());
  put<uint32_t>(out, static_cast<uint32_t>(c.dtype));
  put<uint64_t>(out, c.count);
  put<int32_t>(out, c.root);
  put<uint32_t>(out, static_cast<uint32_t>(c.fault.size()));
  out.insert(out.end(), c.fault.begin(), c.fault.end());
  put<uint32_t>(out, static_cast<uint32_t>(c.send_counts.size()));
  for (size_t n : c.send_counts) put<uint64_t>(out, n);
  for (size_t n : c.recv_counts) put<uint64_t>(out, n);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

Call decode_call(WireOp op, const std::vector<uint8_t>& payload, int world_size, std::vector<uint8_t>& data) {
  KILN_CHECK(op >= WireOp::AllReduce && op <= WireOp::Barrier, "tcp communicator: a peer sent frame type {}",
             static_cast<uint32_t>(op));
  Reader r{payload};
  Call c;
  c.op = op;
  const auto dtype = r.get<uint32_t>();
  KILN_CHECK(dtype <= static_cast<uint32_t>(DType::U8), "tcp communicator: a peer sent dtype {}", dtype);
  c.dtype = static_cast<DType>(dtype);
  c.count = r.get<uint64_t>();
  c.root = r.get<int32_t>();
  const auto fault_len = r.get<uint32_t>();
  KILN_CHECK(r.at + fault_len <= payload.size(), "tcp communicator: a peer sent a truncated call");
  c.fault.assign(payload.begin() + r.at, payload.begin() + r.at + fault_len);
  r.at += fault_len;
  const auto n = r.get<uint32_t>();
  KILN_CHECK(n == 0 || n == static_cast<uint32_t>(world_size), "tcp communicator: a peer sent {} counts", n);
  for (uint32_t i = 0; i < n; ++i) c.send_counts.push_back(r.get<uint64_t>());
  for (uint32_t i = 0; i < n; ++i) c.recv_counts.push_back(r.get<uint64_t>());
  data.assign(payload.begin() + r.at, payload.end());
  return c;
}

Outcome compute_collective(const std::vector<Call>& calls, const std::vector<std::vector<uint8_t>>& data) {
  const int world = static_cast<int>(calls.size());
  const Call& first = calls[0];
  const char* op = wire_op_name(first.op);
  Outcome out;
  // The same verdict, in the same words, as the thread communicator gives.
  for (int r = 0; r < world && out.fault.empty(); ++r) {
    const Call& c = calls[r];
    if (!c.fault.empty())
      out.fault = fmt::format("{}: rank {} of {}: {}", op, r, world, c.fault);
    else if (c.op != first.op || c.count != first.count || c.dtype != first.dtype || c.root != first.root)
      out.fault = fmt::format("{}: rank {} of {}: it called {} while rank 0 called {}", op, r, world, describe(c),
                              describe(first));
  }
  if (out.fault.empty() && first.op == WireOp::AllToAll)
    for (int i = 0; i < world && out.fault.empty(); ++i)
      for (int j = 0; j < world; ++j)
        if (calls[i].recv_counts[j] != calls[j].send_counts[i]) {
          out.fault = fmt::format("all_to_all: rank {} expects {} elements from rank {}, which sends it {}", i,
                                  calls[i].recv_counts[j], j, calls[j].send_counts[i]);
          break;
        }
  for (int r = 0; r < world && out.fault.empty(); ++r)
    if (data[r].size() != expected_send_bytes(calls[r], r, world))
      out.fault = fmt::format("{}: rank {} sent {} bytes where {} were expected", op, r, data[r].size(),
                              expected_send_bytes(calls[r], r, world));
  if (!out.fault.empty()) return out;

  const size_t elem = dtype_size(first.dtype), n = first.count;
  out.per_rank.resize(world);
  std::vector<const void*> sources(world);
  switch (first.op) {
    case WireOp::AllReduce:
      for (int r = 0; r < world; ++r) sources[r] = data[r].data();
      out.per_rank[0].resize(n * elem);
      if (n > 0) sum_in_rank_order(sources, n, first.dtype, out.per_rank[0].data());
      for (int r = 1; r < world; ++r) out.per_rank[r] = out.per_rank[0];
      break;
    case WireOp::AllGather:
      for (int r = 0; r < world; ++r) out.per_rank[0].insert(out.per_rank[0].end(), data[r].begin(), data[r].end());
      for (int r = 1; r < world; ++r) out.per_rank[r] = out.per_rank[0];
      break;
    case WireOp::ReduceScatter:
      for (int dst = 0; dst < world; ++dst) {
        for (int r = 0; r < world; ++r) sources[r] = data[r].data() + dst * n * elem;
        out.per_rank[dst].resize(n * elem);
        if (n > 0) sum_in_rank_order(sources, n, first.dtype, out.per_rank[dst].data());
      }
      break;
    case WireOp::AllToAll:
      for (int src = 0; src < world; ++src) {
        size_t offset = 0;
        for (int dst = 0; dst < world; ++dst) {
          const size_t bytes = calls[src].send_counts[dst] * elem;
          const auto begin = data[src].begin() + static_cast<ptrdiff_t>(offset);
          out.per_rank[dst].insert(out.per_rank[dst].end(), begin, begin + static_cast<ptrdiff_t>(bytes));
          offset += bytes;
        }
      }
      break;
    case WireOp::Broadcast:
      for (int r = 0; r < world; ++r)
        if (r != first.root) out.per_rank[r] = data[first.root];
      break;
    default: break;  // barrier: nothing to return
  }
  return out;
}

}  // namespace kiln::dist
