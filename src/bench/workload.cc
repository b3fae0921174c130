#include "bench/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace kiln::bench {

WorkloadKind parse_workload_kind(const std::string& name) {
  if (name == "random") return WorkloadKind::kRandom;
  if (name == "dataset" || name == "jsonl" || name == "sharegpt") return WorkloadKind::kDataset;
  if (name == "shared-prefix") return WorkloadKind::kSharedPrefix;
  if (name == "long-prefill") return WorkloadKind::kLongPrefill;
  fail("--workload {}: expected random, dataset, shared-prefix or long-prefill", name);
}

const char* workload_kind_name(WorkloadKind k) {
  switch (k) {
    case WorkloadKind::kRandom: return "random";
    case WorkloadKind::kDataset: return "dataset";
    case WorkloadKind::kSharedPrefix: return "shared-prefix";
    case WorkloadKind::kLongPrefill: return "long-prefill";
  }
  return "?";
}

nlohmann::json to_json(const WorkloadSpec& s) {
  nlohmann::json j = {{"kind", workload_kind_name(s.kind)}, {"seed", s.seed}};
  switch (s.kind) {
    case WorkloadKind::kRandom:
      j.update({{"input_len", s.input_len}, {"output_len", s.output_len}, {"range_ratio", s.range_ratio}});
      break;
    case WorkloadKind::kDataset:
      j.update({{"dataset", s.dataset_path}, {"output_len_from_dataset", s.output_len_from_dataset}});
      if (!s.output_len_from_dataset) j["output_len"] = s.output_len;
      break;
    case WorkloadKind::kSharedPrefix:
      j.update({{"prefix_groups", s.prefix_groups},
                {"prefix_len", s.prefix_len},
                {"question_len", s.input_len},
                {"output_len", s.output_len},
                {"range_ratio", s.range_ratio}});
      break;
    case WorkloadKind::kLongPrefill: j.update({{"input_len", s.input_len}, {"output_len", s.output_len}}); break;
  }
  return j;
}

namespace {

std::string str_field(const nlohmann::json& o, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (o.contains(k) && o[k].is_string()) return o[k].get<std::string>();
  return {};
}

// One dataset entry -> (prompt, reply, fixed output length or -1). Understands ShareGPT
// ({"conversations": [{"from": "human", "value": ..}, {"from": "gpt", ..}]}), OpenAI-style
// {"messages": [{"role", "content"}]}, and flat {"prompt", "completion"|"response", "output_len"}.
bool parse_entry(const nlohmann::json& e, std::string& prompt, std::string& reply, int64_t& fixed_out) {
  if (!e.is_object()) return false;
  fixed_out = -1;
  for (const char* k : {"output_len", "max_tokens"})
    if (e.contains(k) && e[k].is_number_integer()) fixed_out = e[k].get<int64_t>();
  for (const char* k : {"conversations", "conversation", "messages"}) {
    if (!e.contains(k) || !e[k].is_array()) continue;
    const auto& turns = e[k];
    for (size_t i = 0; i < turns.size(); ++i) {
      const std::string who = str_field(turns[i], {"from", "role"});
      if (who != "human" && who != "user") continue;
      prompt = str_field(turns[i], {"value", "content"});
      if (i + 1 < turns.size()) reply = str_field(turns[i + 1], {"value", "content"});
      return !prompt.empty();
    }
    return false;
  }
  prompt = str_field(e, {"prompt", "text", "question"});
  reply = str_field(e, {"completion", "response", "answer", "output"});
  return !prompt.empty();
}

}  // namespace

Workload::Workload(WorkloadSpec spec, const PromptTokenizer& tok)
    : spec_(std::move(spec)), tok_(tok), rng_(spec_.seed) {
  KILN_CHECK(spec_.range_ratio >= 0 && spec_.range_ratio < 1, "--range-ratio must be in [0, 1), got {}",
             spec_.range_ratio);
  KILN_CHECK(spec_.output_len >= 1, "--output-len must be at least 1, got {}", spec_.output_len);
  if (spec_.kind != WorkloadKind::kDataset)
    KILN_CHECK(spec_.input_len >= 1, "--input-len must be at least 1, got {}", spec_.input_len);
  if (spec_.kind == WorkloadKind::kSharedPrefix) {
    KILN_CHECK(spec_.prefix_groups >= 1, "--prefix-groups must be at least 1, got {}", spec_.prefix_groups);
    KILN_CHECK(spec_.prefix_len >= 1, "--prefix-len must be at least 1, got {}", spec_.prefix_len);
    for (int64_t g = 0; g < spec_.prefix_groups; ++g) {
      prefixes_.push_back(tok_.random_text(spec_.prefix_len, rng_));
      prefix_tokens_.push_back(tok_.count(prefixes_.back()));
    }
  }
  if (spec_.kind == WorkloadKind::kDataset) {
    KILN_CHECK(!spec_.dataset_path.empty(), "--workload dataset needs --dataset FILE");
    std::ifstream f(spec_.dataset_path);
    KILN_CHECK(f.good(), "--dataset {}: cannot open the file", spec_.dataset_path);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string body = ss.str();
    std::vector<nlohmann::json> entries;
    const size_t first = body.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && body[first] == '[') {
      nlohmann::json arr = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
      KILN_CHECK(arr.is_array(), "--dataset {}: not a valid JSON array", spec_.dataset_path);
      for (auto& e : arr) entries.push_back(std::move(e));
    } else {
      std::istringstream lines(body);
      std::string line;
      int64_t lineno = 0;
      while (std::getline(lines, line)) {
        ++lineno;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        nlohmann::json e = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        KILN_CHECK(!e.is_discarded(), "--dataset {}: line {} is not valid JSON", spec_.dataset_path, lineno);
        entries.push_back(std::move(e));
      }
    }
    for (const auto& e : entries) {
      std::string prompt, reply;
      int64_t fixed_out = -1;
      if (!parse_entry(e, prompt, reply, fixed_out)) {
        ++skipped_;
        continue;
      }
      Prompt p;
      p.prompt_tokens = tok_.count(prompt);
      p.text = std::move(prompt);
      if (!spec_.output_len_from_dataset)
        p.max_tokens = spec_.output_len;
      else if (fixed_out > 0)
        p.max_tokens = fixed_out;
      else if (!reply.empty())
        p.max_tokens = std::max<int64_t>(1, tok_.count(reply));
      else
        p.max_tokens = spec_.output_len;
      dataset_.push_back(std::move(p));
    }
    KILN_CHECK(!dataset_.empty(), "--dataset {}: no entry with a user prompt ({} skipped)", spec_.dataset_path,
               skipped_);
    std::shuffle(dataset_.begin(), dataset_.end(), rng_);
  }
}

int64_t Workload::draw_len(int64_t len) {
  if (spec_.range_ratio <= 0) return len;
  // vLLM: randint(int(len * (1 - r)), int(len * (1 + r)) + 1), never below one token.
  const auto lo = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(len) * (1 - spec_.range_ratio)));
  const auto hi = std::max<int64_t>(lo, static_cast<int64_t>(static_cast<double>(len) * (1 + spec_.range_ratio)));
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
}

std::vector<Prompt> Workload::take(int64_t n) {
  std::vector<Prompt> out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i, ++taken_) {
    Prompt p;
    switch (spec_.kind) {
      case WorkloadKind::kDataset:
        if (cursor_ == dataset_.size()) {
          cursor_ = 0;
          ++wraps_;
        }
        p = dataset_[cursor_++];
        break;
      case WorkloadKind::kSharedPrefix: {
        // Interleave the groups so that concurrent requests land in different groups.
        p.group = taken_ % spec_.prefix_groups;
        p.system = prefixes_[static_cast<size_t>(p.group)];
        p.text = tok_.random_text(draw_len(spec_.input_len), rng_);
        p.prompt_tokens = prefix_tokens_[static_cast<size_t>(p.group)] + tok_.count(p.text);
        p.max_tokens = draw_len(spec_.output_len);
        break;
      }
      case WorkloadKind::kRandom:
      case WorkloadKind::kLongPrefill: {
        const int64_t in = spec_.kind == WorkloadKind::kRandom ? draw_len(spec_.input_len) : spec_.input_len;
        p.text = tok_.random_text(in, rng_);
        p.prompt_tokens = tok_.count(p.text);
        p.max_tokens = spec_.kind == WorkloadKind::kRandom ? draw_len(spec_.output_len) : spec_.output_len;
        break;
      }
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace kiln::bench
