// bench/workload.h, bench/arrivals.h and the prompt tokenizers: lengths, seeds, no repeated
// prompts across takes, shared prefixes, dataset parsing, arrival statistics.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <unistd.h>

#include "bench/arrivals.h"
#include "bench/workload.h"
#include "core/error.h"

namespace kiln::bench {
namespace {

TEST(BenchWorkload, ApproximateTokenizerHitsTheLength) {
  auto tok = make_approximate_tokenizer();
  std::mt19937_64 rng(1);
  for (int64_t n : {0, 1, 2, 3, 7, 100, 1024, 4097}) {
    const std::string t = tok->random_text(n, rng);
    EXPECT_EQ(tok->count(t), n) << t;
  }
  EXPECT_FALSE(tok->exact());
}

TEST(BenchWorkload, RandomLengthsSeedsAndFreshPrompts) {
  auto tok = make_approximate_tokenizer();
  WorkloadSpec spec;
  spec.input_len = 100;
  spec.output_len = 40;
  spec.range_ratio = 0.5;
  spec.seed = 7;
  Workload a(spec, *tok), b(spec, *tok);
  const auto first = a.take(50), again = b.take(50), second = a.take(50);
  std::set<std::string> seen;
  std::set<int64_t> in_lens;
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i].text, again[i].text) << "same seed, same prompts";
    EXPECT_GE(first[i].prompt_tokens, 50);
    EXPECT_LE(first[i].prompt_tokens, 150);
    EXPECT_EQ(first[i].prompt_tokens, tok->count(first[i].text));
    EXPECT_GE(first[i].max_tokens, 20);
    EXPECT_LE(first[i].max_tokens, 60);
    in_lens.insert(first[i].prompt_tokens);
    // No shared prefixes: the first 40 bytes of every prompt differ, within and across takes.
    EXPECT_TRUE(seen.insert(first[i].text.substr(0, 40)).second);
    EXPECT_TRUE(seen.insert(second[i].text.substr(0, 40)).second);
  }
  EXPECT_GT(in_lens.size(), 10u) << "lengths spread over the range";
  spec.seed = 8;
  EXPECT_NE(Workload(spec, *tok).take(1)[0].text, first[0].text);
  spec.range_ratio = 0;
  for (const auto& p : Workload(spec, *tok).take(5)) {
    EXPECT_EQ(p.prompt_tokens, 100);
    EXPECT_EQ(p.max_tokens, 40);
  }
  spec.range_ratio = 1.0;
  EXPECT_THROW(Workload(spec, *tok), kiln::Error);
}

TEST(BenchWorkload, SharedPrefixGroups) {
  auto tok = make_approximate_tokenizer();
  WorkloadSpec spec;
  spec.kind = parse_workload_kind("shared-prefix");
  spec.prefix_groups = 3;
  spec.prefix_len = 64;
  spec.input_len = 16;
  spec.output_len = 8;
  Workload w(spec, *tok);
  const auto ps = w.take(9);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(ps[i].group, static_cast<int64_t>(i % 3));
    EXPECT_EQ(ps[i].system, ps[i % 3].system);
    EXPECT_EQ(ps[i].prompt_tokens, 64 + 16);
    if (i >= 3) {
      EXPECT_NE(ps[i].text, ps[i - 3].text) << "each question is fresh";
    }
  }
  EXPECT_NE(ps[0].system, ps[1].system);
  EXPECT_EQ(w.take(1)[0].system, ps[0].system) << "the prefixes stay across takes (cache hits are the point)";
}

TEST(BenchWorkload, LongPrefill) {
  auto tok = make_approximate_tokenizer();
  WorkloadSpec spec;
  spec.kind = WorkloadKind::kLongPrefill;
  spec.input_len = 172000;
  spec.output_len = 1;
  Workload w(spec, *tok);
  const auto p = w.take(1);
  EXPECT_EQ(p[0].prompt_tokens, 172000);
  EXPECT_EQ(p[0].max_tokens, 1);
  EXPECT_NE(w.take(1)[0].text.substr(0, 100), p[0].text.substr(0, 100)) << "every long prompt is cold";
}

TEST(BenchWorkload, DatasetFormats) {
  auto tok = make_approximate_tokenizer();
  const auto dir = std::filesystem::temp_directory_path() / ("kiln_bench_ds_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const auto jsonl = (dir / "d.jsonl").string(), arr = (dir / "d.json").string();
  {
    std::ofstream f(jsonl);
    f << R"({"conversations":[{"from":"human","value":"12345678"},{"from":"gpt","value":"1234567890123456"}]})"
      << "\n\n"
      << R"({"messages":[{"role":"system","content":"sys"},{"role":"user","content":"abcd"}]})"
      << "\n"
      << R"({"prompt":"hello there","output_len":3})"
      << "\n"
      << R"({"conversations":[{"from":"gpt","value":"no human turn"}]})"
      << "\n";
    std::ofstream g(arr);
    g << R"([{"conversations":[{"from":"human","value":"abcdefgh"},{"from":"gpt","value":"abcd"}]}])";
  }
  WorkloadSpec spec;
  spec.kind = parse_workload_kind("jsonl");
  spec.dataset_path = jsonl;
  spec.output_len = 50;
  Workload w(spec, *tok);
  EXPECT_EQ(w.dataset_size(), 3);
  EXPECT_EQ(w.dataset_skipped(), 1);
  std::map<std::string, int64_t> out_len;
  for (const auto& p : w.take(3)) out_len[p.text] = p.max_tokens;
  EXPECT_EQ(out_len.at("12345678"), 4);  // the reply's length: 16 bytes
  EXPECT_EQ(out_len.at("abcd"), 50);     // no reply: --output-len
  EXPECT_EQ(out_len.at("hello there"), 3);
  w.take(1);
  EXPECT_EQ(w.dataset_wraps(), 1);
  spec.output_len_from_dataset = false;
  for (const auto& p : Workload(spec, *tok).take(3)) EXPECT_EQ(p.max_tokens, 50);
  spec.dataset_path = arr;
  spec.output_len_from_dataset = true;
  const auto a = Workload(spec, *tok).take(1);
  EXPECT_EQ(a[0].text, "abcdefgh");
  EXPECT_EQ(a[0].prompt_tokens, 2);
  EXPECT_EQ(a[0].max_tokens, 1);
  spec.dataset_path = (dir / "missing.jsonl").string();
  EXPECT_THROW(Workload(spec, *tok), kiln::Error);
  std::filesystem::remove_all(dir);
}

TEST(BenchWorkload, ModelTokenizerMakesExactLengths) {
  const std::string dir = std::string(KILN_TEST_DATA) + "/../../models/kiln-tiny";
  if (!std::filesystem::exists(dir + "/tokenizer.json")) GTEST_SKIP() << "needs models/kiln-tiny/tokenizer.json";
  std::unique_ptr<PromptTokenizer> tok;
  try {
    tok = load_prompt_tokenizer(dir);
  } catch (const kiln::Error& e) {
    GTEST_SKIP() << e.what();
  }
  EXPECT_TRUE(tok->exact());
  std::mt19937_64 rng(3);
  for (int64_t n : {1, 16, 333, 1024}) {
    const std::string t = tok->random_text(n, rng);
    EXPECT_NEAR(static_cast<double>(tok->count(t)), static_cast<double>(n), 1.0) << t.substr(0, 80);
  }
}

TEST(BenchArrivals, PoissonAndBurstiness) {
  EXPECT_EQ(arrival_times(5, INFINITY, 1.0, 1), std::vector<double>(5, 0.0));
  auto cv = [](const std::vector<double>& t) {
    std::vector<double> gaps;
    for (size_t i = 1; i < t.size(); ++i) gaps.push_back(t[i] - t[i - 1]);
    double mean = 0, sq = 0;
    for (double g : gaps) mean += g;
    mean /= static_cast<double>(gaps.size());
    for (double g : gaps) sq += (g - mean) * (g - mean);
    return std::pair{mean, std::sqrt(sq / static_cast<double>(gaps.size())) / mean};
  };
  const auto poisson = arrival_times(20001, 10.0, 1.0, 42);
  EXPECT_EQ(poisson.front(), 0.0);
  EXPECT_TRUE(std::is_sorted(poisson.begin(), poisson.end()));
  auto [mean, cv1] = cv(poisson);
  EXPECT_NEAR(mean, 0.1, 0.005);  // 1 / rate
  EXPECT_NEAR(cv1, 1.0, 0.05);    // exponential gaps
  auto [mean_b, cv_bursty] = cv(arrival_times(20001, 10.0, 0.25, 42));
  EXPECT_NEAR(mean_b, 0.1, 0.01);
  EXPECT_NEAR(cv_bursty, 2.0, 0.15);  // gamma: cv = 1 / sqrt(shape)
  EXPECT_EQ(arrival_times(100, 3.0, 1.0, 9), arrival_times(100, 3.0, 1.0, 9));
  EXPECT_NE(arrival_times(100, 3.0, 1.0, 9), arrival_times(100, 3.0, 1.0, 10));
}

}  // namespace
}  // namespace kiln::bench
