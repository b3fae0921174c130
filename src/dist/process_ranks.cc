#include "dist/process_ranks.h"

#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace kiln::dist {
namespace {

// What rank 0 tells the other processes. Every message first lists the pools freed since the
// last one.
enum class Op : uint8_t { NewPool = 1, Step = 2, Stop = 3 };

class Writer {
 public:
  template <typename T>
  void put(T v) {
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &v, sizeof(T));
  }
  template <typename T>
  void put_vec(const std::vector<T>& v) {
    put<uint64_t>(v.size());
    const size_t at = bytes_.size();
    bytes_.resize(at + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(bytes_.data() + at, v.data(), v.size() * sizeof(T));
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// Reads what Writer wrote; a short or overlong message (a rank 0 of another kiln version) is an
// error, never a read past the end.
class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : b_(b) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, b_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  template <typename T>
  std::vector<T> get_vec() {
    const auto n = get<uint64_t>();
    KILN_CHECK(n <= (b_.size() - at_) / sizeof(T), "a malformed message from rank 0: {} elements past its end", n);
    std::vector<T> v(n);
    need(n * sizeof(T));
    if (n) std::memcpy(v.data(), b_.data() + at_, n * sizeof(T));
    at_ += n * sizeof(T);
    return v;
  }
  void done() const {
    KILN_CHECK(at_ == b_.size(), "a malformed message from rank 0: {} bytes left over", b_.size() - at_);
  }

 private:
  void need(size_t n) const {
    KILN_CHECK(n <= b_.size() - at_, "a malformed message from rank 0: it ends {} bytes early", n - (b_.size() - at_));
  }
  const std::vector<uint8_t>& b_;
  size_t at_ = 0;
};

DType dtype_from(uint8_t v) {
  KILN_CHECK(v <= static_cast<uint8_t>(DType::I4X8), "a malformed message from rank 0: dtype {}", v);
  return static_cast<DType>(v);
}

// The pools rank 0 dropped, waiting for the next message (a handle may end on any thread).
struct FreeList {
  std::mutex mu;
  std::vector<int64_t> ids;
};

class ProcessRanks final : public RemoteRanks {
 public:
  ProcessRanks(Communicator& comm, ops::Backend& be) : comm_(comm), be_(be), frees_(std::make_shared<FreeList>()) {}

  ~ProcessRanks() override {
    try {
      if (std::uncaught_exceptions() > 0) {
        comm_.abort("rank 0 stopped with an error");  // the workers fail rather than report success
      } else {
        Writer w = message(Op::Stop);
        send(w);
      }
    } catch (const std::exception& e) {
      spdlog::warn("telling the other processes to stop: {}", e.what());
    }
  }

  std::shared_ptr<const int64_t> new_pool(const LatentKvPool& pool) override {
    const int64_t id = next_id_++;
    Writer w = message(Op::NewPool);
    w.put<int64_t>(id);
    w.put<int64_t>(pool.num_blocks);
    w.put<int64_t>(pool.block_size);
    // The precision flags were set on this backend; the other processes' ranks follow it.
    w.put<uint8_t>(static_cast<uint8_t>(pool.dtype));
    w.put<uint8_t>(static_cast<uint8_t>(be_.activation_dtype()));
    w.put<uint8_t>(static_cast<uint8_t>(be_.expert_activation_dtype()));
    send(w);
    return std::shared_ptr<const int64_t>(new int64_t(id), [frees = frees_](const int64_t* p) {
      std::lock_guard lock(frees->mu);
      frees->ids.push_back(*p);
      delete p;
    });
  }

  void step(const ForwardBatch& b, const LatentKvPool& pool, int form) override {
    KILN_CHECK(pool.remote, "a KV pool of a multi-process model must come from its new_pool");
    Writer w = message(Op::Step);
    w.put<int64_t>(*pool.remote);
    w.put<int32_t>(form);
    // The overlapped loop's pending tokens stay on rank 0's device: its forward hands every rank
    // the ids (step_inputs.cc), so the others need only where they go.
    w.put_vec(b.tokens);
    w.put_vec(b.token_from);
    w.put_vec(b.positions);
    w.put_vec(b.cu_q);
    w.put_vec(b.kv_lens);
    w.put_vec(b.block_tables);
    w.put<int64_t>(b.max_blocks);
    w.put_vec(b.slot_mapping);
    w.put_vec(b.logit_rows);
    w.put_vec(b.verify_rows);
    send(w);
  }

 private:
  Writer message(Op op) {
    Writer w;
    w.put<uint8_t>(static_cast<uint8_t>(op));
    std::vector<int64_t> ids;
    {
      std::lock_guard lock(frees_->mu);
      ids.swap(frees_->ids);
    }
    w.put_vec(ids);
    return w;
  }
  void send(Writer& w) {
    spdlog::debug("to the other processes: message {} ({} bytes)", w.bytes()[0], w.bytes().size());
    broadcast_blob(comm_, w.bytes(), 0);
  }

  Communicator& comm_;
  ops::Backend& be_;
  std::shared_ptr<FreeList> frees_;
  int64_t next_id_ = 0;
};

class BorrowedComm final : public Communicator {
 public:
  explicit BorrowedComm(Communicator& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int world_size() const override { return c_.world_size(); }
  std::string kind() const override { return c_.kind(); }
  void all_reduce(const void* send, void* recv, size_t count, DType dtype) override {
    c_.all_reduce(send, recv, count, dtype);
  }
  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    c_.all_gather(send, recv, count, dtype);
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype) override {
    c_.reduce_scatter(send, recv, count, dtype);
  }
  void all_to_all(const void* send, std::span<const size_t> send_counts, void* recv,
                  std::span<const size_t> recv_counts, DType dtype) override {
    c_.all_to_all(send, send_counts, recv, recv_counts, dtype);
  }
  void broadcast(void* buf, size_t count, DType dtype, int root) override { c_.broadcast(buf, count, dtype, root); }
  void barrier() override { c_.barrier(); }
  void abort(const std::string& reason) override { c_.abort(reason); }

 private:
  Communicator& c_;
};

}  // namespace

std::unique_ptr<RemoteRanks> make_process_ranks(Communicator& process_comm, ops::Backend& rank0) {
  KILN_CHECK(process_comm.rank() == 0, "internal: process {} cannot schedule the steps", process_comm.rank());
  return std::make_unique<ProcessRanks>(process_comm, rank0);
}

std::unique_ptr<Communicator> borrow_communicator(Communicator& c) {
  return std::make_unique<BorrowedComm>(c);
}

void run_rank_worker(DeepseekV3Model& model, Communicator& process_comm) {
  std::map<int64_t, LatentKvPool> pools;
  int64_t steps = 0;
  spdlog::info("process {} of {}: following rank 0's steps", process_comm.rank(), process_comm.world_size());
  for (;;) {
    const std::vector<uint8_t> msg = broadcast_blob(process_comm, {}, 0);
    Reader r(msg);
    const auto op = static_cast<Op>(r.get<uint8_t>());
    spdlog::debug("from rank 0: message {} ({} bytes)", static_cast<int>(op), msg.size());
    for (int64_t id : r.get_vec<int64_t>()) pools.erase(id);
    if (op == Op::Stop) {
      r.done();
      spdlog::info("process {}: rank 0 is done after {} steps", process_comm.rank(), steps);
      return;
    }
    if (op == Op::NewPool) {
      const auto id = r.get<int64_t>(), blocks = r.get<int64_t>(), block_size = r.get<int64_t>();
      const DType kv = dtype_from(r.get<uint8_t>()), act = dtype_from(r.get<uint8_t>()),
                  expert_act = dtype_from(r.get<uint8_t>());
      r.done();
      for (ops::Backend* b : model.rank_backends()) {
        b->set_activation_dtype(act);
        b->set_expert_activation_dtype(expert_act);
      }
      model.set_kv_dtype(kv);
      pools.insert_or_assign(id, model.new_pool(blocks, block_size));
      continue;
    }
    KILN_CHECK(op == Op::Step, "a malformed message from rank 0: operation {}", static_cast<int>(op));
    const auto id = r.get<int64_t>();
    const auto form = r.get<int32_t>();
    KILN_CHECK(form >= 0 && form <= static_cast<int>(MlaForm::Absorbed), "a malformed message from rank 0: form {}",
               form);
    ForwardBatch b;
    b.tokens = r.get_vec<int32_t>();
    b.token_from = r.get_vec<int32_t>();
    // Rank 0 takes the pending tokens from its device and broadcasts them; this rank's forward
    // never reads prev_tokens, but a step with token_from must name some.
    static const int32_t kOnRankZero = 0;
    if (!b.token_from.empty()) b.prev_tokens = &kOnRankZero;
    b.positions = r.get_vec<int32_t>();
    b.cu_q = r.get_vec<int32_t>();
    b.kv_lens = r.get_vec<int32_t>();
    b.block_tables = r.get_vec<int32_t>();
    b.max_blocks = r.get<int64_t>();
    b.slot_mapping = r.get_vec<int32_t>();
    b.logit_rows = r.get_vec<int32_t>();
    b.verify_rows = r.get_vec<uint8_t>();
    r.done();
    auto it = pools.find(id);
    KILN_CHECK(it != pools.end(), "rank 0 ran a step on pool {}, which this process never made", id);
    model.forward_logits(b, it->second, static_cast<MlaForm>(form));
    ++steps;
  }
}

}  // namespace kiln::dist
