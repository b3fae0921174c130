// The speculative-decoding flags (vLLM / SGLang spelling) shared by serve, generate and bench
// model, and the speculator they ask for.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "engine/engine.h"

namespace kiln::cli {

struct SpeculativeFlags {
  std::string algorithm;   // empty: off; draft, mtp (deepseek_mtp) or dspark
  std::string model;       // --speculative-model: the draft checkpoint (mtp: the MTP layer's, default --model; dspark:
                           // DeepSpec format)
  int64_t num_tokens = 4;  // K
  // How many of the K drafts each step verifies (engine/spec_policy.h).
  std::string policy = "adaptive";  // fixed | adaptive
  std::string policy_table;         // optional step-time table (JSON) to start from
  int64_t probe_interval = 64;      // steps before the mode not chosen is measured again
};
void add_speculative_options(CLI::App& sub, SpeculativeFlags& f);
// The flags alone (before any model loads): a clear error naming the bad one.
void check_speculative_flags(const SpeculativeFlags& f);
// Null when speculation is off; a clear error naming the bad flag otherwise.
// `target_dir`: the target's checkpoint, where mtp finds its layer unless --speculative-model says.
std::shared_ptr<Speculator> make_speculator(const SpeculativeFlags& f, const std::string& target_dir,
                                            DeepseekV3Model& target);

// The engine's policy settings from the flags.
SpecPolicyConfig spec_policy_config(const SpeculativeFlags& f);

// The kernel plan with speculation's own entries (drafter and verifier), logged once.
std::vector<std::pair<std::string, std::string>> with_speculation(std::vector<std::pair<std::string, std::string>> plan,
                                                                  const Speculator* s);

}  // namespace kiln::cli
