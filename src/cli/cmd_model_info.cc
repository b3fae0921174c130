// `kiln model-info (--model DIR|CONFIG|PRESET | --config FILE) [--json]`: parameter counts, KV bytes
// per token and a per-layer summary, from the config alone (no weights are read). --model takes the
// same names as `kiln plan --model` (plan/presets.h), so one model name works everywhere.
#include <nlohmann/json.hpp>

#include <cstdio>

#include "cli/command.h"
#include "core/error.h"
#include "model/config.h"
#include "model/weight_layout.h"
#include "plan/presets.h"
#include "plan/weight_bytes.h"

namespace kiln::cli {
namespace {

struct ModelInfoArgs {
  std::string model_dir, config_file;
  bool json = false;
};

std::string human(double n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  int u = 0;
  while (n >= 1000.0 && u < 4) {
    n /= 1000.0;
    ++u;
  }
  return fmt::format("{:.2f}{}", n, units[u]);
}

int run_model_info(const ModelInfoArgs& a) {
  KILN_CHECK(a.model_dir.empty() != a.config_file.empty(),
             "model-info needs exactly one of --model DIR|CONFIG|PRESET or --config FILE");
  const plan::ResolvedModel m = a.config_file.empty()
                                    ? plan::resolve_model(a.model_dir)
                                    : plan::ResolvedModel{a.config_file, load_model_config(a.config_file), {}};
  const ModelConfig& c = m.config;
  // Weight bytes as the checkpoint ships them (quantized data + scales, in its own block sizes) and
  // what loading adds (plan/weight_bytes.h), on one GPU.
  const plan::WeightFormat fmt = a.config_file.empty() ? m.default_weights : plan::checkpoint_format(c);
  const plan::WeightTotals wt = plan::weight_totals(c, fmt, 1, 1, false);
  ParamCounts p = count_params(c);
  int64_t kv = kv_bytes_per_token(c, 2);
  int64_t dense_layers = std::min(c.first_k_dense_replace, c.num_hidden_layers);
  if (a.json) {
    nlohmann::json j = {{"total_params", p.total},
                        {"active_params", p.active},
                        {"mtp_params", p.mtp},
                        {"routed_expert_params", p.routed_expert},
                        {"embedding_params", p.embedding},
                        {"kv_bytes_per_token", kv},
                        {"kv_bytes_per_token_fp8", kv_bytes_per_token(c, 1)},  // --kv-cache-dtype fp8_e4m3
                        {"kv_values_per_token_per_layer", c.kv_row_dim()},
                        {"dense_layers", dense_layers},
                        {"moe_layers", c.num_hidden_layers - dense_layers},
                        {"softmax_scale", c.softmax_scale()},
                        {"weight_format", plan::weight_format_name(fmt)},
                        {"weight_bytes", wt.bytes},
                        {"weight_scale_bytes", wt.scale_bytes},
                        {"loaded_weight_bytes", static_cast<int64_t>(wt.bytes + wt.loaded_extra_bytes_per_gpu)},
                        {"config", model_config_to_json(c)}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("model_type        %s\n", c.model_type.c_str());
  std::printf("total params      %s (%lld)\n", human(static_cast<double>(p.total)).c_str(),
              static_cast<long long>(p.total));
  std::printf("active per token  %s (%lld)\n", human(static_cast<double>(p.active)).c_str(),
              static_cast<long long>(p.active));
  if (p.mtp) std::printf("NextN/MTP params  %s\n", human(static_cast<double>(p.mtp)).c_str());
  std::printf("weights           %s bytes as %s (scales %s), %s as loaded (+ W_uk^T, stacked scale rows)\n",
              human(static_cast<double>(wt.bytes)).c_str(), plan::weight_format_name(fmt),
              human(static_cast<double>(wt.scale_bytes)).c_str(),
              human(static_cast<double>(wt.bytes) + wt.loaded_extra_bytes_per_gpu).c_str());
  std::printf("KV per token      %lld bytes in bf16 (%lld layers x %lld values: %lld c_kv + %lld k_pe)\n",
              static_cast<long long>(kv), static_cast<long long>(c.num_hidden_layers),
              static_cast<long long>(c.kv_row_dim()), static_cast<long long>(c.kv_lora_rank),
              static_cast<long long>(c.qk_rope_head_dim));
  std::printf("                  %lld bytes with --kv-cache-dtype fp8_e4m3 (e4m3 c_kv + a scale per 128, bf16 k_pe)\n",
              static_cast<long long>(kv_bytes_per_token(c, 1)));
  std::printf("attention         %lld heads, q_lora %s, qk %lld+%lld, v %lld, softmax scale %.6g\n",
              static_cast<long long>(c.num_attention_heads),
              c.q_lora_rank ? std::to_string(c.q_lora_rank).c_str() : "none",
              static_cast<long long>(c.qk_nope_head_dim), static_cast<long long>(c.qk_rope_head_dim),
              static_cast<long long>(c.v_head_dim), c.softmax_scale());
  std::printf("rope              %s, theta %g%s\n", c.rope.type.c_str(), c.rope.theta,
              c.rope_interleave ? ", interleaved pairs" : ", NeoX halves");
  std::printf(
      "layers            %lld dense (MLP %lld) + %lld MoE (%lld routed x %lld, top-%lld, %lld shared, "
      "groups %lld/%lld)\n",
      static_cast<long long>(dense_layers), static_cast<long long>(c.intermediate_size),
      static_cast<long long>(c.num_hidden_layers - dense_layers), static_cast<long long>(c.n_routed_experts),
      static_cast<long long>(c.moe_intermediate_size), static_cast<long long>(c.num_experts_per_tok),
      static_cast<long long>(c.n_shared_experts), static_cast<long long>(c.topk_group),
      static_cast<long long>(c.n_group));
  return 0;
}

KILN_COMMAND("model-info", "Parameter counts, KV bytes per token and layer summary of a model", [](CLI::App& sub) {
  auto a = std::make_shared<ModelInfoArgs>();
  std::string presets;
  for (const auto& p : plan::model_presets()) presets += (presets.empty() ? "" : ", ") + p.name;
  sub.add_option("--model", a->model_dir,
                 "checkpoint directory holding config.json, a config file, or a preset (" + presets + ")");
  sub.add_option("--config", a->config_file, "a config.json file");
  sub.add_flag("--json", a->json, "print JSON");
  return [a] { return run_model_info(*a); };
});

}  // namespace
}  // namespace kiln::cli
