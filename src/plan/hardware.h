// The hardware catalog: accelerators with the figures the planner needs (memory, bandwidth, tensor
// rates, scale-up link, power, a default price). The data lives in hardware_catalog.json, embedded
// into the binary at build time so `kiln plan` works from any directory; --catalog FILE swaps in
// another file of the same shape.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::plan {

struct GpuSpec {
  std::string name;                  // canonical catalog name, e.g. "B300"
  std::vector<std::string> aliases;  // other spellings --gpu accepts
  std::string vendor;
  double hbm_marketed_gb = 0;       // as the vendor markets it (GB or GiB, see source)
  int64_t hbm_visible_bytes = 0;    // bytes the driver reports as device memory
  double hbm_bw_bytes_s = 0;        // peak HBM bandwidth, bytes/s
  double bf16_flops = 0;            // dense tensor-core FLOP/s
  double fp8_flops = 0;             // dense; 0 = not supported
  double fp4_flops = 0;             // dense; 0 = not supported
  double link_bytes_s = 0;          // intra-node scale-up bandwidth per GPU, one direction, bytes/s
  double collective_latency_s = 0;  // fixed cost of one small intra-node collective, seconds
  double board_watts = 0;           // board power limit, W
  double usd_per_gpu_hour = 0;      // default price (placeholder; --gpu-price overrides)
  std::string source;               // where the figures come from, and what is uncertain
};

// Parses a catalog object ({"gpus": [...]}); `source` names the file in error messages.
std::vector<GpuSpec> parse_catalog(const nlohmann::json& j, const std::string& source);
// The catalog compiled into the binary.
const std::vector<GpuSpec>& builtin_catalog();
// Reads a catalog file.
std::vector<GpuSpec> load_catalog(const std::string& path);
// Finds `name` (case-insensitive, name or alias); an unknown name is an error listing the catalog.
const GpuSpec& find_gpu(const std::vector<GpuSpec>& catalog, const std::string& name);

}  // namespace kiln::plan
