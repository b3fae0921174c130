// Inputs and expected outputs for collective tests, shared by the thread and TCP communicator
// tests: rank r's input is a pure function of (r, i), so every process can compute any rank's.
#pragma once

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "dist/communicator.h"

namespace kiln::test {

// Distinct, non-integral values whose f32 sums depend on the order they are added in.
inline float rank_value(int rank, size_t i) {
  return static_cast<float>((rank * 7919 + static_cast<int>(i) * 104729) % 1000) / 7.0f - 70.0f + 1e-3f * rank;
}

inline std::vector<float> rank_input(int rank, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = rank_value(rank, i);
  return v;
}

// Sum over ranks 0..world-1 added in rank order, as the communicators promise.
inline std::vector<float> rank_order_sum(int world_size, size_t count) {
  std::vector<float> out = rank_input(0, count);
  for (int r = 1; r < world_size; ++r)
    for (size_t i = 0; i < count; ++i) out[i] += rank_value(r, i);
  return out;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

// Elements rank `from` sends rank `to` in the all-to-all tests: varied, zero for some pairs.
inline size_t a2a_count(int from, int to) {
  return static_cast<size_t>((from * 3 + to * 5) % 4);
}

// The value of element i that rank `from` sends rank `to`.
inline int32_t a2a_value(int from, int to, size_t i) {
  return from * 10000 + to * 100 + static_cast<int32_t>(i);
}

// Runs every collective once on `c` with `count` elements (an odd count exercises no alignment
// assumption) and returns a description of the first wrong result, or "" when all are right.
// Every rank of the group must call it; results are compared bit for bit.
inline std::string verify_collectives(dist::Communicator& c, size_t count) {
  const int rank = c.rank(), world = c.world_size();
  auto differ = [](const void* a, const void* b, size_t bytes) { return bytes > 0 && std::memcmp(a, b, bytes) != 0; };
  const size_t n = count;
  {  // all_reduce f32, out of place and in place
    const std::vector<float> in = rank_input(rank, n), want = rank_order_sum(world, n);
    std::vector<float> out(n, -1.0f);
    c.all_reduce(in.data(), out.data(), n, DType::F32);
    if (differ(out.data(), want.data(), n * 4)) return "all_reduce f32";
    std::vector<float> inplace = in;
    c.all_reduce(inplace.data(), inplace.data(), n, DType::F32);
    if (differ(inplace.data(), want.data(), n * 4)) return "all_reduce f32 in place";
  }
  {  // all_reduce bf16: f32 sum of the bf16 inputs in rank order, rounded once
    std::vector<float> want(n, 0.0f);
    for (int r = 0; r < world; ++r) {
      const auto in = to_bf16(rank_input(r, n));
      for (size_t i = 0; i < n; ++i) want[i] = r == 0 ? bf16_to_f32(in[i]) : want[i] + bf16_to_f32(in[i]);
    }
    const std::vector<uint16_t> in = to_bf16(rank_input(rank, n)), want16 = to_bf16(want);
    std::vector<uint16_t> out(n, 0xffff);
    c.all_reduce(in.data(), out.data(), n, DType::BF16);
    if (differ(out.data(), want16.data(), n * 2)) return "all_reduce bf16";
  }
  {  // all_gather
    const std::vector<float> in = rank_input(rank, n);
    std::vector<float> out(n * world, -1.0f), want;
    for (int r = 0; r < world; ++r) {
      const auto part = rank_input(r, n);
      want.insert(want.end(), part.begin(), part.end());
    }
    c.all_gather(in.data(), out.data(), n, DType::F32);
    if (differ(out.data(), want.data(), want.size() * 4)) return "all_gather";
  }
  {  // reduce_scatter: rank r gets block r of the sum
    const std::vector<float> in = rank_input(rank, n * world), sum = rank_order_sum(world, n * world);
    std::vector<float> out(n, -1.0f);
    c.reduce_scatter(in.data(), out.data(), n, DType::F32);
    if (differ(out.data(), sum.data() + rank * n, n * 4)) return "reduce_scatter";
  }
  {  // all_to_all with varied counts, zero included
    std::vector<size_t> send_counts(world), recv_counts(world);
    std::vector<int32_t> send, want;
    for (int r = 0; r < world; ++r) {
      send_counts[r] = a2a_count(rank, r);
      recv_counts[r] = a2a_count(r, rank);
      for (size_t i = 0; i < send_counts[r]; ++i) send.push_back(a2a_value(rank, r, i));
      for (size_t i = 0; i < recv_counts[r]; ++i) want.push_back(a2a_value(r, rank, i));
    }
    std::vector<int32_t> out(want.size(), -1);
    c.all_to_all(send.data(), send_counts, out.data(), recv_counts, DType::I32);
    if (out != want) return "all_to_all";
  }
  for (int root = 0; root < world; ++root) {  // broadcast from every root
    std::vector<float> buf = rank_input(rank, n);
    c.broadcast(buf.data(), n, DType::F32, root);
    if (buf != rank_input(root, n)) return "broadcast from root " + std::to_string(root);
  }
  c.barrier();
  return "";
}

}  // namespace kiln::test
