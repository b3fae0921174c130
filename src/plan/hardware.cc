#include "plan/hardware.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "plan/hardware_catalog_data.h"  // generated: kiln::plan::kHardwareCatalogJson

namespace kiln::plan {
namespace {

using json = nlohmann::json;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

double number(const json& g, const char* key, const std::string& where, bool allow_zero) {
  auto it = g.find(key);
  KILN_CHECK(it != g.end() && it->is_number(), "{}: field \"{}\" is missing or not a number", where, key);
  double v = it->get<double>();
  // 1e18 is past every catalog figure (bytes, B/s, FLOP/s are given in GB, TB/s, TFLOP/s) and keeps
  // the conversions to integers and the products of the plan finite.
  KILN_CHECK((allow_zero ? v >= 0 : v > 0) && v < 1e18, "{}: field \"{}\" must be {} and below 1e18, got {}", where,
             key, allow_zero ? ">= 0" : "positive", v);
  return v;
}

// An optional string field: absent is `dflt`, anything but a string an error naming it.
std::string text(const json& g, const char* key, const std::string& where, const std::string& dflt) {
  auto it = g.find(key);
  if (it == g.end()) return dflt;
  KILN_CHECK(it->is_string(), "{}: field \"{}\" must be a string, got {}", where, key, it->dump());
  return it->get<std::string>();
}

}  // namespace

std::vector<GpuSpec> parse_catalog(const json& j, const std::string& source) {
  KILN_CHECK(j.is_object() && j.contains("gpus") && j["gpus"].is_array(),
             "{}: expected an object with a \"gpus\" array", source);
  std::vector<GpuSpec> out;
  for (size_t i = 0; i < j["gpus"].size(); ++i) {
    const json& g = j["gpus"][i];
    std::string where = fmt::format("{}: gpus[{}]", source, i);
    KILN_CHECK(g.is_object() && g.contains("name") && g["name"].is_string() && !g["name"].get<std::string>().empty(),
               "{}: needs a non-empty string \"name\"", where);
    GpuSpec s;
    s.name = g["name"].get<std::string>();
    where += " (" + s.name + ")";
    if (auto a = g.find("aliases"); a != g.end()) {
      KILN_CHECK(a->is_array() && std::all_of(a->begin(), a->end(), [](const json& x) { return x.is_string(); }),
                 "{}: field \"aliases\" must be a list of strings, got {}", where, a->dump());
      s.aliases = a->get<std::vector<std::string>>();
    }
    // Names and aliases pick a GPU (case-insensitively): each may name one entry only.
    for (const std::string& n : [&] {
           auto names = s.aliases;
           names.push_back(s.name);
           return names;
         }())
      for (const GpuSpec& o : out) {
        const bool taken =
            lower(o.name) == lower(n) ||
            std::any_of(o.aliases.begin(), o.aliases.end(), [&](const std::string& x) { return lower(x) == lower(n); });
        KILN_CHECK(!taken, "{}: the name \"{}\" is taken by {} already", where, n, o.name);
      }
    s.vendor = text(g, "vendor", where, "");
    s.hbm_marketed_gb = number(g, "hbm_marketed_gb", where, false);
    s.hbm_visible_bytes = static_cast<int64_t>(number(g, "hbm_visible_bytes", where, false));
    s.hbm_bw_bytes_s = number(g, "hbm_bw_gb_s", where, false) * 1e9;
    s.bf16_flops = number(g, "bf16_tflops", where, false) * 1e12;
    s.fp8_flops = number(g, "fp8_tflops", where, true) * 1e12;
    s.fp4_flops = number(g, "fp4_tflops", where, true) * 1e12;
    s.link_bytes_s = number(g, "link_gb_s_per_direction", where, false) * 1e9;
    s.collective_latency_s = number(g, "collective_latency_us", where, true) * 1e-6;
    s.board_watts = number(g, "board_watts", where, false);
    s.usd_per_gpu_hour = number(g, "usd_per_gpu_hour", where, true);
    KILN_CHECK(g.contains("source") && g["source"].is_string() && !g["source"].get<std::string>().empty(),
               "{}: every entry needs a \"source\" line", where);
    s.source = g["source"].get<std::string>();
    out.push_back(std::move(s));
  }
  KILN_CHECK(!out.empty(), "{}: the catalog lists no GPUs", source);
  return out;
}

const std::vector<GpuSpec>& builtin_catalog() {
  static const std::vector<GpuSpec> catalog =
      parse_catalog(json::parse(kHardwareCatalogJson), "built-in hardware_catalog.json");
  return catalog;
}

std::vector<GpuSpec> load_catalog(const std::string& path) {
  std::error_code ec;  // a folder opens as a stream whose read fails with a library message
  KILN_CHECK(!std::filesystem::is_directory(path, ec), "hardware catalog {}: a folder, not a file", path);
  std::ifstream f(path);
  KILN_CHECK(f.good(), "cannot open hardware catalog {}", path);
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
  return parse_catalog(j, path);
}

const GpuSpec& find_gpu(const std::vector<GpuSpec>& catalog, const std::string& name) {
  const std::string want = lower(name);
  for (const auto& g : catalog) {
    if (lower(g.name) == want) return g;
    for (const auto& a : g.aliases)
      if (lower(a) == want) return g;
  }
  std::string names;
  for (const auto& g : catalog) names += (names.empty() ? "" : ", ") + g.name;
  fail("--gpu {}: not in the hardware catalog (known: {})", name, names);
}

}  // namespace kiln::plan
