#include "dist/tcp_communicator.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "dist/socket.h"
#include "dist/tcp_wire.h"

namespace kiln::dist {
namespace {

std::string rank_name(int r) {
  return fmt::format("rank {}", r);
}

class TcpCommunicator final : public Communicator {
 public:
  // `peers[r]` is rank r's connection on rank 0 (the others hold only peers[0]).
  TcpCommunicator(const TcpOptions& opts, std::vector<Fd> peers) : opts_(opts), peers_(std::move(peers)) {
    int fds[2];
    KILN_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "tcp communicator: cannot create its wake-up pipe");
    wake_read_ = Fd(fds[0]);
    wake_write_ = Fd(fds[1]);
  }

  int rank() const override { return opts_.rank; }
  int world_size() const override { return opts_.world_size; }
  std::string kind() const override { return "tcp"; }

  void all_reduce(const void* send, void* recv, size_t count, DType dtype) override {
    Call c = call(WireOp::AllReduce, count, dtype);
    if (dtype != DType::F32 && dtype != DType::BF16)
      c.fault = fmt::format("sums F32 or BF16, not {}", dtype_name(dtype));
    null_check(c, send, count, recv, count);
    run(c, send, count * dtype_size(dtype), recv, count * dtype_size(dtype));
  }

  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    Call c = call(WireOp::AllGather, count, dtype);
    null_check(c, send, count, recv, count * world_size());
    run(c, send, count * dtype_size(dtype), recv, count * world_size() * dtype_size(dtype));
  }

  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype) override {
    Call c = call(WireOp::ReduceScatter, count, dtype);
    if (dtype != DType::F32 && dtype != DType::BF16)
      c.fault = fmt::format("sums F32 or BF16, not {}", dtype_name(dtype));
    null_check(c, send, count * world_size(), recv, count);
    run(c, send, count * world_size() * dtype_size(dtype), recv, count * dtype_size(dtype));
  }

  void all_to_all(const void* send, std::span<const size_t> send_counts, void* recv,
                  std::span<const size_t> recv_counts, DType dtype) override {
    Call c = call(WireOp::AllToAll, 0, dtype);
    size_t sent = 0, received = 0;
    for (size_t n : send_counts) sent += n;
    for (size_t n : recv_counts) received += n;
    if (send_counts.size() != static_cast<size_t>(world_size()) ||
        recv_counts.size() != static_cast<size_t>(world_size()))
      c.fault = fmt::format("{} send counts and {} receive counts given for a group of {} ranks", send_counts.size(),
                            recv_counts.size(), world_size());
    else {
      c.send_counts.assign(send_counts.begin(), send_counts.end());
      c.recv_counts.assign(recv_counts.begin(), recv_counts.end());
    }
    null_check(c, send, sent, recv, received);
    run(c, send, sent * dtype_size(dtype), recv, received * dtype_size(dtype));
  }

  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    Call c = call(WireOp::Broadcast, count, dtype);
    c.root = root;
    if (root < 0 || root >= world_size())
      c.fault = fmt::format("root rank {} is outside the group of {} ranks", root, world_size());
    null_check(c, buf, count, buf, count);
    const size_t bytes = count * dtype_size(dtype);
    run(c, buf, rank() == root ? bytes : 0, buf, rank() == root ? 0 : bytes);
  }

  void barrier() override { run(call(WireOp::Barrier, 0, DType::U8), nullptr, 0, nullptr, 0); }

  // Copies of the live connections' descriptors (rank, fd) for watch_peers: a copy keeps the
  // socket valid however the group ends, and shutdown() below still sends the FIN it watches for.
  std::vector<std::pair<int, Fd>> dup_peers() {
    std::lock_guard lock(send_mu_);
    std::vector<std::pair<int, Fd>> out;
    for (size_t r = 0; r < peers_.size(); ++r)
      if (peers_[r].valid()) out.emplace_back(static_cast<int>(r), Fd(::fcntl(peers_[r].get(), F_DUPFD_CLOEXEC, 0)));
    return out;
  }

  void abort(const std::string& reason) override {
    std::lock_guard lock(send_mu_);
    if (aborted_) return;
    aborted_ = fmt::format("rank {} ended the group: {}", rank(), reason);
    // Tell the peers (best effort: some may be gone), then wake this rank's own blocked collective.
    for (size_t r = 0; r < peers_.size(); ++r)
      if (peers_[r].valid()) try_send(peers_[r], WireOp::Abort, seq_.load(), *aborted_);
    const char byte = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_write_.get(), &byte, 1);
  }

 private:
  Call call(WireOp op, size_t count, DType dtype) {
    Call c;
    c.op = op;
    c.count = count;
    c.dtype = dtype;
    return c;
  }

  static void null_check(Call& c, const void* send, size_t send_count, const void* recv, size_t recv_count) {
    if (!c.fault.empty()) return;
    if (send_count > 0 && send == nullptr) c.fault = "a null send buffer";
    if (recv_count > 0 && recv == nullptr) c.fault = "a null receive buffer";
  }

  // One collective: the other ranks send their call and data to rank 0 and wait for their share of
  // the result; rank 0 gathers, checks, computes and answers.
  void run(Call c, const void* send, size_t send_bytes, void* recv, size_t recv_bytes) {
    {
      std::lock_guard lock(send_mu_);
      if (aborted_) throw Error(*aborted_);
    }
    const uint64_t seq = ++seq_;
    const std::string what = fmt::format("{} #{}", wire_op_name(c.op), seq);
    if (!c.fault.empty()) send_bytes = 0;
    std::vector<uint8_t> data(send_bytes);
    if (send_bytes > 0) std::memcpy(data.data(), send, send_bytes);
    std::vector<uint8_t> result;
    if (rank() == 0) {
      result = serve(std::move(c), std::move(data), seq, what);
    } else {
      send_to(0, c.op, seq, encode_call(c, data), what);
      result = await_reply(seq, what);
    }
    KILN_CHECK(result.size() == recv_bytes, "{}: rank 0 returned {} bytes where {} were expected", what, result.size(),
               recv_bytes);
    if (recv_bytes > 0) std::memcpy(recv, result.data(), recv_bytes);
  }

  std::vector<uint8_t> await_reply(uint64_t seq, const std::string& what) {
    // Rank 0 waits op_timeout_s for the slowest peer and then names it: give it time to say so.
    const double wait = opts_.op_timeout_s > 0 ? opts_.op_timeout_s + 5 : 0;
    Frame f = read_frame(0, deadline_after(wait), what);
    if (f.op == WireOp::Abort) end_group(std::string(f.payload.begin(), f.payload.end()));
    if (f.op == WireOp::Fault) fail("{}", std::string(f.payload.begin(), f.payload.end()));
    KILN_CHECK(f.seq == seq, "{}: rank 0 answered collective #{} instead (ranks out of step)", what, f.seq);
    return std::move(f.payload);
  }

  // Rank 0: the frames of every other rank for this collective, read in whatever order they come,
  // so that a rank that dies is noticed while another is still on its way.
  std::vector<uint8_t> serve(Call mine, std::vector<uint8_t> my_data, uint64_t seq, const std::string& what) {
    const int world = world_size();
    std::vector<Call> calls(world);
    std::vector<std::vector<uint8_t>> data(world);
    calls[0] = std::move(mine);
    data[0] = std::move(my_data);
    std::vector<bool> have(world, false);
    have[0] = true;
    const auto deadline = deadline_after(opts_.op_timeout_s);
    for (int missing = world - 1; missing > 0;) {
      const int r = wait_readable(have, deadline, what);
      Frame f = read_frame(r, deadline, what);
      if (f.op == WireOp::Abort) end_group(std::string(f.payload.begin(), f.payload.end()));
      if (f.seq != seq) end_group(fmt::format("{}: rank {} sent collective #{} (ranks out of step)", what, r, f.seq));
      calls[r] = decode_call(f.op, f.payload, world, data[r]);
      have[r] = true;
      --missing;
    }
    Outcome out = compute_collective(calls, data);
    for (int r = 1; r < world; ++r) {
      if (!out.fault.empty())
        send_to(r, WireOp::Fault, seq, std::vector<uint8_t>(out.fault.begin(), out.fault.end()), what);
      else
        send_to(r, WireOp::Result, seq, out.per_rank[r], what);
    }
    if (!out.fault.empty()) throw Error(out.fault);
    return std::move(out.per_rank[0]);
  }

  // Rank 0: the first rank (other than itself) whose frame has arrived, waiting until `deadline`.
  int wait_readable(const std::vector<bool>& have, Clock::time_point deadline, const std::string& what) {
    std::vector<int> ranks;
    for (int r = 1; r < world_size(); ++r)
      if (!have[r]) ranks.push_back(r);
    std::vector<pollfd> fds;
    for (int r : ranks) fds.push_back({peers_[r].get(), POLLIN, 0});
    fds.push_back({wake_read_.get(), POLLIN, 0});
    while (true) {
      const ReadStatus s = poll_any(fds, deadline);
      if (s == ReadStatus::Woken) end_group(aborted_reason());
      if (s == ReadStatus::TimedOut)
        end_group(fmt::format("{}: rank {} did not reach it within {} s (hung or stopped)", what, ranks[0],
                              opts_.op_timeout_s));
      for (size_t i = 0; i < ranks.size(); ++i)
        if (fds[i].revents != 0) return ranks[i];
    }
  }

  // Sends one frame to rank r; a peer that is gone ends the group naming it.
  void send_to(int r, WireOp op, uint64_t seq, const std::vector<uint8_t>& payload, const std::string& what) {
    bool sent = false;
    {
      std::lock_guard lock(send_mu_);
      try {
        send_frame(peers_[r], op, seq, payload, rank_name(r));
        sent = true;
      } catch (const Error&) {  // reported below, once the lock is released
      }
    }
    if (sent) return;
    // Rank 0 may have said why before it went: its abort names the rank that really failed.
    Frame last;
    bool told = false;
    try {
      told = rank() != 0 && read_wire_frame(peers_[0], last, deadline_after(1.0), -1, "rank 0") == ReadStatus::Done &&
             last.op == WireOp::Abort;
    } catch (const Error&) {  // nothing readable: the plain message below stands
    }
    if (told) end_group(std::string(last.payload.begin(), last.payload.end()));
    const std::string why = fmt::format("{}: rank {} exited or was killed (its connection closed)", what, r);
    end_group(why);
  }

  Frame read_frame(int r, Clock::time_point deadline, const std::string& what) {
    Frame f;
    const ReadStatus s = read_wire_frame(peers_[r], f, deadline, wake_read_.get(), rank_name(r));
    if (s == ReadStatus::Done) return f;
    if (s == ReadStatus::Woken) end_group(aborted_reason());
    const std::string why = s == ReadStatus::Closed
                                ? fmt::format("{}: rank {} exited or was killed (its connection closed)", what, r)
                                : fmt::format("{}: rank {} did not answer within {} s", what, r, opts_.op_timeout_s);
    end_group(why);
  }

  std::string aborted_reason() {
    std::lock_guard lock(send_mu_);
    return aborted_.value_or("aborted");
  }

  // Ends the group on this rank with `why`. Rank 0 first tells every surviving rank, then closes its
  // side for writing and reads until they hang up: closing a socket with unread data in it would
  // reset the connection and could destroy the message before it is read. The other ranks close at
  // once (rank 0, or their own socket, tells their peers).
  [[noreturn]] void end_group(const std::string& why) {
    bool first = false;
    {
      std::lock_guard lock(send_mu_);
      if (!aborted_) {
        aborted_ = why;
        first = true;
      }
      if (rank() == 0)
        for (int r = 1; r < world_size(); ++r) {
          if (!peers_[r].valid()) continue;
          if (first) try_send(peers_[r], WireOp::Abort, seq_.load(), why);
          ::shutdown(peers_[r].get(), SHUT_WR);
        }
    }
    if (rank() == 0) drain_peers(deadline_after(2.0));
    {
      std::lock_guard lock(send_mu_);
      for (Fd& fd : peers_) fd = Fd();
    }
    throw Error(why);
  }

  // Rank 0: reads and drops whatever the peers still send until each hangs up or `deadline` passes.
  void drain_peers(Clock::time_point deadline) {
    std::vector<pollfd> fds;
    for (int r = 1; r < world_size(); ++r)
      if (peers_[r].valid()) fds.push_back({peers_[r].get(), POLLIN, 0});
    fds.push_back({-1, 0, 0});  // poll_any's wake-up slot, unused here
    while (fds.size() > 1) {
      if (poll_any(fds, deadline) == ReadStatus::TimedOut) return;
      for (size_t i = 0; i + 1 < fds.size();) {
        char junk[4096];
        if (fds[i].revents != 0 && ::recv(fds[i].fd, junk, sizeof junk, MSG_DONTWAIT) <= 0 && errno != EAGAIN) {
          fds.erase(fds.begin() + static_cast<ptrdiff_t>(i));
          continue;
        }
        ++i;
      }
    }
  }

  static void try_send(const Fd& fd, WireOp op, uint64_t seq, const std::string& text) {
    try {
      send_frame(fd, op, seq, std::vector<uint8_t>(text.begin(), text.end()), "peer");
    } catch (const Error&) {  // that peer is gone already; the others still need to hear
    }
  }

  const TcpOptions opts_;
  std::vector<Fd> peers_;
  Fd wake_read_, wake_write_;
  std::atomic<uint64_t> seq_{0};  // read by abort() from any thread
  std::mutex send_mu_;            // one frame at a time on a socket; guards aborted_
  std::optional<std::string> aborted_;
};

// watch_peers' thread: polls the peers' sockets for hang-up only (POLLRDHUP), so the data the
// collectives read stays in the socket, plus a pipe that ends the watch.
class PeerWatch {
 public:
  PeerWatch(std::vector<std::pair<int, Fd>> peers, std::function<void(int, const std::string&)> lost, double grace_s)
      : peers_(std::move(peers)), lost_(std::move(lost)), grace_s_(grace_s) {
    int fds[2];
    KILN_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "tcp communicator: cannot create the peer watch's pipe");
    stop_read_ = Fd(fds[0]);
    stop_write_ = Fd(fds[1]);
    thread_ = std::thread([this] { run(); });
  }
  ~PeerWatch() {
    const char byte = 1;
    [[maybe_unused]] const ssize_t n = ::write(stop_write_.get(), &byte, 1);
    thread_.join();
  }

 private:
  void run() {
    std::vector<pollfd> fds;
    for (const auto& [rank, fd] : peers_) fds.push_back({fd.get(), POLLRDHUP, 0});
    fds.push_back({stop_read_.get(), POLLIN, 0});
    for (;;) {
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds.back().revents != 0) return;
      for (size_t i = 0; i + 1 < fds.size(); ++i)
        if (fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) {
          if (grace_s_ > 0) {
            pollfd stop{stop_read_.get(), POLLIN, 0};
            int n;
            do n = ::poll(&stop, 1, static_cast<int>(grace_s_ * 1000));
            while (n < 0 && errno == EINTR);
            if (n != 0) return;  // ended within the grace period
          }
          const int r = peers_[i].first;
          lost_(r, fmt::format("rank {} exited or was killed (its connection closed)", r));
          return;
        }
    }
  }

  std::vector<std::pair<int, Fd>> peers_;
  std::function<void(int, const std::string&)> lost_;
  double grace_s_;
  Fd stop_read_, stop_write_;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Communicator> connect_tcp(const TcpOptions& opts) {
  return std::make_unique<TcpCommunicator>(opts, rendezvous(opts));
}

std::shared_ptr<void> watch_peers(Communicator& tcp, std::function<void(int, const std::string&)> lost,
                                  double grace_s) {
  auto* c = dynamic_cast<TcpCommunicator*>(&tcp);
  KILN_CHECK(c, "internal: watch_peers needs a TCP communicator, not a {} one", tcp.kind());
  return std::make_shared<PeerWatch>(c->dup_peers(), std::move(lost), grace_s);
}

}  // namespace kiln::dist
