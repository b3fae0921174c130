// `kiln plan --model DIR|CONFIG|PRESET --gpu NAME --gpus N [--nodes N] [--weights DTYPE] [--kv DTYPE]
// [--context TOKENS] [--json]` and more: does the model and its KV cache fit, what throughput can the
// hardware give at best, and at what cost. `--compare B200:8x2,B300:8,...` sets layouts side by side.
// The arithmetic lives in src/plan and src/bench/cost.h; this file only maps flags onto it.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "cli/command.h"
#include "core/error.h"
#include "plan/hardware.h"
#include "plan/planner.h"
#include "plan/presets.h"
#include "plan/report.h"

namespace kiln::cli {
namespace {

// Exit status of a plan that does not fit (of a --compare where no layout fits), so that scripts can
// branch on the verdict; errors exit 1 and CLI11's flag errors exit 100 and up.
constexpr int kExitDoesNotFit = 3;

struct PlanArgs {
  std::string model, gpu, weights, kv = "bf16", compare, catalog;
  int64_t gpus = 8, nodes = 1, tp = 0, ep = 0, attn_dp = 1, dcp = 1;
  int64_t input_len = 1024, output_len = 400, concurrency = 0, context = 0, kv_pool = 0, prefill_chunk = 8192;
  std::optional<double> gpu_price, reserve_gib;  // absent: the catalog's price, the estimated reserve
  double inter_node_gbps = 400, pue = 1.0;
  bool json = false, mtp = false, list_gpus = false;
};

int run_plan(const PlanArgs& a) {
  const std::vector<plan::GpuSpec> catalog =
      a.catalog.empty() ? plan::builtin_catalog() : plan::load_catalog(a.catalog);
  if (a.list_gpus) {
    for (const auto& g : catalog)
      std::printf("%-8s %6.0f GB  %5.2f TB/s  bf16 %6.0f  fp8 %6.0f  fp4 %6.0f TFLOP/s  %5.0f W  $%.2f/h\n  %s\n",
                  g.name.c_str(), static_cast<double>(g.hbm_visible_bytes) / 1e9, g.hbm_bw_bytes_s / 1e12,
                  g.bf16_flops / 1e12, g.fp8_flops / 1e12, g.fp4_flops / 1e12, g.board_watts, g.usd_per_gpu_hour,
                  g.source.c_str());
    return 0;
  }
  const plan::ResolvedModel model = plan::resolve_model(a.model);
  plan::PlanOptions base;
  base.weights = a.weights.empty() ? model.default_weights : plan::parse_weight_format(a.weights);
  base.kv_bytes_per_value = plan::parse_kv_dtype(a.kv);
  base.include_mtp = a.mtp;
  // Given values are checked, not read as "absent" (a negative price once meant the catalog's).
  KILN_CHECK(!a.reserve_gib || (*a.reserve_gib >= 0 && *a.reserve_gib <= 1e6), "--reserve-gib must be 0 to 1e6, got {}",
             a.reserve_gib.value_or(0));
  KILN_CHECK(!a.gpu_price || (*a.gpu_price >= 0 && *a.gpu_price <= 1e6), "--gpu-price must be 0 to 1e6 USD, got {}",
             a.gpu_price.value_or(0));
  base.reserve_bytes = a.reserve_gib ? *a.reserve_gib * 1024.0 * 1024.0 * 1024.0 : -1.0;
  base.prefill_chunk = a.prefill_chunk;
  base.usd_per_gpu_hour = a.gpu_price.value_or(-1.0);
  KILN_CHECK(a.inter_node_gbps > 0 && std::isfinite(a.inter_node_gbps), "--inter-node-gbps must be positive");
  base.inter_node_bytes_s = a.inter_node_gbps * 1e9 / 8.0;
  KILN_CHECK(a.pue >= 1.0 && a.pue <= 10, "--pue must be 1 to 10, got {}", a.pue);
  base.pue = a.pue;
  plan::Layout layout{a.gpus, a.nodes, a.tp, a.attn_dp, a.ep, a.dcp};
  plan::Workload wl{a.input_len, a.output_len, a.concurrency, a.context, a.kv_pool};

  if (a.compare.empty()) {
    KILN_CHECK(!a.gpu.empty(), "--gpu NAME is required (or --compare LIST); --list-gpus shows the catalog");
    const plan::GpuSpec& gpu = plan::find_gpu(catalog, a.gpu);
    const plan::Plan p = plan::make_plan(model.name, model.config, gpu, layout, wl, base);
    if (a.json)
      std::printf("%s\n", plan::plan_to_json(p).dump(2).c_str());
    else
      std::printf("%s", plan::format_plan(p, gpu).c_str());
    return p.fits ? 0 : kExitDoesNotFit;
  }
  std::vector<plan::Plan> plans;
  for (const auto& item : plan::parse_compare_list(a.compare)) {
    const plan::GpuSpec& gpu = plan::find_gpu(catalog, item.gpu);
    plan::Layout l = layout;
    // A layout given per item starts from its own GPU count, not from the command line's TP.
    if (item.gpus || item.nodes) {
      l.tp = 0;
      l.ep = 0;
    }
    l.gpus_per_node = item.gpus.value_or(l.gpus_per_node);
    l.nodes = item.nodes.value_or(item.gpus ? 1 : l.nodes);
    l.tp = item.tp.value_or(l.tp);
    l.ep = item.ep.value_or(l.ep);
    l.attn_dp = item.attn_dp.value_or(l.attn_dp);
    l.dcp = item.dcp.value_or(l.dcp);
    plan::PlanOptions o = base;
    o.weights = item.weights.value_or(o.weights);
    o.kv_bytes_per_value = item.kv_bytes_per_value.value_or(o.kv_bytes_per_value);
    o.usd_per_gpu_hour = item.usd_per_gpu_hour.value_or(o.usd_per_gpu_hour);
    plans.push_back(plan::make_plan(model.name, model.config, gpu, l, wl, o));
  }
  if (a.json) {
    nlohmann::json j = {{"model", model.name}, {"plans", nlohmann::json::array()}};
    for (const auto& p : plans) j["plans"].push_back(plan::plan_to_json(p));
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s: in %lld / out %lld tokens, context %lld\n", model.name.c_str(),
                static_cast<long long>(plans[0].workload.input_len),
                static_cast<long long>(plans[0].workload.output_len),
                static_cast<long long>(plans[0].workload.context));
    std::printf("%s", plan::format_compare(plans).c_str());
  }
  const bool any_fits = std::any_of(plans.begin(), plans.end(), [](const plan::Plan& p) { return p.fits; });
  return any_fits ? 0 : kExitDoesNotFit;
}

KILN_COMMAND(
    "plan", "Deployment planner: memory fit, throughput ceiling and cost of a model on GPUs", [](CLI::App& sub) {
      auto a = std::make_shared<PlanArgs>();
      sub.footer(
          "Exit status: 0 when the plan fits (with --compare: when at least one layout fits), 3 when it does not "
          "(the figures are then what it would give if it did), 1 on an error.");
      sub.add_option("--model", a->model,
                     "checkpoint directory, config.json, or preset (deepseek-v3, kimi-k2, "
                     "moonlight-16b-a3b, kimi-k3)");
      sub.add_option("--gpu", a->gpu, "catalog GPU name (H100, H200, B200, B300, MI300X, MI325X, MI355X)");
      sub.add_option("--gpus", a->gpus, "GPUs per node")->capture_default_str();
      sub.add_option("--nodes", a->nodes, "nodes")->capture_default_str();
      sub.add_option("--weights", a->weights,
                     "weight format: bf16, fp8, int4 (routed experts), mxfp4 (routed experts); "
                     "default: the checkpoint's");
      sub.add_option("--kv", a->kv, "KV cache dtype: bf16, fp8 (fp8_e4m3: the FP8 rows kiln serves, scales included)")
          ->capture_default_str();
      sub.add_option("--context", a->context, "tokens one sequence may hold (default input + output length)");
      sub.add_option("--kv-pool", a->kv_pool, "KV tokens the deployment must hold (default context x concurrency)");
      sub.add_option("--tp", a->tp, "attention tensor-parallel size (default GPUs / attn-dp)");
      sub.add_option("--ep", a->ep, "expert-parallel size (default all GPUs)");
      sub.add_option("--attn-dp", a->attn_dp, "attention data-parallel groups")->capture_default_str();
      sub.add_option("--dcp", a->dcp, "decode context parallelism (splits each sequence's KV)")->capture_default_str();
      sub.add_option("--input-len", a->input_len, "prompt tokens per request")->capture_default_str();
      sub.add_option("--output-len", a->output_len, "generated tokens per request")->capture_default_str();
      sub.add_option("--concurrency", a->concurrency, "concurrent sequences (default: as many as fit, at most 1024)");
      sub.add_option("--gpu-price", a->gpu_price, "USD per GPU-hour (default: the catalog's placeholder, not a quote)");
      sub.add_option("--reserve-gib", a->reserve_gib,
                     "per-GPU runtime + activation reserve in GiB (default: estimated)");
      sub.add_option("--prefill-chunk", a->prefill_chunk, "tokens per prefill chunk")->capture_default_str();
      sub.add_option("--inter-node-gbps", a->inter_node_gbps, "network per GPU across nodes, Gb/s")
          ->capture_default_str();
      sub.add_option("--pue", a->pue, "power usage effectiveness for power per token")->capture_default_str();
      sub.add_flag("--mtp", a->mtp, "also load the NextN/MTP layers");
      sub.add_option("--catalog", a->catalog, "hardware catalog JSON to use instead of the built-in one");
      sub.add_option("--compare", a->compare,
                     "side by side: GPU[:GPUS[xNODES]][:tp=..:ep=..:dp=..:dcp=..:weights=..:"
                     "kv=..:price=..],...");
      sub.add_flag("--list-gpus", a->list_gpus, "print the hardware catalog and exit");
      sub.add_flag("--json", a->json, "print JSON");
      return [a] { return run_plan(*a); };
    });

}  // namespace
}  // namespace kiln::cli
