// Communicator: the collectives that tensor, expert and decode-context parallelism need, over one
// group of ranks. Every rank of the group calls the same collectives in the same order (SPMD); the
// buffers are plain pointers plus element counts in memory of the communicator's device (host memory
// for the CPU communicators, device memory for NCCL, where the calls are ordered on its stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace kiln::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // "threads", "tcp", "nccl": for logs and the startup layout.
  virtual std::string kind() const = 0;

  // recv[i] = sum over ranks of send[i], `count` elements of F32 or BF16. `send` may equal `recv`.
  // The CPU communicators add in rank order in f32 and round once, so every rank holds the same bits.
  virtual void all_reduce(const void* send, void* recv, size_t count, DType dtype) = 0;

  // recv (world_size * count elements) holds rank r's `count` elements at offset r * count.
  virtual void all_gather(const void* send, void* recv, size_t count, DType dtype) = 0;

  // send holds world_size * count elements; rank r receives the sum over ranks of block r
  // (send[r * count .. (r + 1) * count)). F32 or BF16.
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType dtype) = 0;

  // Variable all-to-all (EP dispatch and combine): send holds send_counts[0] elements for rank 0,
  // then send_counts[1] for rank 1, ...; recv receives recv_counts[r] elements from rank r, in rank
  // order. Both spans have world_size entries, and recv_counts[r] on this rank must equal rank r's
  // send_counts[this rank] (checked where the communicator can see both sides).
  virtual void all_to_all(const void* send, std::span<const size_t> send_counts, void* recv,
                          std::span<const size_t> recv_counts, DType dtype) = 0;

  // Copies rank `root`'s `count` elements of `buf` into every other rank's `buf`.
  virtual void broadcast(void* buf, size_t count, DType dtype, int root) = 0;

  // Returns on every rank only after every rank has entered it.
  virtual void barrier() = 0;

  // Ends the group from this rank: every other rank's pending or next collective fails with an error
  // naming this rank and `reason`. For a rank that fails outside a collective, so that its peers
  // stop waiting for it instead of hanging. Safe to call from any thread, more than once.
  virtual void abort(const std::string& reason) = 0;
};

// Gives every rank `root`'s blob (its length need not be known elsewhere): how rank 0 hands the
// NCCL unique id to the others over a host communicator. Other ranks' `blob` is ignored.
std::vector<uint8_t> broadcast_blob(Communicator& host_comm, const std::vector<uint8_t>& blob, int root = 0);

// The checks every implementation makes before a collective, each failing with a kiln::Error that
// names the collective and the fault.
void check_reduce_dtype(const char* op, DType dtype);
void check_root(const char* op, int root, int world_size);
void check_counts(const char* op, std::span<const size_t> counts, int world_size);

}  // namespace kiln::dist
