// How many KV blocks to allocate: from an explicit byte budget (`--kv-cache-memory`) or from a
// fraction of the memory still free after the weights are loaded, never more than the running
// sequences could use.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::kv {

struct KvCacheSizing {
  int64_t num_blocks = 0;        // explicit block count (tests, benchmarks); wins when > 0
  int64_t memory_bytes = 0;      // byte budget; used when > 0
  double memory_fraction = 0.9;  // else this share of the free memory
};

struct KvCachePlan {
  int64_t num_blocks = 0, block_size = 0, bytes_per_token = 0;
  std::string source;  // how the size was chosen, for the startup line
  int64_t tokens() const { return num_blocks * block_size; }
  int64_t bytes() const { return tokens() * bytes_per_token; }
};

// `free_bytes`: memory the pool may come from (ignored when the sizing gives blocks or bytes).
// `max_tokens`: the most tokens that could ever be live (max sequences x max length); the pool is
// capped there. Throws when the budget does not hold a single block.
KvCachePlan plan_kv_cache(const KvCacheSizing& s, int64_t block_size, int64_t bytes_per_token, int64_t free_bytes,
                          int64_t max_tokens);

// "8GiB", "512MiB", "4G", "1.5GB", "1000000" -> bytes. Binary and decimal units are both accepted
// (K/M/G/T and Ki/Mi/Gi/Ti, with an optional trailing B). Throws naming `flag` on bad input.
int64_t parse_memory_size(const std::string& text, const std::string& flag);

}  // namespace kiln::kv
