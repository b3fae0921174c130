#include "bench/gpu_chart.h"

#include <fmt/format.h>

#include "core/error.h"

namespace kiln::bench {
namespace {

using json = nlohmann::json;

// j[key] of any type, or an error naming where it is missing.
const json& field(const json& j, const std::string& key, const std::string& where) {
  KILN_CHECK(j.is_object() && j.contains(key), "gpu bench report: {} has no \"{}\"", where, key);
  return j.at(key);
}

const json& rows(const json& j, const std::string& key, const std::string& where) {
  const json& v = field(j, key, where);
  KILN_CHECK(v.is_array(), "gpu bench report: {}.{} is not an array", where, key);
  return v;
}

double number(const json& j, const std::string& key, const std::string& where) {
  const json& v = field(j, key, where);
  KILN_CHECK(v.is_number(), "gpu bench report: {}.{} is not a number", where, key);
  return v.get<double>();
}

// A figure as a fraction of its ceiling: 0 to 10 (past 1 only by a measurement's noise or a cache;
// anything else is a broken report, and an absurd one would scale the chart to nothing).
double fraction(const json& j, const std::string& key, const std::string& where) {
  const double f = number(j, key, where);
  KILN_CHECK(f >= 0 && f <= 10, "gpu bench report: {}.{} is {}, not a fraction of a ceiling (0 to 10)", where, key, f);
  return f;
}

// The targets (docs/results.md): single-stream decode 60% of the HBM ceiling, prefill at
// 1k and 8k prompts 40% of the bf16 rate, the MLA decode kernel 70% of copy at 8k+ contexts.
constexpr double kDecodeTarget = 0.60, kPrefillTarget = 0.40, kMlaTarget = 0.70;

// The precision modes kiln-gpu-bench runs, by the suffix of their JSON keys.
struct Mode {
  const char* suffix;
  const char* name;
};
constexpr Mode kModes[] = {{"", ""}, {"_bf16_experts", ", bf16 experts"}, {"_bf16_activations", ", bf16 act."}};

// row(r, where, mode) for each row of m's `kind` ("decode", "prefill") in every precision mode: the
// default mode's list is required, the others are optional.
template <typename F>
void each_mode_row(const json& m, const std::string& name, const std::string& kind, F&& row) {
  for (const Mode& mode : kModes) {
    const std::string key = kind + mode.suffix;
    if (mode.suffix[0] && !m.contains(key)) continue;
    const json& list = rows(m, key, name);
    for (size_t i = 0; i < list.size(); ++i) row(list[i], fmt::format("{}.{}[{}]", name, key, i), mode);
  }
}

}  // namespace

std::vector<ResultBar> gpu_bench_bars(const json& report) {
  std::vector<ResultBar> bars;
  KILN_CHECK(report.is_object(), "gpu bench report: not a JSON object");
  if (report.contains("models")) {  // absent with kiln-gpu-bench --skip-model
    const json& models = report["models"];
    KILN_CHECK(models.is_array() && !models.empty(), "gpu bench report: \"models\" is not a non-empty array");
    const json& m = models[0];
    KILN_CHECK(m.is_object(), "gpu bench report: models[0] is not an object");
    const std::string name = m.contains("model") && m["model"].is_string() ? m["model"].get<std::string>() : "model 0";
    each_mode_row(m, name, "decode", [&](const json& r, const std::string& where, const Mode& mode) {
      const double batch = number(r, "batch", where);
      ResultBar b{.group = "decode, " + name + " (fraction of the HBM ceiling)",
                  .label = fmt::format("{:g} stream{}{}", batch, batch == 1 ? "" : "s", mode.name),
                  .value = fmt::format("{:.0f} tok/s", number(r, "tok_s_aggregate", where)),
                  .fraction = fraction(r, "fraction_of_ceiling", where)};
      if (batch == 1) b.target = kDecodeTarget;
      bars.push_back(b);
    });
    each_mode_row(m, name, "prefill", [&](const json& r, const std::string& where, const Mode& mode) {
      const double prompt = number(r, "prompt", where);
      const double prompts = r.contains("prompts") ? number(r, "prompts", where) : 1;
      ResultBar b{.group = "prefill, " + name + " (fraction of the bf16 GEMM rate)",
                  .label = prompts == 1 ? fmt::format("{:g} tokens{}", prompt, mode.name)
                                        : fmt::format("{:g} x {:g} tokens{}", prompts, prompt, mode.name),
                  .value = fmt::format("{:.0f} tok/s", number(r, "tok_s", where)),
                  .fraction = fraction(r, "fraction_of_bf16_gemm", where)};
      // The figures are one prompt of 1k or of 8k tokens.
      if (prompts == 1 && (prompt == 1024 || prompt == 8192)) b.target = kPrefillTarget;
      bars.push_back(b);
    });
  }
  if (report.contains("mla_decode_kernel")) {
    const json& list = rows(report, "mla_decode_kernel", "the report");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string where = fmt::format("mla_decode_kernel[{}]", i);
      const double heads = number(list[i], "heads", where), ctx = number(list[i], "context", where);
      if (heads != 16 || number(list[i], "batch", where) != 128 || ctx < 8192) continue;
      const json& kv = list[i].contains("kv_dtype") ? list[i]["kv_dtype"] : json();
      bars.push_back(
          {.group = fmt::format("MLA decode kernel, 16 heads, batch 128, {} cache (fraction of copy bandwidth)",
                                kv.is_string() ? kv.get<std::string>() : "unknown"),
           .label = fmt::format("context {:g}", ctx),
           .value = fmt::format("{:.0f} GB/s", number(list[i], "gbps", where)),
           .fraction = fraction(list[i], "fraction_of_copy_bw", where),
           .target = kMlaTarget});
    }
  }
  KILN_CHECK(!bars.empty(),
             "gpu bench report: no figures to draw (no \"models\" rows and no \"mla_decode_kernel\" row "
             "at 16 heads, batch 128, 8k+ context)");
  return bars;
}

std::string gpu_bench_subtitle(const json& report) {
  const json& c = field(report, "ceilings", "the report");
  const std::string device = report.contains("device") && report["device"].is_string()
                                 ? report["device"].get<std::string>()
                                 : std::string("unknown device");
  return fmt::format("{}: ceilings measured in the run, copy {:.0f} GB/s, bf16 GEMM {:.0f} TFLOP/s", device,
                     number(c, "copy_gbps", "ceilings"), number(c, "bf16_gemm_tflops", "ceilings"));
}

}  // namespace kiln::bench
