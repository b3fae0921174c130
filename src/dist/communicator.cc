#include "dist/communicator.h"

#include "core/error.h"
#include "dist/rank_order_sum.h"

namespace kiln::dist {

void check_reduce_dtype(const char* op, DType dtype) {
  KILN_CHECK(dtype == DType::F32 || dtype == DType::BF16, "{}: sums F32 or BF16, not {}", op, dtype_name(dtype));
}

void check_root(const char* op, int root, int world_size) {
  KILN_CHECK(root >= 0 && root < world_size, "{}: root rank {} is outside the group of {} ranks", op, root, world_size);
}

void check_counts(const char* op, std::span<const size_t> counts, int world_size) {
  KILN_CHECK(counts.size() == static_cast<size_t>(world_size), "{}: {} counts given for a group of {} ranks", op,
             counts.size(), world_size);
}

std::vector<uint8_t> broadcast_blob(Communicator& host_comm, const std::vector<uint8_t>& blob, int root) {
  const bool mine = host_comm.rank() == root;
  int64_t size = mine ? static_cast<int64_t>(blob.size()) : 0;
  host_comm.broadcast(&size, 1, DType::I64, root);
  std::vector<uint8_t> out = mine ? blob : std::vector<uint8_t>(static_cast<size_t>(size));
  host_comm.broadcast(out.data(), out.size(), DType::U8, root);
  return out;
}

void sum_in_rank_order(std::span<const void* const> sources, size_t count, DType dtype, void* dst) {
  KILN_CHECK(!sources.empty(), "sum: no sources");
  if (dtype == DType::F32) {
    auto* out = static_cast<float*>(dst);
    for (size_t i = 0; i < count; ++i) {
      // Starting from rank 0's value keeps a group of one bitwise exact (-0 and NaN payloads included).
      float acc = static_cast<const float*>(sources[0])[i];
      for (size_t r = 1; r < sources.size(); ++r) acc += static_cast<const float*>(sources[r])[i];
      out[i] = acc;
    }
    return;
  }
  check_reduce_dtype("sum", dtype);
  auto* out = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < count; ++i) {
    if (sources.size() == 1) {
      out[i] = static_cast<const uint16_t*>(sources[0])[i];
      continue;
    }
    float acc = bf16_to_f32(static_cast<const uint16_t*>(sources[0])[i]);
    for (size_t r = 1; r < sources.size(); ++r) acc += bf16_to_f32(static_cast<const uint16_t*>(sources[r])[i]);
    out[i] = f32_to_bf16(acc);
  }
}

}  // namespace kiln::dist
