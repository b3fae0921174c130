// Radix prefix cache over full token blocks (DESIGN.md §3). Each node below the root stands for
// one block of `block_size` tokens following its parent's tokens, and holds one reference on the
// pool block whose latent KV those tokens produced. A request whose prompt starts with a cached
// path reuses those blocks instead of recomputing them.
//
// Locking: a sequence using a path locks its deepest node; lock counts ride up to the root, so a
// locked node and its ancestors are never evicted. Eviction removes unlocked leaves in LRU order
// (a logical clock that every match and insert advances, so ties and order are deterministic).
// The unlocked leaves are kept in an ordered index so that eviction costs O(log n) per block
// instead of a walk over the whole tree on every call.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "kv/block_allocator.h"

namespace kiln::kv {

class RadixCache {
 public:
  struct Node;
  // Evictable leaves keyed by (last_access, id): the front is the next to evict.
  using LruIndex = std::map<std::pair<uint64_t, uint64_t>, Node*>;

  struct Node {
    std::vector<int32_t> key;  // [block_size] tokens of this block (empty at the root)
    int32_t block = -1;        // pool block holding those tokens' KV
    Node* parent = nullptr;
    std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
    int64_t locks = 0;     // lock() calls on this node itself
    int64_t lock_ref = 0;  // locks of this node and of every node below it
    uint64_t last_access = 0;
    uint64_t id = 0;  // creation order: breaks LRU ties deterministically
    // Position in the eviction index, valid while in_lru (an unlocked leaf other than the root).
    LruIndex::iterator lru;
    bool in_lru = false;
  };

  struct Match {
    std::vector<int32_t> blocks;  // [matched blocks]: pool blocks of the cached prefix, in order
    Node* last = nullptr;         // deepest matched node (the root when nothing matched)
  };

  struct Stats {
    int64_t matches = 0;         // match() calls
    int64_t queried_tokens = 0;  // tokens those calls could have matched (whole blocks, capped)
    int64_t hit_tokens = 0;      // tokens they did match
    int64_t inserted_blocks = 0;
    int64_t evicted_blocks = 0;
  };

  RadixCache(BlockAllocator& allocator, int64_t block_size);
  ~RadixCache();  // returns the cache's references to the allocator
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  // Longest cached prefix of `tokens` in whole blocks, at most `max_blocks` blocks. Marks the path
  // as used now. The caller takes its own references on the blocks it keeps.
  Match match(std::span<const int32_t> tokens, int64_t max_blocks);

  // Caches the path of blocks.size() full blocks: blocks[i] holds tokens [i*bs, (i+1)*bs).
  // Where a block is already cached the existing node keeps its block (both hold the same KV, up
  // to rounding); each new node takes a reference on the caller's block. Returns the path as
  // cached: its blocks (which the caller should switch to, so no KV is held twice) and last node.
  Match insert(std::span<const int32_t> tokens, std::span<const int32_t> blocks);

  // Pins a node and its ancestors against eviction; the root may be passed (a no-op).
  void lock(Node* node);
  void unlock(Node* node);

  // Evicts unlocked leaves, least recently used first, until `num_blocks` pool blocks were freed
  // or nothing evictable remains. Returns the number of pool blocks freed.
  int64_t evict(int64_t num_blocks);

  int64_t block_size() const { return block_size_; }
  int64_t num_nodes() const { return num_nodes_; }  // cached blocks (root excluded)
  int64_t num_locked() const { return num_locked_; }
  int64_t num_evictable() const { return num_nodes_ - num_locked_; }
  const Stats& stats() const { return stats_; }
  const Node* root() const { return root_.get(); }

  // Every cached block (one per node), in no particular order.
  std::vector<int32_t> cached_blocks() const;

  // Checks the tree: links, keys, lock counts, LRU order along paths, one node per block, block
  // references held, and that the eviction index holds exactly the unlocked leaves under their
  // current keys. Throws kiln::Error describing the first violation.
  void check_integrity() const;

 private:
  void add_lock_ref(Node* node, int64_t delta);
  bool evictable(const Node* node) const;
  // Brings `node`'s entry in the eviction index in line with its state: removes a stale entry and
  // files it under its current (last_access, id) if it is evictable. Call after any change to its
  // lock_ref, children or last_access.
  void reindex(Node* node);
  void unindex(Node* node);
  void release(Node* node);  // drops the references of a subtree (destructor)

  BlockAllocator& alloc_;
  int64_t block_size_;
  std::unique_ptr<Node> root_;
  LruIndex lru_;  // holds pointers only: destroyed with no need to visit the nodes
  int64_t num_nodes_ = 0, num_locked_ = 0;
  uint64_t clock_ = 0, next_id_ = 1;
  Stats stats_;
};

}  // namespace kiln::kv
