// Block allocator of the paged KV pool: hands out block ids with reference counts. A block is
// shared when several holders (sequences' block tables, prefix-cache nodes) point at the same
// cached tokens; it returns to the free list when its last holder lets go.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::kv {

class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks);

  // A free block with reference count 1, or -1 when none is free.
  int32_t allocate();
  void incref(int32_t block);
  // Drops one reference; the block is free again when none is left.
  void decref(int32_t block);

  int32_t refcount(int32_t block) const;
  int64_t num_blocks() const { return static_cast<int64_t>(refs_.size()); }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_used() const { return num_blocks() - num_free(); }

  // Every block is either free with count 0 or used with count > 0, exactly once. Throws if not.
  void check_integrity() const;

 private:
  void check_id(int32_t block) const;
  std::vector<int32_t> refs_;  // [num_blocks]
  std::vector<int32_t> free_;  // stack of free ids; the lowest ids are handed out first at startup
};

// The pool slot of token `pos` of a sequence whose blocks are `table` (block * block_size + offset).
inline int32_t slot_of(const std::vector<int32_t>& table, int64_t pos, int64_t block_size) {
  return static_cast<int32_t>(table[static_cast<size_t>(pos / block_size)] * block_size + pos % block_size);
}

// Blocks needed to hold `tokens` tokens.
inline int64_t blocks_for(int64_t tokens, int64_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

}  // namespace kiln::kv
