// Built only with CUDA and NCCL (src/dist/CMakeLists.txt). The communicator is nonblocking
// (config.blocking = 0): every NCCL call returns at once and its completion is polled, so that no
// step, the initialisation included, can wait on a dead peer without a bound.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"
#include "dist/nccl_communicator.h"

namespace kiln::dist {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  KILN_CHECK(e == cudaSuccess, "nccl communicator: {}: {}", what, cudaGetErrorString(e));
}

ncclDataType_t reduce_type(DType t) {
  return t == DType::BF16 ? ncclBfloat16 : ncclFloat32;
}

class Nccl final : public NcclCommunicator {
 public:
  Nccl(const NcclOptions& o, const NcclId& id) : opts_(o) {
    KILN_CHECK(o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size, "nccl: rank {} is outside a group of {}",
               o.rank, o.world_size);
    check_cuda(cudaSetDevice(o.device), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaMalloc(&barrier_buf_, sizeof(float)), "cudaMalloc");
    ncclUniqueId uid;
    static_assert(sizeof uid == sizeof(NcclId));
    std::memcpy(&uid, id.data(), sizeof uid);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, o.world_size, uid, o.rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (comm_) ncclCommAbort(comm_);
      release_cuda();
      fail("nccl: rank {} of {} could not start its communicator: {}", o.rank, o.world_size, ncclGetErrorString(r));
    }
    try {
      wait_ready(deadline_after(o.init_timeout_s), "forming the group (is every rank started, with the same id?)");
    } catch (...) {
      release_cuda();
      throw;
    }
    watchdog_ = std::thread([this] { watch(); });
  }

  ~Nccl() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    std::lock_guard lock(mu_);
    if (comm_) {
      // Finalize flushes what is still queued; when that fails, abort frees what a clean end can't.
      ncclResult_t r = ncclCommFinalize(comm_);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (r == ncclSuccess || r == ncclInProgress) {
        ncclResult_t state = ncclSuccess;
        ncclCommGetAsyncError(comm_, &state);
        if (state != ncclInProgress) {
          r = state;
          break;
        }
        if (std::chrono::steady_clock::now() > deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (r == ncclSuccess)
        ncclCommDestroy(comm_);
      else
        ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    release_cuda();
  }

  int rank() const override { return opts_.rank; }
  int world_size() const override { return opts_.world_size; }
  std::string kind() const override { return "nccl"; }
  void* stream() const override { return stream_; }

  void all_reduce(const void* send, void* recv, size_t count, DType dtype) override {
    check_reduce_dtype("all_reduce", dtype);
    call("all_reduce",
         [&](ncclComm_t c) { return ncclAllReduce(send, recv, count, reduce_type(dtype), ncclSum, c, stream_); });
  }

  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    call("all_gather",
         [&](ncclComm_t c) { return ncclAllGather(send, recv, count * dtype_size(dtype), ncclUint8, c, stream_); });
  }

  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype) override {
    check_reduce_dtype("reduce_scatter", dtype);
    call("reduce_scatter",
         [&](ncclComm_t c) { return ncclReduceScatter(send, recv, count, reduce_type(dtype), ncclSum, c, stream_); });
  }

  // Point-to-point pairs in one NCCL group. The peers' counts are not visible here (they are on
  // other GPUs), so a disagreement shows as NCCL's error or a wrong result, not a named one.
  void all_to_all(const void* send, std::span<const size_t> send_counts, void* recv,
                  std::span<const size_t> recv_counts, DType dtype) override {
    check_counts("all_to_all", send_counts, world_size());
    check_counts("all_to_all", recv_counts, world_size());
    const size_t elem = dtype_size(dtype);
    call("all_to_all", [&](ncclComm_t c) {
      ncclResult_t r = ncclGroupStart();
      size_t send_off = 0, recv_off = 0;
      for (int peer = 0; peer < world_size() && (r == ncclSuccess || r == ncclInProgress); ++peer) {
        if (send_counts[peer] > 0)
          r = ncclSend(static_cast<const uint8_t*>(send) + send_off * elem, send_counts[peer] * elem, ncclUint8, peer,
                       c, stream_);
        if (recv_counts[peer] > 0 && (r == ncclSuccess || r == ncclInProgress))
          r = ncclRecv(static_cast<uint8_t*>(recv) + recv_off * elem, recv_counts[peer] * elem, ncclUint8, peer, c,
                       stream_);
        send_off += send_counts[peer];
        recv_off += recv_counts[peer];
      }
      const ncclResult_t end = ncclGroupEnd();
      return r == ncclSuccess || r == ncclInProgress ? end : r;
    });
  }

  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    check_root("broadcast", root, world_size());
    call("broadcast",
         [&](ncclComm_t c) { return ncclBroadcast(buf, buf, count * dtype_size(dtype), ncclUint8, root, c, stream_); });
  }

  void barrier() override {
    call("barrier",
         [&](ncclComm_t c) { return ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, c, stream_); });
    synchronize();
  }

  void synchronize() override {
    while (true) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) break;
      KILN_CHECK(e == cudaErrorNotReady, "nccl: rank {}: the stream failed: {}", rank(), cudaGetErrorString(e));
      throw_if_ended();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    throw_if_ended();
  }

  void abort(const std::string& reason) override {
    std::lock_guard lock(mu_);
    end_locked(fmt::format("rank {} ended the NCCL group: {}", rank(), reason));
  }

 private:
  static std::chrono::steady_clock::time_point deadline_after(double s) {
    return s <= 0
               ? std::chrono::steady_clock::time_point::max()
               : std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
  }

  // One NCCL call under the lock that the watchdog's abort also takes, so the handle it uses stays
  // valid; then waits until NCCL has taken it (nonblocking calls may still be enqueueing).
  template <typename F>
  void call(const char* what, F&& f) {
    std::unique_lock lock(mu_);
    if (ended_) throw Error(*ended_);
    const ncclResult_t r = f(comm_);
    if (r != ncclSuccess && r != ncclInProgress) {
      const std::string why =
          fmt::format("nccl {} on rank {}: {} ({})", what, rank(), ncclGetErrorString(r), ncclGetLastError(comm_));
      end_locked(why);
      throw Error(why);
    }
    lock.unlock();
    if (r == ncclInProgress) wait_ready(std::chrono::steady_clock::time_point::max(), what);
  }

  // Polls NCCL's state until the last call has been taken or failed.
  void wait_ready(std::chrono::steady_clock::time_point deadline, const char* what) {
    while (true) {
      {
        std::lock_guard lock(mu_);
        if (ended_) throw Error(*ended_);
        ncclResult_t state = ncclSuccess;
        ncclCommGetAsyncError(comm_, &state);
        if (state == ncclSuccess) return;
        if (state != ncclInProgress) {
          const std::string why = fmt::format("nccl: rank {} of {} failed while {}: {}", rank(), world_size(), what,
                                              ncclGetErrorString(state));
          end_locked(why);
          throw Error(why);
        }
        if (std::chrono::steady_clock::now() > deadline) {
          const std::string why = fmt::format("nccl: rank {} of {} timed out after {} s {}", rank(), world_size(),
                                              opts_.init_timeout_s, what);
          end_locked(why);
          throw Error(why);
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  void throw_if_ended() {
    std::lock_guard lock(mu_);
    if (ended_) throw Error(*ended_);
  }

  // Aborts the communicator once (kernels blocked on a peer then return) and keeps the reason.
  void end_locked(const std::string& why) {
    if (!ended_) ended_ = why;
    if (comm_) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }

  // The watchdog: a peer's failure surfaces as an asynchronous error, which nothing on the
  // collective path would see while a kernel waits; abort on it.
  void watch() {
    const auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(opts_.watchdog_period_s));
    std::unique_lock lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, period, [&] { return stop_; });
      if (stop_ || !comm_) continue;
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress)
        end_locked(fmt::format("nccl watchdog on rank {} of {}: {} (a peer failed or the network dropped)", rank(),
                               world_size(), ncclGetErrorString(state)));
    }
  }

  void release_cuda() {
    if (barrier_buf_) cudaFree(barrier_buf_);
    if (stream_) cudaStreamDestroy(stream_);
    barrier_buf_ = nullptr;
    stream_ = nullptr;
  }

  const NcclOptions opts_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* barrier_buf_ = nullptr;
  std::mutex mu_;  // guards comm_ (the watchdog may abort it) and ended_
  std::condition_variable cv_;
  bool stop_ = false;
  std::optional<std::string> ended_;
  std::thread watchdog_;
};

}  // namespace

bool nccl_available() {
  return true;
}

NcclId make_nccl_id() {
  ncclUniqueId uid;
  const ncclResult_t r = ncclGetUniqueId(&uid);
  KILN_CHECK(r == ncclSuccess, "nccl: cannot make a unique id: {}", ncclGetErrorString(r));
  NcclId id;
  std::memcpy(id.data(), &uid, id.size());
  return id;
}

std::unique_ptr<NcclCommunicator> connect_nccl(const NcclOptions& opts, const NcclId& id) {
  return std::make_unique<Nccl>(opts, id);
}

}  // namespace kiln::dist
