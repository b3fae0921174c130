// The hardware catalog: every required GPU is there with a source line and sane figures, names
// resolve case-insensitively, and a bad entry or name is reported by name.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "plan/hardware.h"

namespace kiln::plan {
namespace {

TEST(Catalog, HoldsEveryRequiredGpuWithASource) {
  const auto& cat = builtin_catalog();
  for (const char* name : {"H100", "H200", "B200", "B300", "MI300X", "MI325X", "MI355X"}) {
    SCOPED_TRACE(name);
    const GpuSpec& g = find_gpu(cat, name);
    EXPECT_EQ(g.name, name);
    EXPECT_FALSE(g.source.empty());
    EXPECT_GT(g.hbm_visible_bytes, 64e9);
    EXPECT_GT(g.hbm_bw_bytes_s, 3e12);
    EXPECT_GT(g.bf16_flops, 900e12);
    // Dense FP8 is twice dense BF16 on every part listed; a sparsity figure would break this.
    EXPECT_NEAR(g.fp8_flops, 2 * g.bf16_flops, 0.01 * g.bf16_flops);
    EXPECT_GT(g.link_bytes_s, 100e9);
    EXPECT_GT(g.board_watts, 500);
    EXPECT_GT(g.usd_per_gpu_hour, 0);
  }
  // The capacities the fit tests depend on.
  EXPECT_EQ(find_gpu(cat, "H200").hbm_visible_bytes, 143771LL * 1024 * 1024);
  EXPECT_EQ(find_gpu(cat, "B200").hbm_visible_bytes, 183359LL * 1024 * 1024);
  EXPECT_EQ(find_gpu(cat, "B300").hbm_marketed_gb, 288);
  EXPECT_EQ(find_gpu(cat, "MI355X").hbm_marketed_gb, 288);
  // FP4 only where the hardware has it.
  EXPECT_EQ(find_gpu(cat, "H100").fp4_flops, 0);
  EXPECT_EQ(find_gpu(cat, "MI300X").fp4_flops, 0);
  EXPECT_GT(find_gpu(cat, "B300").fp4_flops, find_gpu(cat, "B200").fp4_flops);
}

TEST(Catalog, NamesAreCaseInsensitiveAndAliasesWork) {
  const auto& cat = builtin_catalog();
  EXPECT_EQ(find_gpu(cat, "b300").name, "B300");
  EXPECT_EQ(find_gpu(cat, "h100-sxm").name, "H100");
  try {
    find_gpu(cat, "A100");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--gpu A100"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("MI355X"), std::string::npos) << e.what();
  }
}

TEST(Catalog, BadEntriesNameTheField) {
  nlohmann::json j = {{"gpus",
                       {{{"name", "X1"},
                         {"hbm_marketed_gb", 80},
                         {"hbm_visible_bytes", 80e9},
                         {"hbm_bw_gb_s", -1},
                         {"bf16_tflops", 1},
                         {"fp8_tflops", 0},
                         {"fp4_tflops", 0},
                         {"link_gb_s_per_direction", 1},
                         {"collective_latency_us", 1},
                         {"board_watts", 1},
                         {"usd_per_gpu_hour", 1},
                         {"source", "test"}}}}};
  try {
    parse_catalog(j, "cat.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("X1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("hbm_bw_gb_s"), std::string::npos) << e.what();
  }
  j["gpus"][0]["hbm_bw_gb_s"] = 1000;
  j["gpus"][0].erase("source");
  EXPECT_THROW(parse_catalog(j, "cat.json"), Error);
  j["gpus"][0]["source"] = "test";
  EXPECT_EQ(parse_catalog(j, "cat.json").at(0).hbm_bw_bytes_s, 1e12);
}

}  // namespace
}  // namespace kiln::plan
