// The planner's per-GPU weight bytes (kiln plan) against the slices the ranks will read
// (dist::weight_shard): summed over the ranks they must be the same bytes, so that a plan that
// says a layout fits counts what the ranks actually hold.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "dist/weight_shard.h"
#include "model/config.h"
#include "plan/weight_bytes.h"

namespace kiln::test {
namespace {

TEST(PlanAgreement, PlannerWeightBytesEqualTheRanksSlices) {
  const std::string dir = std::string(KILN_TEST_DATA) + "/fixtures";
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const ModelConfig m = load_model_config((entry.path() / "config.json").string());
    for (int world : {1, 2, 4})
      for (int ep : {1, world}) {
        dist::ParallelConfig p;
        p.world_size = p.tp = world;
        p.ep = ep;
        std::optional<dist::ParallelLayout> layout;
        try {
          layout.emplace(p, m);
        } catch (const Error&) {
          continue;  // a size the fixture does not divide
        }
        double ranks_bytes = 0;
        for (const WeightSpec& w : weight_layout(m)) {
          if (w.mtp) continue;  // the planner leaves NextN out unless asked
          const double bytes = static_cast<double>(plan::tensor_bytes(w, plan::WeightFormat::Bf16).total());
          for (int r = 0; r < world; ++r)
            ranks_bytes +=
                bytes * static_cast<double>(dist::shard_numel(w, dist::weight_shard(w, m, *layout, r))) / w.numel();
        }
        const double planned = plan::weight_totals(m, plan::WeightFormat::Bf16, world, world, false).bytes_per_gpu;
        EXPECT_NEAR(ranks_bytes, planned * world, 1e-6 * ranks_bytes)
            << entry.path().filename() << " world " << world << " ep " << ep;
        ++checked;
      }
  }
  EXPECT_GE(checked, 12);
}

}  // namespace
}  // namespace kiln::test
