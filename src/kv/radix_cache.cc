#include "kv/radix_cache.h"

#include <set>

#include "core/error.h"

namespace kiln::kv {

RadixCache::RadixCache(BlockAllocator& allocator, int64_t block_size)
    : alloc_(allocator), block_size_(block_size), root_(std::make_unique<Node>()) {
  KILN_CHECK(block_size > 0, "prefix cache needs a positive block size, got {}", block_size);
}

RadixCache::~RadixCache() {
  release(root_.get());
}

void RadixCache::release(Node* node) {
  for (auto& [key, child] : node->children) release(child.get());
  if (node != root_.get()) alloc_.decref(node->block);
}

RadixCache::Match RadixCache::match(std::span<const int32_t> tokens, int64_t max_blocks) {
  const uint64_t now = ++clock_;
  const int64_t limit = std::min(static_cast<int64_t>(tokens.size()) / block_size_, max_blocks);
  Match m;
  Node* node = root_.get();
  node->last_access = now;
  std::vector<int32_t> key(static_cast<size_t>(block_size_));
  for (int64_t b = 0; b < limit; ++b) {
    key.assign(tokens.begin() + b * block_size_, tokens.begin() + (b + 1) * block_size_);
    auto it = node->children.find(key);
    if (it == node->children.end()) break;
    node = it->second.get();
    node->last_access = now;
    m.blocks.push_back(node->block);
  }
  // Only the deepest node can be a leaf (every other one has a child on the path), so only its
  // key in the eviction index moved.
  reindex(node);
  m.last = node;
  ++stats_.matches;
  stats_.queried_tokens += std::max<int64_t>(0, limit) * block_size_;
  stats_.hit_tokens += static_cast<int64_t>(m.blocks.size()) * block_size_;
  return m;
}

RadixCache::Match RadixCache::insert(std::span<const int32_t> tokens, std::span<const int32_t> blocks) {
  KILN_CHECK(static_cast<int64_t>(tokens.size()) >= static_cast<int64_t>(blocks.size()) * block_size_,
             "internal: prefix cache insert of {} blocks with only {} tokens", blocks.size(), tokens.size());
  const uint64_t now = ++clock_;
  Match m;
  Node* node = root_.get();
  node->last_access = now;
  for (size_t b = 0; b < blocks.size(); ++b) {
    std::vector<int32_t> key(tokens.begin() + static_cast<int64_t>(b) * block_size_,
                             tokens.begin() + static_cast<int64_t>(b + 1) * block_size_);
    auto it = node->children.find(key);
    if (it == node->children.end()) {
      auto child = std::make_unique<Node>();
      child->key = key;
      child->block = blocks[b];
      child->parent = node;
      child->id = next_id_++;
      alloc_.incref(blocks[b]);
      ++num_nodes_;
      ++stats_.inserted_blocks;
      it = node->children.emplace(std::move(key), std::move(child)).first;
      reindex(node);  // no longer a leaf
    }
    node = it->second.get();
    node->last_access = now;
    m.blocks.push_back(node->block);
  }
  reindex(node);  // the path's end: a new leaf, or an existing node with a fresher key
  m.last = node;
  return m;
}

void RadixCache::add_lock_ref(Node* node, int64_t delta) {
  for (Node* n = node; n != nullptr; n = n->parent) {
    const bool was_locked = n->lock_ref > 0;
    n->lock_ref += delta;
    KILN_CHECK(n->lock_ref >= 0, "internal: prefix cache node unlocked more often than locked");
    if (n == root_.get()) continue;
    const bool is_locked = n->lock_ref > 0;
    num_locked_ += static_cast<int64_t>(is_locked) - static_cast<int64_t>(was_locked);
    if (is_locked != was_locked) reindex(n);
  }
}

bool RadixCache::evictable(const Node* node) const {
  return node != root_.get() && node->children.empty() && node->lock_ref == 0;
}

void RadixCache::unindex(Node* node) {
  if (!node->in_lru) return;
  lru_.erase(node->lru);
  node->in_lru = false;
}

void RadixCache::reindex(Node* node) {
  const bool want = evictable(node);
  if (node->in_lru && want && node->lru->first == LruIndex::key_type(node->last_access, node->id)) return;
  unindex(node);
  // A node just touched carries the newest clock value, so the end is the right hint; any other
  // position is found in O(log n) all the same.
  if (want) {
    node->lru = lru_.emplace_hint(lru_.end(), LruIndex::key_type(node->last_access, node->id), node);
    node->in_lru = true;
  }
}

void RadixCache::lock(Node* node) {
  KILN_CHECK(node != nullptr, "internal: lock of a null prefix cache node");
  if (node == root_.get()) return;  // the root is never evicted anyway
  ++node->locks;
  add_lock_ref(node, 1);
}

void RadixCache::unlock(Node* node) {
  if (node == root_.get()) return;
  KILN_CHECK(node != nullptr && node->locks > 0, "internal: unlock of a prefix cache node that is not locked");
  --node->locks;
  add_lock_ref(node, -1);
}

int64_t RadixCache::evict(int64_t num_blocks) {
  // The index's front is the oldest unlocked leaf. Removing a leaf may turn its parent into one,
  // filed under its own key; a parent is never older than its child (every touch walks from the
  // root), so the removals come out oldest first, as a walk over the whole tree would order them.
  int64_t freed = 0;
  while (freed < num_blocks && !lru_.empty()) {
    Node* n = lru_.begin()->second;
    unindex(n);
    Node* parent = n->parent;
    if (alloc_.refcount(n->block) == 1) ++freed;
    alloc_.decref(n->block);
    --num_nodes_;
    ++stats_.evicted_blocks;
    parent->children.erase(parent->children.find(n->key));  // destroys n
    reindex(parent);
  }
  return freed;
}

std::vector<int32_t> RadixCache::cached_blocks() const {
  std::vector<int32_t> out;
  std::vector<const Node*> stack = {root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (n != root_.get()) out.push_back(n->block);
    for (const auto& [key, child] : n->children) stack.push_back(child.get());
  }
  return out;
}

void RadixCache::check_integrity() const {
  KILN_CHECK(root_->key.empty() && root_->parent == nullptr && root_->locks == 0,
             "prefix cache: the root is malformed");
  std::set<int32_t> blocks;
  int64_t nodes = 0, locked = 0, leaves = 0;
  std::vector<const Node*> stack = {root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    int64_t below = 0;
    for (const auto& [key, child] : n->children) {
      const Node* c = child.get();
      KILN_CHECK(c->parent == n, "prefix cache: node {} has a wrong parent link", c->id);
      KILN_CHECK(c->key == key, "prefix cache: node {} is filed under another key", c->id);
      KILN_CHECK(static_cast<int64_t>(c->key.size()) == block_size_, "prefix cache: node {} holds {} tokens, not {}",
                 c->id, c->key.size(), block_size_);
      KILN_CHECK(c->last_access <= n->last_access, "prefix cache: node {} was used after its parent", c->id);
      below += c->lock_ref;
      stack.push_back(c);
    }
    KILN_CHECK(n->lock_ref == n->locks + below, "prefix cache: node {} counts {} locks, has {} + {} below", n->id,
               n->lock_ref, n->locks, below);
    if (n == root_.get()) {
      KILN_CHECK(!n->in_lru, "prefix cache: the root is in the eviction index");
      continue;
    }
    if (evictable(n)) {
      ++leaves;
      auto it = lru_.find(LruIndex::key_type(n->last_access, n->id));
      KILN_CHECK(n->in_lru && it != lru_.end() && it == n->lru && it->second == n,
                 "prefix cache: unlocked leaf {} is missing from the eviction index or filed under a stale key", n->id);
    } else {
      KILN_CHECK(!n->in_lru, "prefix cache: node {} is in the eviction index but is locked or has children", n->id);
    }
    ++nodes;
    locked += n->lock_ref > 0;
    KILN_CHECK(blocks.insert(n->block).second, "prefix cache: block {} is cached twice", n->block);
    KILN_CHECK(alloc_.refcount(n->block) > 0, "prefix cache: node {} holds free block {}", n->id, n->block);
  }
  KILN_CHECK(nodes == num_nodes_, "prefix cache: {} nodes but the count says {}", nodes, num_nodes_);
  KILN_CHECK(locked == num_locked_, "prefix cache: {} locked nodes but the count says {}", locked, num_locked_);
  // Every evictable leaf has its own entry, so equal sizes leave no stray entries.
  KILN_CHECK(static_cast<int64_t>(lru_.size()) == leaves, "prefix cache: {} unlocked leaves but {} indexed", leaves,
             lru_.size());
}

}  // namespace kiln::kv
