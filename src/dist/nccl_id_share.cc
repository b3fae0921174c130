#include <cstring>

#include "core/error.h"
#include "dist/nccl_communicator.h"

namespace kiln::dist {

NcclId share_nccl_id(Communicator& host_comm) {
  std::vector<uint8_t> blob;
  if (host_comm.rank() == 0) {
    const NcclId id = make_nccl_id();
    blob.assign(id.begin(), id.end());
  }
  const std::vector<uint8_t> got = broadcast_blob(host_comm, blob, 0);
  KILN_CHECK(got.size() == sizeof(NcclId), "NCCL id from rank 0 has {} bytes, not {}", got.size(), sizeof(NcclId));
  NcclId id;
  std::memcpy(id.data(), got.data(), id.size());
  return id;
}

#ifndef KILN_WITH_NCCL
bool nccl_available() {
  return false;
}
NcclId make_nccl_id() {
  fail("this build has no NCCL (it needs the CUDA build with libnccl)");
}
std::unique_ptr<NcclCommunicator> connect_nccl(const NcclOptions&, const NcclId&) {
  fail("this build has no NCCL (it needs the CUDA build with libnccl)");
}
#endif

}  // namespace kiln::dist
