#include "kv/radix_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>

namespace kiln::kv {
namespace {

using Path = std::vector<int32_t>;  // tokens of whole blocks

TEST(RadixCache, MatchesWholeBlocksUpToTheLimit) {
  BlockAllocator a(8);
  {
    RadixCache c(a, 2);
    const Path p = {1, 2, 3, 4, 5, 6};
    std::vector<int32_t> blocks = {a.allocate(), a.allocate(), a.allocate()};
    auto ins = c.insert(p, blocks);
    EXPECT_EQ(ins.blocks, blocks);
    for (int32_t b : blocks) EXPECT_EQ(a.refcount(b), 2);
    EXPECT_EQ(c.match(p, 10).blocks, blocks);
    EXPECT_EQ(c.match(p, 2).blocks, Path(blocks.begin(), blocks.begin() + 2));
    EXPECT_EQ(c.match(Path{1, 2, 3}, 10).blocks, Path{blocks[0]});  // the half block does not count
    EXPECT_TRUE(c.match(Path{2, 1}, 10).blocks.empty());
    EXPECT_EQ(c.match(Path{2, 1}, 10).last, c.root());
    // A second sequence with the same tokens: the cache keeps its block and says so.
    const int32_t dup = a.allocate();
    auto again = c.insert(Path{1, 2}, std::vector<int32_t>{dup});
    EXPECT_EQ(again.blocks, Path{blocks[0]});
    EXPECT_EQ(a.refcount(dup), 1);
    EXPECT_EQ(c.stats().hit_tokens, 6 + 4 + 2);
    c.check_integrity();
  }
  // The cache gave its references back; the test still holds its own.
  EXPECT_EQ(a.num_used(), 4);
}

TEST(RadixCache, LockedPathsSurviveEviction) {
  BlockAllocator a(8);
  RadixCache c(a, 1);
  std::vector<int32_t> b1 = {a.allocate(), a.allocate()}, b2 = {a.allocate()};
  c.insert(Path{1, 2}, b1);
  c.insert(Path{3}, b2);
  for (int32_t b : b1) a.decref(b);
  a.decref(b2[0]);
  auto m = c.match(Path{1, 2}, 2);
  c.lock(m.last);
  c.lock(c.match(Path{}, 0).last);  // the root: a no-op
  EXPECT_EQ(c.num_locked(), 2);
  EXPECT_EQ(c.evict(10), 1);  // only {3}
  EXPECT_EQ(c.match(Path{1, 2}, 2).blocks, b1);
  c.unlock(m.last);
  c.unlock(c.match(Path{}, 0).last);
  EXPECT_EQ(c.evict(10), 2);
  EXPECT_EQ(a.num_free(), 8);
  c.check_integrity();
}

// Random insert / match / lock / unlock / evict sequences against a plain model of what the
// cache should hold.
class Harness {
 public:
  explicit Harness(uint32_t seed) : rng_(seed) {}

  void run(int ops) {
    for (int i = 0; i < ops; ++i) {
      const int op = static_cast<int>(rng_() % 10);
      if (op < 3)
        insert();
      else if (op < 6)
        match();
      else if (op < 8)
        unlock();
      else
        evict(1 + static_cast<int64_t>(rng_() % 5));
      check();
      if (::testing::Test::HasFailure()) return;
    }
    while (!locks_.empty()) unlock();
    evict(1 << 20);
    EXPECT_EQ(cache_.num_nodes(), 0);
    EXPECT_EQ(alloc_.num_free(), alloc_.num_blocks());
  }

 private:
  struct Entry {
    int32_t block;
    uint64_t last;
  };

  Path random_path(int max_blocks) {
    const int n = 1 + static_cast<int>(rng_() % static_cast<uint32_t>(max_blocks));
    Path p;
    for (size_t i = 0; i < static_cast<size_t>(n) * kBs; ++i) p.push_back(static_cast<int32_t>(rng_() % 3));
    return p;
  }
  static Path prefix(const Path& p, size_t blocks) { return Path(p.begin(), p.begin() + blocks * kBs); }

  void insert() {
    const Path p = random_path(5);
    const int64_t n = static_cast<int64_t>(p.size()) / kBs;
    if (alloc_.num_free() < n) evict(n - alloc_.num_free());
    if (alloc_.num_free() < n) return;
    std::vector<int32_t> blocks;
    for (int64_t i = 0; i < n; ++i) blocks.push_back(alloc_.allocate());
    auto m = cache_.insert(p, blocks);
    ++clock_;
    ASSERT_EQ(static_cast<int64_t>(m.blocks.size()), n);
    for (size_t k = 1; k <= static_cast<size_t>(n); ++k) {
      auto it = model_.find(prefix(p, k));
      EXPECT_EQ(m.blocks[k - 1], it == model_.end() ? blocks[k - 1] : it->second.block);
      model_[prefix(p, k)] = {m.blocks[k - 1], clock_};
    }
    for (int32_t b : blocks) alloc_.decref(b);  // the inserting sequence is done with them
  }

  void match() {
    const Path p = random_path(6);
    const int64_t max_blocks = static_cast<int64_t>(rng_() % 7);
    auto m = cache_.match(p, max_blocks);
    ++clock_;
    size_t k = 0;
    while (static_cast<int64_t>(k) < max_blocks && (k + 1) * kBs <= p.size() && model_.count(prefix(p, k + 1))) ++k;
    ASSERT_EQ(m.blocks.size(), k);
    for (size_t j = 1; j <= k; ++j) {
      Entry& e = model_[prefix(p, j)];
      EXPECT_EQ(m.blocks[j - 1], e.block);
      e.last = clock_;
    }
    if (k > 0 && rng_() % 2) {
      cache_.lock(m.last);
      locks_.emplace_back(m.last, prefix(p, k));
    }
  }

  void unlock() {
    if (locks_.empty()) return;
    const size_t i = rng_() % locks_.size();
    cache_.unlock(locks_[i].first);
    locks_.erase(locks_.begin() + static_cast<int64_t>(i));
  }

  bool locked(const Path& p) const {
    for (const auto& [node, path] : locks_)
      if (path.size() >= p.size() && std::equal(p.begin(), p.end(), path.begin())) return true;
    return false;
  }

  static void collect(const RadixCache::Node* n, Path& path, std::map<Path, int32_t>& out) {
    for (const auto& [key, child] : n->children) {
      path.insert(path.end(), key.begin(), key.end());
      out[path] = child->block;
      collect(child.get(), path, out);
      path.resize(path.size() - key.size());
    }
  }

  void evict(int64_t n) {
    const int64_t evictable = cache_.num_evictable();
    const int64_t freed = cache_.evict(n);
    EXPECT_EQ(freed, std::min(n, evictable));
    std::map<Path, int32_t> now;
    Path scratch;
    collect(cache_.root(), scratch, now);
    std::vector<Path> removed;
    for (const auto& [p, e] : model_) {
      auto it = now.find(p);
      if (it == now.end()) {
        removed.push_back(p);
        EXPECT_FALSE(locked(p)) << "a locked block was evicted";
      } else {
        EXPECT_EQ(it->second, e.block);
      }
    }
    EXPECT_EQ(static_cast<int64_t>(removed.size()), freed);
    EXPECT_EQ(now.size() + removed.size(), model_.size());
    // LRU: nothing evicted was used after any unlocked leaf that stayed.
    for (const auto& [p, b] : now) {
      const bool leaf = std::none_of(now.begin(), now.end(), [&](const auto& q) {
        return q.first.size() > p.size() && std::equal(p.begin(), p.end(), q.first.begin());
      });
      if (!leaf || locked(p)) continue;
      for (const Path& r : removed) EXPECT_LE(model_[r].last, model_[p].last);
    }
    for (const Path& r : removed) model_.erase(r);
  }

  void check() {
    cache_.check_integrity();
    alloc_.check_integrity();
    EXPECT_EQ(alloc_.num_used(), cache_.num_nodes());
    EXPECT_EQ(static_cast<int64_t>(model_.size()), cache_.num_nodes());
  }

  static constexpr size_t kBs = 2;
  std::mt19937 rng_;
  BlockAllocator alloc_{40};
  RadixCache cache_{alloc_, kBs};
  std::map<Path, Entry> model_;  // every cached prefix -> its block and last use
  uint64_t clock_ = 0;
  std::vector<std::pair<RadixCache::Node*, Path>> locks_;
};

TEST(RadixCache, RandomOperationsKeepInvariants) {
  for (uint32_t seed = 0; seed < 30; ++seed) {
    SCOPED_TRACE(seed);
    Harness(seed).run(400);
    if (HasFailure()) return;
  }
}

// Eviction through the index against a reference that, before each removal, walks a snapshot of
// the tree for its unlocked leaves and takes the oldest (last_access, then id), as the tree walk
// that evict() used to do on every call. Some inserted blocks stay held by a "sequence" for a
// while, so an evicted node does not always free its block and `freed` counts only those that do.
class EvictReference {
 public:
  explicit EvictReference(uint32_t seed) : rng_(seed) {}
  ~EvictReference() {
    for (int32_t b : held_) alloc_.decref(b);
  }

  void run(int ops) {
    for (int i = 0; i < ops; ++i) {
      const int op = static_cast<int>(rng_() % 12);
      if (op < 3) {
        insert();
      } else if (op < 6) {
        match();
      } else if (op < 8) {
        unlock();
      } else if (op < 9) {
        release_held();
      } else {
        static constexpr int64_t kSizes[] = {0, 1, 1, 2, 3, 5, 8, 1 << 20};
        evict(kSizes[rng_() % std::size(kSizes)]);
      }
      check();
      if (::testing::Test::HasFailure()) return;
    }
    // Left with nodes, locks and an index in place: the destructor must hand every block back.
  }

 private:
  struct Snap {
    uint64_t parent;  // id; 0 for a child of the root
    uint64_t last_access;
    int64_t lock_ref;
    int64_t children;
    int32_t block;
  };

  static void snapshot(const RadixCache::Node* n, std::map<uint64_t, Snap>& out) {
    for (const auto& [key, child] : n->children) {
      const RadixCache::Node* c = child.get();
      out[c->id] = {n->id, c->last_access, c->lock_ref, static_cast<int64_t>(c->children.size()), c->block};
      snapshot(c, out);
    }
  }

  // The nodes evict(num_blocks) should remove, in order, and the blocks it should free.
  std::pair<std::vector<uint64_t>, int64_t> reference(int64_t num_blocks) const {
    std::map<uint64_t, Snap> tree;
    snapshot(cache_.root(), tree);
    std::vector<uint64_t> order;
    int64_t freed = 0;
    while (freed < num_blocks) {
      const Snap* best = nullptr;
      uint64_t best_id = 0;
      for (const auto& [id, s] : tree) {
        if (s.children != 0 || s.lock_ref != 0) continue;
        if (best == nullptr || std::tie(s.last_access, id) < std::tie(best->last_access, best_id)) {
          best = &s;
          best_id = id;
        }
      }
      if (best == nullptr) break;
      if (alloc_.refcount(best->block) == 1) ++freed;
      if (best->parent != 0) --tree.at(best->parent).children;
      order.push_back(best_id);
      tree.erase(best_id);
    }
    return {order, freed};
  }

  Path random_path(int max_blocks) {
    const int n = 1 + static_cast<int>(rng_() % static_cast<uint32_t>(max_blocks));
    Path p;
    for (size_t i = 0; i < static_cast<size_t>(n) * kBs; ++i) p.push_back(static_cast<int32_t>(rng_() % 3));
    return p;
  }

  void insert() {
    const Path p = random_path(6);
    const int64_t n = static_cast<int64_t>(p.size()) / kBs;
    if (alloc_.num_free() < n) evict(n - alloc_.num_free());
    if (alloc_.num_free() < n) return;
    std::vector<int32_t> blocks;
    for (int64_t i = 0; i < n; ++i) blocks.push_back(alloc_.allocate());
    cache_.insert(p, blocks);
    for (int32_t b : blocks) {
      if (rng_() % 4 == 0)
        held_.push_back(b);  // still in a sequence's block table
      else
        alloc_.decref(b);
    }
  }

  void match() {
    auto m = cache_.match(random_path(7), static_cast<int64_t>(rng_() % 8));
    if (rng_() % 2) {
      cache_.lock(m.last);  // possibly the root
      locks_.push_back(m.last);
    }
  }

  void unlock() {
    if (locks_.empty()) return;
    const size_t i = rng_() % locks_.size();
    cache_.unlock(locks_[i]);
    locks_.erase(locks_.begin() + static_cast<int64_t>(i));
  }

  void release_held() {
    if (held_.empty()) return;
    const size_t i = rng_() % held_.size();
    alloc_.decref(held_[i]);
    held_.erase(held_.begin() + static_cast<int64_t>(i));
  }

  void evict(int64_t n) {
    const auto [order, want_freed] = reference(n);
    std::map<uint64_t, Snap> before;
    snapshot(cache_.root(), before);
    const int64_t evicted_before = cache_.stats().evicted_blocks;
    const int64_t freed = cache_.evict(n);
    EXPECT_EQ(freed, want_freed) << "evict(" << n << ")";
    EXPECT_EQ(cache_.stats().evicted_blocks - evicted_before, static_cast<int64_t>(order.size()));
    std::map<uint64_t, Snap> after;
    snapshot(cache_.root(), after);
    for (uint64_t id : order) before.erase(id);
    std::set<uint64_t> want, got;
    for (const auto& [id, s] : before) want.insert(id);
    for (const auto& [id, s] : after) got.insert(id);
    EXPECT_EQ(got, want) << "evict(" << n << ") removed other nodes than the reference";
  }

  void check() {
    cache_.check_integrity();
    alloc_.check_integrity();
  }

  static constexpr size_t kBs = 2;
  std::mt19937 rng_;
  BlockAllocator alloc_{48};
  RadixCache cache_{alloc_, kBs};
  std::vector<int32_t> held_;
  std::vector<RadixCache::Node*> locks_;
};

TEST(RadixCache, EvictionMatchesATreeWalkReference) {
  for (uint32_t seed = 0; seed < 40; ++seed) {
    SCOPED_TRACE(seed);
    EvictReference(seed).run(600);
    if (HasFailure()) return;
  }
}

// A node re-enters the index when its last lock goes away or its last child is evicted, under its
// old key: it must be evicted before newer leaves, not appended behind them.
TEST(RadixCache, UnlockedAndUncoveredNodesKeepTheirAge) {
  BlockAllocator a(8);
  RadixCache c(a, 1);
  auto put = [&](const Path& p) {
    std::vector<int32_t> blocks;
    for (size_t i = 0; i < p.size(); ++i) blocks.push_back(a.allocate());
    auto m = c.insert(p, blocks);
    for (int32_t b : blocks) a.decref(b);
    return m;
  };
  auto old_leaf = put(Path{1});  // oldest
  put(Path{2});                  // then {2}
  put(Path{3});                  // then {3}
  put(Path{2, 4});               // {2} and {2,4} are the newest
  c.lock(old_leaf.last);
  c.check_integrity();
  EXPECT_EQ(c.evict(1), 1);                       // {3}: {1} is locked, {2,4} is newer
  EXPECT_EQ(c.match(Path{3}, 1).last, c.root());  // touches only the root
  c.unlock(old_leaf.last);
  c.check_integrity();
  EXPECT_EQ(c.evict(1), 1);  // {1} again the oldest
  EXPECT_EQ(c.match(Path{1}, 1).blocks.size(), 0u);
  // {2,4} goes, then its parent {2} is a leaf of the same age and follows at once.
  EXPECT_EQ(c.evict(2), 2);
  EXPECT_EQ(c.num_nodes(), 0);
  c.check_integrity();
}

}  // namespace
}  // namespace kiln::kv
