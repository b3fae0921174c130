// Presenting plans: JSON (stable field names for scripts and tests), a report for one plan, a
// side-by-side table for --compare, and the --compare item syntax.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/planner.h"

namespace kiln::plan {

nlohmann::json plan_to_json(const Plan& p);
std::string format_plan(const Plan& p, const GpuSpec& gpu);
std::string format_compare(const std::vector<Plan>& plans);

// One --compare item: GPU[:GPUS[xNODES]][:key=value]..., keys tp, ep, dp (attention DP), dcp,
// weights, kv, price. Unset fields take the command line's values.
struct CompareItem {
  std::string gpu;
  std::optional<int64_t> gpus, nodes, tp, ep, attn_dp, dcp;
  std::optional<WeightFormat> weights;
  std::optional<int64_t> kv_bytes_per_value;
  std::optional<double> usd_per_gpu_hour;
};
CompareItem parse_compare_item(const std::string& item);
std::vector<CompareItem> parse_compare_list(const std::string& list);

// "bf16" -> 2, "fp8" -> 1; an unknown name is an error naming --kv.
int64_t parse_kv_dtype(const std::string& s);

}  // namespace kiln::plan
