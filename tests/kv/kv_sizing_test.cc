#include "kv/kv_sizing.h"
#include "core/sysinfo.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace kiln::kv {
namespace {

TEST(KvSizing, BlocksFromBytesFractionOrCount) {
  KvCacheSizing s;
  s.memory_bytes = 1000 * 64 * 10 + 5;  // ten blocks of 64 tokens at 1000 B/token, and change
  KvCachePlan p = plan_kv_cache(s, 64, 1000, 0, 1 << 20);
  EXPECT_EQ(p.num_blocks, 10);
  EXPECT_EQ(p.tokens(), 640);
  EXPECT_EQ(p.bytes(), 640000);

  KvCacheSizing f;
  f.memory_fraction = 0.5;
  EXPECT_EQ(plan_kv_cache(f, 64, 1000, 64000 * 8, 1 << 20).num_blocks, 4);
  // Capped at what max sequences x max length could use.
  EXPECT_EQ(plan_kv_cache(f, 64, 1000, 64000 * 8, 100).num_blocks, 2);

  KvCacheSizing n;
  n.num_blocks = 3;
  EXPECT_EQ(plan_kv_cache(n, 16, 1000, 0, 1).num_blocks, 3);

  KvCacheSizing tiny;
  tiny.memory_bytes = 100;
  EXPECT_THROW(plan_kv_cache(tiny, 64, 1000, 0, 1 << 20), Error);
}

TEST(KvSizing, ParsesMemorySizes) {
  EXPECT_EQ(parse_memory_size("1000", "--m"), 1000);
  EXPECT_EQ(parse_memory_size("2KiB", "--m"), 2048);
  EXPECT_EQ(parse_memory_size("8GiB", "--m"), 8LL << 30);
  EXPECT_EQ(parse_memory_size("4G", "--m"), 4000000000LL);
  EXPECT_EQ(parse_memory_size("1.5gb", "--m"), 1500000000LL);
  EXPECT_EQ(parse_memory_size("512Mi", "--m"), 512LL << 20);
  EXPECT_THROW(parse_memory_size("", "--m"), Error);
  EXPECT_THROW(parse_memory_size("lots", "--m"), Error);
  EXPECT_THROW(parse_memory_size("3X", "--m"), Error);
  EXPECT_THROW(parse_memory_size("-1G", "--m"), Error);
  // Once accepted: 0 bytes (then read as "not given": 90% of memory), past int64, a second dot.
  EXPECT_THROW(parse_memory_size("0.5", "--m"), Error);
  EXPECT_THROW(parse_memory_size("99999999999T", "--m"), Error);
  EXPECT_THROW(parse_memory_size("1.2.3K", "--m"), Error);
}

TEST(KvSizing, ReadsAvailableHostMemory) {
  EXPECT_GT(kiln::host_available_bytes(), 0);
}

}  // namespace
}  // namespace kiln::kv
