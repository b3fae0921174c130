#include "dist/thread_communicator.h"

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>

#include "core/error.h"
#include "dist/rank_order_sum.h"

namespace kiln::dist {
namespace {

// What one rank brings to a collective. `fault` is set instead of throwing when this rank's own
// arguments are bad, so that every rank learns of it at the barrier and fails alike.
struct Slot {
  const char* op = "";
  const void* send = nullptr;
  void* buf = nullptr;  // broadcast's buffer
  size_t count = 0;
  DType dtype = DType::F32;
  int root = 0;
  std::span<const size_t> send_counts, recv_counts;
  std::string fault;
};

class ThreadGroup {
 public:
  explicit ThreadGroup(int world_size) : world_size_(world_size), slots_(world_size) {}

  int world_size() const { return world_size_; }
  Slot& slot(int rank) { return slots_[rank]; }
  const Slot& slot(int rank) const { return slots_[rank]; }

  // Blocks until every rank has arrived; throws when the group was aborted first. The mutex orders
  // each rank's writes (its slot and buffers) before its peers' reads after the barrier.
  void arrive(int rank) {
    std::unique_lock lock(mu_);
    if (aborted_) throw Error(*aborted_);
    const uint64_t generation = generation_;
    if (++arrived_ == world_size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation || aborted_; });
    if (generation_ == generation) throw Error(*aborted_);
  }

  void abort(int rank, const std::string& reason) {
    std::lock_guard lock(mu_);
    if (!aborted_) aborted_ = fmt::format("rank {} ended the thread group: {}", rank, reason);
    cv_.notify_all();
  }

 private:
  const int world_size_;
  std::vector<Slot> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::optional<std::string> aborted_;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return group_->world_size(); }
  std::string kind() const override { return "threads"; }

  void all_reduce(const void* send, void* recv, size_t count, DType dtype) override {
    Slot s = slot("all_reduce", send, count, dtype, recv, count);
    if (s.fault.empty() && dtype != DType::F32 && dtype != DType::BF16) s.fault = unsupported_sum(dtype);
    publish_and_check(std::move(s));
    scratch_.resize(count * dtype_size(dtype));
    std::vector<const void*> sources(world_size());
    for (int r = 0; r < world_size(); ++r) sources[r] = group_->slot(r).send;
    sum_in_rank_order(sources, count, dtype, scratch_.data());
    finish(recv);
  }

  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    publish_and_check(slot("all_gather", send, count, dtype, recv, count * world_size()));
    const size_t bytes = count * dtype_size(dtype);
    scratch_.resize(bytes * world_size());
    for (int r = 0; r < world_size(); ++r) copy(scratch_.data() + r * bytes, group_->slot(r).send, bytes);
    finish(recv);
  }

  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype) override {
    Slot s = slot("reduce_scatter", send, count * world_size(), dtype, recv, count);
    s.count = count;
    if (s.fault.empty() && dtype != DType::F32 && dtype != DType::BF16) s.fault = unsupported_sum(dtype);
    publish_and_check(std::move(s));
    const size_t block = count * dtype_size(dtype);
    scratch_.resize(block);
    std::vector<const void*> sources(world_size());
    for (int r = 0; r < world_size(); ++r)
      sources[r] = static_cast<const uint8_t*>(group_->slot(r).send) + rank_ * block;
    sum_in_rank_order(sources, count, dtype, scratch_.data());
    finish(recv);
  }

  void all_to_all(const void* send, std::span<const size_t> send_counts, void* recv,
                  std::span<const size_t> recv_counts, DType dtype) override {
    size_t sent = 0, received = 0;
    for (size_t c : send_counts) sent += c;
    for (size_t c : recv_counts) received += c;
    Slot s = slot("all_to_all", send, sent, dtype, recv, received);
    s.count = 0;  // the counts differ by rank; the matrix check below compares them
    s.send_counts = send_counts;
    s.recv_counts = recv_counts;
    if (send_counts.size() != static_cast<size_t>(world_size()) ||
        recv_counts.size() != static_cast<size_t>(world_size()))
      s.fault = fmt::format("{} send counts and {} receive counts given for a group of {} ranks", send_counts.size(),
                            recv_counts.size(), world_size());
    publish_and_check(std::move(s));
    // Every rank checks the whole count matrix, so every rank reaches the same verdict.
    for (int i = 0; i < world_size(); ++i)
      for (int j = 0; j < world_size(); ++j)
        if (group_->slot(i).recv_counts[j] != group_->slot(j).send_counts[i]) {
          // Formatted before the barrier: after it the peers' count arrays may be gone.
          const std::string fault =
              fmt::format("all_to_all: rank {} expects {} elements from rank {}, which sends it {}", i,
                          group_->slot(i).recv_counts[j], j, group_->slot(j).send_counts[i]);
          group_->arrive(rank_);
          throw Error(fault);
        }
    const size_t elem = dtype_size(dtype);
    scratch_.resize(received * elem);
    uint8_t* out = scratch_.data();
    for (int r = 0; r < world_size(); ++r) {
      const Slot& peer = group_->slot(r);
      size_t offset = 0;  // where rank r's block for this rank starts in its send buffer
      for (int k = 0; k < rank_; ++k) offset += peer.send_counts[k];
      copy(out, static_cast<const uint8_t*>(peer.send) + offset * elem, recv_counts[r] * elem);
      out += recv_counts[r] * elem;
    }
    finish(recv);
  }

  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    Slot s = slot("broadcast", buf, count, dtype, buf, count);
    s.root = root;
    if (s.fault.empty() && (root < 0 || root >= world_size()))
      s.fault = fmt::format("root rank {} is outside the group of {} ranks", root, world_size());
    publish_and_check(std::move(s));
    const size_t bytes = count * dtype_size(dtype);
    scratch_.resize(bytes);
    copy(scratch_.data(), group_->slot(root).send, bytes);
    finish(buf);
  }

  void barrier() override { publish_and_check(slot("barrier", nullptr, 0, DType::U8, nullptr, 0)); }

  void abort(const std::string& reason) override { group_->abort(rank_, reason); }

 private:
  // `out_count` is how many elements this rank writes to `recv`.
  Slot slot(const char* op, const void* send, size_t count, DType dtype, const void* recv, size_t out_count) {
    Slot s;
    s.op = op;
    s.send = send;
    s.count = count;
    s.dtype = dtype;
    if (count > 0 && send == nullptr) s.fault = "a null send buffer";
    if (out_count > 0 && recv == nullptr) s.fault = "a null receive buffer";
    return s;
  }

  static std::string unsupported_sum(DType dtype) { return fmt::format("sums F32 or BF16, not {}", dtype_name(dtype)); }

  static void copy(void* dst, const void* src, size_t bytes) {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }

  // Publishes this rank's slot, waits for all, then fails on every rank alike (the same message,
  // each rank compared with rank 0) if any rank brought bad arguments or a different collective: an
  // SPMD bug that would otherwise read garbage.
  void publish_and_check(Slot s) {
    group_->slot(rank_) = std::move(s);
    group_->arrive(rank_);
    const Slot& first = group_->slot(0);
    for (int r = 0; r < world_size(); ++r) {
      const Slot& peer = group_->slot(r);
      std::string fault = peer.fault;
      if (fault.empty() && (std::strcmp(peer.op, first.op) != 0 || peer.count != first.count ||
                            peer.dtype != first.dtype || peer.root != first.root))
        fault =
            fmt::format("it called {}({} x {}, root {}) while rank 0 called {}({} x {}, root {})", peer.op, peer.count,
                        dtype_name(peer.dtype), peer.root, first.op, first.count, dtype_name(first.dtype), first.root);
      if (!fault.empty()) {
        group_->arrive(rank_);  // nobody may leave while a peer still reads the table
        fail("{}: rank {} of {}: {}", first.op, r, world_size(), fault);
      }
    }
  }

  // Waits until every rank has read its peers' buffers, then writes this rank's output.
  void finish(void* out) {
    group_->arrive(rank_);
    copy(out, scratch_.data(), scratch_.size());
  }

  std::shared_ptr<ThreadGroup> group_;
  const int rank_;
  std::vector<uint8_t> scratch_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int world_size) {
  KILN_CHECK(world_size >= 1, "a thread group needs at least one rank, not {}", world_size);
  auto group = std::make_shared<ThreadGroup>(world_size);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < world_size; ++r) comms.push_back(std::make_unique<ThreadCommunicator>(group, r));
  return comms;
}

}  // namespace kiln::dist
