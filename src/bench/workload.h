// Workloads: what prompts the benchmark sends and how many tokens it asks back.
//
//   random         prompts of `input_len` tokens made of random token ids (decoded with the model's
//                  tokenizer, so the server sees the intended length), outputs of `output_len`; both
//                  drawn uniformly from [len * (1 - range_ratio), len * (1 + range_ratio)] as vLLM's
//                  --random-range-ratio does. No two prompts share a prefix.
//   dataset        prompts from a ShareGPT-style file (JSON array or JSON lines); the output length is
//                  the reply's token count unless a fixed one is asked.
//   shared-prefix  `prefix_groups` groups, each with its own system prompt of `prefix_len` tokens;
//                  every request adds a fresh random question of `input_len` tokens (SGLang's
//                  generated-shared-prefix workload).
//   long-prefill   one cold prompt of `input_len` tokens at a time (e.g. 172k): prefill seconds and
//                  prefill tok/s.
//
// Every take() draws new prompts from one seeded stream, so successive sweep points never resend a
// prompt (a server's prefix cache cannot carry one point into the next) and the same seed and
// sequence of takes gives the same prompts.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench/prompt_tokenizer.h"

namespace kiln::bench {

enum class WorkloadKind { kRandom, kDataset, kSharedPrefix, kLongPrefill };

// "random", "dataset" (also "jsonl", "sharegpt"), "shared-prefix", "long-prefill"; throws otherwise.
WorkloadKind parse_workload_kind(const std::string& name);
const char* workload_kind_name(WorkloadKind k);

struct WorkloadSpec {
  WorkloadKind kind = WorkloadKind::kRandom;
  int64_t input_len = 1024;             // tokens per prompt (random, long-prefill) or per question (shared-prefix)
  int64_t output_len = 400;             // tokens asked per request (max_tokens)
  double range_ratio = 0.0;             // random: lengths uniform in len * [1 - r, 1 + r]; 0 <= r < 1
  std::string dataset_path;             // dataset: the file
  bool output_len_from_dataset = true;  // dataset: take the reply's length when the entry has one
  int64_t prefix_groups = 4;            // shared-prefix: number of distinct system prompts
  int64_t prefix_len = 512;             // shared-prefix: tokens per system prompt
  uint64_t seed = 0;                    // one seed for every random choice of the workload
};

nlohmann::json to_json(const WorkloadSpec& s);

// One request's prompt.
struct Prompt {
  std::string system;         // shared-prefix: the group's system prompt; empty otherwise
  std::string text;           // the user prompt (after `system` for the completions endpoint)
  int64_t prompt_tokens = 0;  // input tokens as the PromptTokenizer counts them (system + text)
  int64_t max_tokens = 0;     // output tokens asked for
  int64_t group = -1;         // shared-prefix: which system prompt; -1 otherwise
};

class Workload {
 public:
  // Loads the dataset (if any) and makes the shared prefixes. `tok` must outlive the Workload.
  Workload(WorkloadSpec spec, const PromptTokenizer& tok);
  // The next `n` prompts of the stream.
  std::vector<Prompt> take(int64_t n);
  const WorkloadSpec& spec() const { return spec_; }
  // Dataset: entries usable / skipped (no user turn) / times the stream wrapped around.
  int64_t dataset_size() const { return static_cast<int64_t>(dataset_.size()); }
  int64_t dataset_skipped() const { return skipped_; }
  int64_t dataset_wraps() const { return wraps_; }

 private:
  int64_t draw_len(int64_t len);
  WorkloadSpec spec_;
  const PromptTokenizer& tok_;
  std::mt19937_64 rng_;
  std::vector<Prompt> dataset_;        // dataset: every usable entry, shuffled once by the seed
  std::vector<std::string> prefixes_;  // shared-prefix: the groups' system prompts
  std::vector<int64_t> prefix_tokens_;
  size_t cursor_ = 0;
  int64_t taken_ = 0, skipped_ = 0, wraps_ = 0;
};

}  // namespace kiln::bench
