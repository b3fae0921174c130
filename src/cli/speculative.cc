#include "cli/speculative.h"

#include "core/error.h"
#include "core/log.h"
#include "spec/engine_speculator.h"

namespace kiln::cli {

void add_speculative_options(CLI::App& sub, SpeculativeFlags& f) {
  sub.add_option("--speculative-algorithm", f.algorithm,
                 "speculative decoding: draft (a separate draft model, --speculative-model), mtp / deepseek_mtp "
                 "(the checkpoint's own NextN layer) or dspark (a DeepSpec-format block drafter, "
                 "--speculative-model)");
  sub.add_option("--speculative-model", f.model,
                 "draft model checkpoint directory (same tokenizer as --model); for mtp, the checkpoint holding "
                 "the MTP layer (default: --model)");
  sub.add_option("--speculative-num-tokens", f.num_tokens, "draft tokens verified per step (K)")->capture_default_str();
  sub.add_option("--speculative-policy", f.policy,
                 "fixed: every step verifies K drafts per row; adaptive: K per row from its running acceptance, "
                 "and speculation off at batches where the measured step times say it does not pay")
      ->capture_default_str();
  sub.add_option("--speculative-policy-table", f.policy_table,
                 "adaptive policy: a step-time table (JSON: plain, verify, draft times by rows) to start from "
                 "instead of the prior; it is refined online");
  sub.add_option("--speculative-probe-interval", f.probe_interval,
                 "adaptive policy: decode steps before the mode not chosen (plain or speculative) is measured "
                 "again (doubling up to 16x while nothing changes)")
      ->capture_default_str();
}

SpecPolicyConfig spec_policy_config(const SpeculativeFlags& f) {
  SpecPolicyConfig c;
  c.mode = parse_spec_policy_mode(f.policy);
  c.table_path = f.policy_table;
  c.probe_interval = f.probe_interval;
  c.max_probe_interval = 16 * f.probe_interval;
  return c;
}

void check_speculative_flags(const SpeculativeFlags& f) {
  parse_spec_policy_mode(f.policy);
  // The policy's longest interval is 16x this one (spec_policy_config): bounded so that it cannot overflow.
  KILN_CHECK(f.probe_interval >= 1 && f.probe_interval <= (int64_t{1} << 40),
             "--speculative-probe-interval must be in [1, 2^40], got {}", f.probe_interval);
  if (f.algorithm.empty()) {
    KILN_CHECK(f.model.empty(), "--speculative-model needs --speculative-algorithm draft, mtp or dspark");
    return;
  }
  const bool mtp = f.algorithm == "mtp" || f.algorithm == "deepseek_mtp";
  KILN_CHECK(f.algorithm == "draft" || f.algorithm == "dspark" || mtp,
             "unknown --speculative-algorithm '{}' (draft, mtp, deepseek_mtp or dspark)", f.algorithm);
  KILN_CHECK(mtp || !f.model.empty(), "--speculative-algorithm {} needs --speculative-model DIR", f.algorithm);
  KILN_CHECK(f.num_tokens >= 1 && f.num_tokens <= 16, "--speculative-num-tokens must be in [1, 16], got {}",
             f.num_tokens);
}

std::shared_ptr<Speculator> make_speculator(const SpeculativeFlags& f, const std::string& target_dir,
                                            DeepseekV3Model& target) {
  check_speculative_flags(f);
  if (f.algorithm.empty()) return nullptr;
  return spec::make_speculator(f.algorithm, f.model.empty() ? target_dir : f.model, f.num_tokens, target);
}

std::vector<std::pair<std::string, std::string>> with_speculation(std::vector<std::pair<std::string, std::string>> plan,
                                                                  const Speculator* s) {
  if (!s) return plan;
  const std::pair<std::string, std::string> extra[] = {
      {"spec_draft", fmt::format("{}: the {}'s forward (the ops above), K={} steps batched over sequences", s->name(),
                                 std::string(s->name()) == "mtp"      ? "MTP layer"
                                 : std::string(s->name()) == "dspark" ? "block drafter (one block per step)"
                                                                      : "draft model",
                                 s->num_draft_tokens())},
      {"spec_verify", "host: exact verifier (spec/verifier.cc) on the verify rows' downloaded logits"}};
  for (const auto& [op, impl] : extra) {
    spdlog::info("  {:<14} {}", op, impl);
    plan.emplace_back(op, impl);
  }
  return plan;
}

}  // namespace kiln::cli
