#include "kv/block_allocator.h"

#include <gtest/gtest.h>

#include <set>

#include "core/error.h"

namespace kiln::kv {
namespace {

TEST(BlockAllocator, AllocatesEveryBlockOnceThenRunsOut) {
  BlockAllocator a(5);
  std::set<int32_t> got;
  for (int i = 0; i < 5; ++i) got.insert(a.allocate());
  EXPECT_EQ(got, (std::set<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(a.allocate(), -1);
  EXPECT_EQ(a.num_free(), 0);
  a.check_integrity();
}

TEST(BlockAllocator, SharedBlocksFreeWithTheLastReference) {
  BlockAllocator a(2);
  const int32_t b = a.allocate();
  a.incref(b);
  EXPECT_EQ(a.refcount(b), 2);
  a.decref(b);
  EXPECT_EQ(a.num_free(), 1);
  a.decref(b);
  EXPECT_EQ(a.num_free(), 2);
  EXPECT_EQ(a.refcount(b), 0);
  EXPECT_THROW(a.decref(b), Error);
  EXPECT_THROW(a.incref(b), Error);
  EXPECT_THROW(a.refcount(7), Error);
  a.check_integrity();
}

TEST(BlockAllocator, SlotMapping) {
  const std::vector<int32_t> table = {7, 2, 9};
  EXPECT_EQ(slot_of(table, 0, 4), 28);
  EXPECT_EQ(slot_of(table, 5, 4), 9);
  EXPECT_EQ(slot_of(table, 11, 4), 39);
  EXPECT_EQ(blocks_for(0, 4), 0);
  EXPECT_EQ(blocks_for(4, 4), 1);
  EXPECT_EQ(blocks_for(5, 4), 2);
}

}  // namespace
}  // namespace kiln::kv
