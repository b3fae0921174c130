// bench/metrics.h: each figure from hand-made records, as vLLM and SGLang define it.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include "bench/metrics.h"

namespace kiln::bench {
namespace {

RequestRecord ok(double start_s, std::vector<double> events_ms, double e2e_ms, int64_t prompt, int64_t usage_out) {
  RequestRecord r;
  r.success = true;
  r.start_s = start_s;
  r.event_ms = std::move(events_ms);
  r.ttft_ms = r.event_ms.front();
  r.e2e_ms = e2e_ms;
  r.prompt_tokens = prompt;
  r.usage_completion_tokens = usage_out;
  return r;
}

RequestRecord bad(const std::string& kind) {
  RequestRecord r;
  r.error_kind = kind;
  r.error = "detail of " + kind;
  r.e2e_ms = 5;
  return r;
}

TEST(BenchMetrics, FiguresFromRecords) {
  std::vector<RequestRecord> recs = {ok(0.0, {100, 110, 120, 130}, 130, 10, 4),  // TTFT 100, TPOT (130-100)/3 = 10
                                     ok(0.5, {200, 230, 260}, 260, 20, 3),       // TTFT 200, TPOT 60/2 = 30
                                     ok(1.0, {50}, 50, 30, 1),                   // one token: no TPOT, no ITL
                                     bad("http_500"),
                                     bad("http_500"),
                                     bad("timeout"),
                                     bad("interrupted")};
  count_tokens(recs, nullptr);
  PointSummary s = summarize(recs, /*duration_s=*/2.0, CostSpec{}, /*max_in_flight=*/3, /*client_cpu_s=*/0.5);
  EXPECT_EQ(s.num_prompts, 7);
  EXPECT_EQ(s.completed, 3);
  EXPECT_EQ(s.failed, 3);
  EXPECT_EQ(s.interrupted, 1);
  EXPECT_EQ(s.errors.at("http_500"), 2);
  EXPECT_EQ(s.errors.at("timeout"), 1);
  EXPECT_EQ(s.error_examples.at("timeout"), "detail of timeout");
  EXPECT_EQ(s.total_input_tokens, 60);
  EXPECT_EQ(s.total_output_tokens, 8);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(s.input_tok_s, 30.0);
  EXPECT_DOUBLE_EQ(s.output_tok_s, 4.0);
  EXPECT_DOUBLE_EQ(s.total_tok_s, 34.0);
  EXPECT_DOUBLE_EQ(s.ttft_ms.mean, (100 + 200 + 50) / 3.0);
  EXPECT_DOUBLE_EQ(s.ttft_ms.median, 100);
  EXPECT_DOUBLE_EQ(s.tpot_ms.mean, 20);
  EXPECT_EQ(s.tpot_ms.count, 2);
  EXPECT_DOUBLE_EQ(s.per_stream_decode_tok_s, 50);  // 1000 / 20 ms
  // ITL pooled: 10, 10, 10, 30, 30.
  EXPECT_EQ(s.itl_ms.count, 5);
  EXPECT_DOUBLE_EQ(s.itl_ms.mean, 18);
  EXPECT_DOUBLE_EQ(s.itl_ms.median, 10);
  EXPECT_DOUBLE_EQ(s.e2e_ms.max, 260);
  EXPECT_DOUBLE_EQ(s.concurrency_achieved, (0.13 + 0.26 + 0.05) / 2.0);
  EXPECT_EQ(s.max_in_flight, 3);
  EXPECT_DOUBLE_EQ(s.client_cpu_utilization, 0.25);
  // Token times 0.10..0.13 s, 0.70..0.76 s and 1.05 s: all 8 fall inside [0.1, 1.1).
  EXPECT_DOUBLE_EQ(s.peak_output_tok_s, 8.0);
}

TEST(BenchMetrics, TokenCountsPreferUsageThenTokenizerThenEvents) {
  struct WordCounter final : PromptTokenizer {
    std::string describe() const override { return "words"; }
    bool exact() const override { return true; }
    std::string random_text(int64_t, std::mt19937_64&) const override { return {}; }
    int64_t count(std::string_view t) const override {
      int64_t n = 0;
      for (char c : t) n += c == ' ';
      return n;
    }
  } words;
  RequestRecord with_usage = ok(0, {1, 2}, 3, 7, 9);
  with_usage.usage_prompt_tokens = 70;
  RequestRecord no_usage = ok(0, {1, 2}, 3, 7, -1);
  no_usage.text = " a b c";
  std::vector<RequestRecord> recs = {with_usage, no_usage};
  count_tokens(recs, &words);
  EXPECT_EQ(recs[0].output_tokens, 9);
  EXPECT_EQ(recs[0].prompt_tokens, 70);
  EXPECT_EQ(recs[0].output_source, TokenSource::kUsage);
  EXPECT_EQ(recs[1].output_tokens, 3);
  EXPECT_EQ(recs[1].prompt_tokens, 7);
  EXPECT_EQ(recs[1].output_source, TokenSource::kTokenizer);
  // An approximate tokenizer is not trusted for counting: events stand in.
  std::vector<RequestRecord> recs2 = {no_usage};
  auto approx = make_approximate_tokenizer();
  count_tokens(recs2, approx.get());
  EXPECT_EQ(recs2[0].output_tokens, 2);
  EXPECT_EQ(recs2[0].output_source, TokenSource::kEvents);
}

TEST(BenchMetrics, RecordJsonHasTheItls) {
  RequestRecord r = ok(0.25, {100, 110.5, 130}, 131, 10, 3);
  r.output_tokens = 3;
  nlohmann::json j = to_json(r, 1);
  EXPECT_EQ(j["point"], 1);
  EXPECT_EQ(j["itl_ms"], (nlohmann::json{10.5, 19.5}));
  EXPECT_EQ(j["ttft_ms"], 100);
  EXPECT_EQ(j["usage_completion_tokens"], 3);
  EXPECT_FALSE(j.contains("error_kind"));
  EXPECT_EQ(to_json(bad("timeout"), 0)["error_kind"], "timeout");
}

TEST(BenchMetrics, EnginePhasesFromAKilnMetricsPage) {
  const std::string page =
      "# HELP kiln_engine_steps_total Engine steps\n# TYPE kiln_engine_steps_total counter\n"
      "kiln_engine_steps_total 40\n"
      "kiln_engine_phase_seconds_total{phase=\"schedule\"} 0.5\n"
      "kiln_engine_phase_seconds_total{phase=\"forward\"} 8\n"
      "kiln_engine_phase_seconds_total{phase=\"post\"} 1.25\n"
      "kiln_engine_device_busy_seconds_total 7.5\n"
      "kiln_kv_blocks_total 100\n";
  const auto before = parse_engine_phases(page);
  ASSERT_TRUE(before.has_value());
  EXPECT_DOUBLE_EQ(before->steps, 40);
  EXPECT_DOUBLE_EQ(before->forward_s, 8);
  EXPECT_DOUBLE_EQ(before->post_s, 1.25);
  EXPECT_DOUBLE_EQ(before->device_busy_s, 7.5);
  std::string later = page;
  later.replace(later.find("} 8"), 3, "} 20");
  later.replace(later.find("total 40"), 8, "total 70");
  const auto d = engine_phases_between(before, parse_engine_phases(later));
  ASSERT_TRUE(d.has_value());
  EXPECT_DOUBLE_EQ(d->forward_s, 12);
  EXPECT_DOUBLE_EQ(d->steps, 30);
  EXPECT_DOUBLE_EQ(d->schedule_s, 0);
  // Another server's page, an empty one, or a failed fetch: no engine figures.
  EXPECT_FALSE(parse_engine_phases("vllm:num_requests_running 3\n# kiln_engine_steps_total 4\n").has_value());
  EXPECT_FALSE(parse_engine_phases("").has_value());
  EXPECT_FALSE(engine_phases_between(before, std::nullopt).has_value());
}

TEST(BenchMetrics, SpeculativeDecodingCountersFromAKilnMetricsPage) {
  auto page = [](int verifies, int drafted, int accepted, double draft_s) {
    return fmt::format(
        "kiln_engine_steps_total 10\nkiln_spec_decode_verifies_total {}\nkiln_spec_decode_draft_tokens_total {}\n"
        "kiln_spec_decode_accepted_tokens_total {}\nkiln_spec_decode_acceptance_rate 0.5\n"
        "kiln_spec_decode_seconds_total{{phase=\"draft\"}} {}\nkiln_spec_decode_seconds_total{{phase=\"verify\"}} 3\n",
        verifies, drafted, accepted, draft_s);
  };
  const auto d =
      engine_phases_between(parse_engine_phases(page(10, 40, 20, 1)), parse_engine_phases(page(30, 120, 50, 2.5)));
  ASSERT_TRUE(d.has_value());
  EXPECT_DOUBLE_EQ(d->spec_verifies, 20);
  EXPECT_DOUBLE_EQ(d->spec_draft_tokens, 80);
  EXPECT_DOUBLE_EQ(d->spec_accepted_tokens, 30);
  EXPECT_DOUBLE_EQ(d->spec_draft_s, 1.5);
  EXPECT_DOUBLE_EQ(d->spec_verify_s, 0);
  PointSummary s;
  s.engine = d;
  const nlohmann::json j = to_json(s)["engine"]["speculative"];
  EXPECT_DOUBLE_EQ(j["mean_accepted_length"].get<double>(), 2.5);  // (30 accepted + 20 final tokens) / 20
  EXPECT_DOUBLE_EQ(j["acceptance_rate"].get<double>(), 30.0 / 80.0);
}

}  // namespace
}  // namespace kiln::bench
