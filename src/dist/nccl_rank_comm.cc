#include "dist/nccl_rank_comm.h"

#include "dist/nccl_communicator.h"

namespace kiln::dist {
namespace {

class BackendOrderedComm : public Communicator {
 public:
  BackendOrderedComm(std::unique_ptr<NcclCommunicator> nccl, ops::Backend& be) : nccl_(std::move(nccl)), be_(be) {}

  int rank() const override { return nccl_->rank(); }
  int world_size() const override { return nccl_->world_size(); }
  std::string kind() const override { return nccl_->kind(); }
  void all_reduce(const void* send, void* recv, size_t count, DType dtype) override {
    ordered([&] { nccl_->all_reduce(send, recv, count, dtype); });
  }
  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    ordered([&] { nccl_->all_gather(send, recv, count, dtype); });
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype) override {
    ordered([&] { nccl_->reduce_scatter(send, recv, count, dtype); });
  }
  void all_to_all(const void* send, std::span<const size_t> send_counts, void* recv,
                  std::span<const size_t> recv_counts, DType dtype) override {
    ordered([&] { nccl_->all_to_all(send, send_counts, recv, recv_counts, dtype); });
  }
  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    ordered([&] { nccl_->broadcast(buf, count, dtype, root); });
  }
  void barrier() override { nccl_->barrier(); }
  void abort(const std::string& reason) override { nccl_->abort(reason); }

 private:
  template <typename F>
  void ordered(F&& f) {
    be_.synchronize();  // the buffers' producers have run
    f();
    nccl_->synchronize();  // the results are there before the backend's next op reads them
  }

  std::unique_ptr<NcclCommunicator> nccl_;
  ops::Backend& be_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_rank_comm(int rank, int world_size, Communicator& host, ops::Backend& backend) {
  return make_nccl_rank_comm(rank, world_size, share_nccl_id(host), rank, backend);
}

std::unique_ptr<Communicator> make_nccl_rank_comm(int rank, int world_size, const NcclId& id, int device,
                                                  ops::Backend& backend) {
  NcclOptions o;
  o.rank = rank;
  o.world_size = world_size;
  o.device = device;
  return std::make_unique<BackendOrderedComm>(connect_nccl(o, id), backend);
}

}  // namespace kiln::dist
