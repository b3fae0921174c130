// 1,000 concurrent streaming requests against `kiln serve` on the small model: under the cap of
// 1,024 requests in flight every one completes (a server refusing them all with 503 passed this
// test before), none hangs (the node script has a deadline), and the server's resident memory
// stays bounded.
#include <gtest/gtest.h>

#include "serve_fixture.h"

namespace kiln::server::test {
namespace {

TEST(ServeLoad, ThousandConcurrentStreams) {
  if (!have_tiny_weights()) GTEST_SKIP() << "needs the weights of models/kiln-tiny";
  if (!have_node_openai()) GTEST_SKIP() << "needs node and tests/npm";
  ServeProcess s({"--http-threads", "1100", "--max-pending-requests", "1024"});
  ASSERT_TRUE(s.wait_ready()) << s.log();
  const long before = s.rss_kib();
  const CmdResult r = s.node("load", "--count 1000 --min-completed 1000", 240);
  EXPECT_EQ(r.code, 0) << r.out << "\n--- server log ---\n" << s.log();
  const long after = s.rss_kib();
  // Bounded: what 1,000 finished streams leave behind must not grow without limit. The bound is
  // loose (thread stacks touched, allocator caches); a leak of the streams' buffers would exceed it.
  EXPECT_LT(after - before, 1024L * 1024) << "RSS grew from " << before << " KiB to " << after << " KiB";
  // A second wave reuses what the first left, so memory must not grow by another wave's worth.
  const CmdResult r2 = s.node("load", "--count 1000 --min-completed 1000", 240);
  EXPECT_EQ(r2.code, 0) << r2.out;
  const long after2 = s.rss_kib();
  EXPECT_LT(after2 - after, 256L * 1024) << "RSS " << after << " -> " << after2 << " KiB";
  EXPECT_EQ(s.stop(SIGTERM, 60), 0) << s.log();
}

}  // namespace
}  // namespace kiln::server::test
