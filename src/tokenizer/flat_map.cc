#include "tokenizer/flat_map.h"

namespace kiln::tok {

namespace {
size_t pow2_at_least(size_t n) {
  size_t c = 16;
  while (c < n) c <<= 1;
  return c;
}

// Grows an open-addressing table to hold n entries at most half full, reinserting by hash_of.
template <typename Slot, typename HashOf>
void reserve_slots(std::vector<Slot>& slots, size_t n, HashOf hash_of) {
  const size_t want = pow2_at_least(n * 2);
  if (want <= slots.size()) return;
  std::vector<Slot> old = std::move(slots);
  slots.assign(want, Slot{});
  const size_t mask = want - 1;
  for (const Slot& s : old) {
    if (!s.used) continue;
    size_t i = hash_of(s) & mask;
    while (slots[i].used) i = (i + 1) & mask;
    slots[i] = s;
  }
}
}  // namespace

void StringMap::reserve(size_t n) {
  reserve_slots(slots_, n, [](const Slot& s) { return s.hash; });
}

void StringMap::grow() {
  reserve(slots_.empty() ? 16 : slots_.size());
}

void StringMap::set(std::string_view key, uint32_t value) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  uint64_t h = hash_bytes(key);
  size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (!s.used) {
      s.used = true;
      s.hash = h;
      s.offset = static_cast<uint32_t>(arena_.size());
      s.length = static_cast<uint32_t>(key.size());
      s.value = value;
      arena_.append(key);
      ++size_;
      return;
    }
    if (s.hash == h && std::string_view(arena_).substr(s.offset, s.length) == key) {
      s.value = value;
      return;
    }
  }
}

const uint32_t* StringMap::find(std::string_view key) const {
  if (slots_.empty()) return nullptr;
  uint64_t h = hash_bytes(key);
  size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (!s.used) return nullptr;
    if (s.hash == h && s.length == key.size() && std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0)
      return &s.value;
  }
}

void PairMap::reserve(size_t n) {
  reserve_slots(slots_, n, [](const Slot& s) { return hash_u64(s.key); });
}

void PairMap::grow() {
  reserve(slots_.empty() ? 16 : slots_.size());
}

void PairMap::set(uint64_t key, Value v) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  size_t mask = slots_.size() - 1;
  for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (!s.used) {
      s = Slot{key, v, true};
      ++size_;
      return;
    }
    if (s.key == key) {
      s.value = v;
      return;
    }
  }
}

}  // namespace kiln::tok
