#include "kv/block_allocator.h"

#include <climits>

#include "core/error.h"

namespace kiln::kv {

BlockAllocator::BlockAllocator(int64_t num_blocks) {
  KILN_CHECK(num_blocks > 0 && num_blocks <= INT32_MAX, "KV pool needs 1 .. 2^31-1 blocks, got {}", num_blocks);
  refs_.assign(static_cast<size_t>(num_blocks), 0);
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

void BlockAllocator::check_id(int32_t block) const {
  KILN_CHECK(block >= 0 && block < num_blocks(), "internal: block id {} outside the pool of {} blocks", block,
             num_blocks());
}

int32_t BlockAllocator::allocate() {
  if (free_.empty()) return -1;
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockAllocator::incref(int32_t block) {
  check_id(block);
  KILN_CHECK(refs_[static_cast<size_t>(block)] > 0, "internal: incref of free block {}", block);
  ++refs_[static_cast<size_t>(block)];
}

void BlockAllocator::decref(int32_t block) {
  check_id(block);
  int32_t& r = refs_[static_cast<size_t>(block)];
  KILN_CHECK(r > 0, "internal: decref of free block {}", block);
  if (--r == 0) free_.push_back(block);
}

int32_t BlockAllocator::refcount(int32_t block) const {
  check_id(block);
  return refs_[static_cast<size_t>(block)];
}

void BlockAllocator::check_integrity() const {
  std::vector<char> seen(refs_.size(), 0);
  for (int32_t b : free_) {
    check_id(b);
    KILN_CHECK(!seen[static_cast<size_t>(b)], "KV allocator: block {} is on the free list twice", b);
    KILN_CHECK(refs_[static_cast<size_t>(b)] == 0, "KV allocator: free block {} has {} references", b,
               refs_[static_cast<size_t>(b)]);
    seen[static_cast<size_t>(b)] = 1;
  }
  for (size_t b = 0; b < refs_.size(); ++b)
    KILN_CHECK(seen[b] || refs_[b] > 0, "KV allocator: block {} is neither free nor referenced", b);
}

}  // namespace kiln::kv
