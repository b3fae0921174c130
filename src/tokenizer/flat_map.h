// Open-addressing hash tables for the encode hot path: vocabularies keyed by bytes and merge
// tables keyed by id pairs. std::unordered_map's node per entry costs a cache miss per lookup,
// which dominates BPE time; these keep keys and values in one flat array.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tok {

inline uint64_t hash_bytes(std::string_view s) {
  // FNV-1a over 8-byte words, finished with a 64-bit mix: fast for the short keys we hash.
  uint64_t h = 0xcbf29ce484222325ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  if (i < s.size()) std::memcpy(&tail, s.data() + i, s.size() - i);
  h = (h ^ tail) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  return h;
}

inline uint64_t hash_u64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// Byte-string -> uint32 map. Keys are copied into an internal arena.
class StringMap {
 public:
  void reserve(size_t n);
  // Inserts or overwrites.
  void set(std::string_view key, uint32_t value);
  const uint32_t* find(std::string_view key) const;
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0, length = 0;
    uint32_t value = 0;
    bool used = false;
  };
  void grow();
  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0;
};

// uint64 -> (uint32, uint32) map (BPE merges: pair of ids -> rank and merged id).
class PairMap {
 public:
  struct Value {
    uint32_t rank, id;
  };
  void reserve(size_t n);
  void set(uint64_t key, Value v);
  const Value* find(uint64_t key) const {
    if (slots_.empty()) return nullptr;
    size_t mask = slots_.size() - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (!s.used) return nullptr;
      if (s.key == key) return &s.value;
    }
  }
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key = 0;
    Value value{};
    bool used = false;
  };
  void grow();
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace kiln::tok
