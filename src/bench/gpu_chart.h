// kiln-gpu-bench's results as a chart (`kiln bench chart`): every figure as a fraction of the
// ceiling measured in the same run, one horizontal bar each, with the target where it has
// one, so a reader sees at a glance which figures meet their ceilings' targets and by how much.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "bench/svg.h"

namespace kiln::bench {

// The bars of one kiln-gpu-bench report (its --out JSON): the first model's decode rows (fraction
// of the HBM ceiling), its prefill rows (fraction of the bf16 GEMM rate) in each precision mode,
// and the MLA decode kernel at 16 heads, batch 128, 8k+ contexts (fraction of copy bandwidth).
// Throws kiln::Error naming the first missing or mistyped field.
std::vector<ResultBar> gpu_bench_bars(const nlohmann::json& report);

// The subtitle for a report: device and the two ceilings.
std::string gpu_bench_subtitle(const nlohmann::json& report);

}  // namespace kiln::bench
