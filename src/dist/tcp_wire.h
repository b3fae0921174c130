// The TCP communicator's wire format and the pure parts of its protocol, apart from the sockets'
// bookkeeping: frames, the description of one rank's call, rank 0's computation of a collective's
// result for every rank, and the rendezvous that forms the group.
#pragma once

#include <poll.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "dist/socket.h"
#include "dist/tcp_communicator.h"

namespace kiln::dist {

enum class WireOp : uint32_t {
  Hello = 1,    // rendezvous: a rank introduces itself
  Welcome = 2,  // rendezvous: the group is whole
  Refuse = 3,   // rendezvous: rank 0 gives up, with the reason
  AllReduce = 10,
  AllGather,
  ReduceScatter,
  AllToAll,
  Broadcast,
  Barrier,
  Result = 30,  // rank 0's answer: this rank's share of the result
  Fault = 31,   // rank 0's answer: the call was wrong on some rank (the group stays usable)
  Abort = 32,   // the group ends, with the reason
};
const char* wire_op_name(WireOp op);

struct Frame {
  WireOp op = WireOp::Abort;
  uint64_t seq = 0;
  std::vector<uint8_t> payload;
};

void send_frame(const Fd& fd, WireOp op, uint64_t seq, const std::vector<uint8_t>& payload, const std::string& peer);
// Reads one frame (see read_all for the statuses); a frame that is not ours is an error naming `peer`.
ReadStatus read_wire_frame(const Fd& fd, Frame& out, Clock::time_point deadline, int wake_fd, const std::string& peer);

// Waits until one of `fds` is readable (or has hung up). The last entry is the wake-up pipe: Woken.
ReadStatus poll_any(std::vector<pollfd>& fds, Clock::time_point deadline);

// What one rank asks of a collective. `fault` carries a bad argument to rank 0 instead of throwing
// locally, so that every rank fails alike rather than the others waiting for ever.
struct Call {
  WireOp op = WireOp::Barrier;
  size_t count = 0;
  DType dtype = DType::U8;
  int root = 0;
  std::string fault;
  std::vector<size_t> send_counts, recv_counts;  // all_to_all only
};

std::vector<uint8_t> encode_call(const Call& c, const std::vector<uint8_t>& data);
// Decodes a frame of op `op` from a peer; `data` receives the rank's contribution.
Call decode_call(WireOp op, const std::vector<uint8_t>& payload, int world_size, std::vector<uint8_t>& data);

struct Outcome {
  std::string fault;                           // set when any rank's call was bad or they disagree
  std::vector<std::vector<uint8_t>> per_rank;  // each rank's result bytes
};
// Rank 0's work: checks that every rank made the same call and computes every rank's result in
// rank order (the same sums as the thread communicator).
Outcome compute_collective(const std::vector<Call>& calls, const std::vector<std::vector<uint8_t>>& data);

// Forms the group: on rank 0 returns the connection to every rank (index 0 empty), elsewhere just
// the connection to rank 0 (at index 0). Errors name the missing, late or misconfigured rank.
std::vector<Fd> rendezvous(const TcpOptions& opts);

}  // namespace kiln::dist
