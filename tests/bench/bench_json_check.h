// What every `kiln bench serve --out` file must hold, checked the same way against the fake server
// and against `kiln serve`.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

namespace kiln::bench::test {

inline void expect_distribution(const nlohmann::json& d, const std::string& name) {
  SCOPED_TRACE(name);
  ASSERT_TRUE(d.is_object());
  for (const char* k : {"mean", "median", "p90", "p99"}) {
    ASSERT_TRUE(d.contains(k)) << k;
    EXPECT_TRUE(d[k].is_number()) << k;
  }
  EXPECT_LE(d["median"].get<double>(), d["p99"].get<double>());
}

// `points`: sweep points expected; `requests`: records expected per point; `max_tokens`: asked per
// request (ignore_eos makes the server produce exactly that many).
inline void expect_well_formed(const nlohmann::json& j, size_t points, int64_t requests, int64_t max_tokens) {
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["format"], "kiln-bench-serve/1");
  EXPECT_EQ(j["interrupted"], false);
  ASSERT_TRUE(j["summary"].is_array());
  ASSERT_EQ(j["summary"].size(), points);
  for (const auto& s : j["summary"]) {
    for (const char* k :
         {"concurrency", "completed", "failed", "per_stream_decode_tok_s", "output_tok_s", "peak_output_tok_s",
          "output_tok_s_per_gpu", "output_tok_s_per_usd_gpu_hour", "usd_per_million_output_tokens",
          "request_throughput", "input_tok_s", "total_tok_s", "concurrency_achieved", "duration_s"})
      EXPECT_TRUE(s.contains(k)) << k;
    for (const char* k : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"}) expect_distribution(s[k], k);
    EXPECT_EQ(s["completed"].get<int64_t>() + s["failed"].get<int64_t>(), requests);
    EXPECT_GT(s["output_tok_s"].get<double>(), 0);
    EXPECT_GE(s["peak_output_tok_s"].get<double>(), 0);
    EXPECT_NEAR(s["per_stream_decode_tok_s"].get<double>(), 1000.0 / s["tpot_ms"]["mean"].get<double>(), 1e-6);
  }
  ASSERT_TRUE(j["requests"].is_array());
  EXPECT_EQ(j["requests"].size(), points * static_cast<size_t>(requests));
  for (const auto& r : j["requests"]) {
    if (!r["success"].get<bool>()) continue;
    // TTFT < E2E for every request, and the token counts are the server's usage.
    EXPECT_LT(r["ttft_ms"].get<double>(), r["e2e_ms"].get<double>());
    EXPECT_GT(r["ttft_ms"].get<double>(), 0);
    ASSERT_TRUE(r["usage_completion_tokens"].is_number()) << r.dump();
    EXPECT_EQ(r["output_tokens"], r["usage_completion_tokens"]);
    EXPECT_EQ(r["output_tokens_source"], "usage");
    EXPECT_EQ(r["output_tokens"].get<int64_t>(), max_tokens);
    EXPECT_EQ(r["itl_ms"].size() + 1, r["token_events"].get<size_t>());
  }
  EXPECT_TRUE(j["server"]["models"].contains("data")) << j["server"]["models"].dump();
  EXPECT_TRUE(j["workload"].contains("kind"));
  EXPECT_TRUE(j["environment"].contains("http_client"));
  EXPECT_TRUE(j["environment"]["argv"].is_array());
}

inline void expect_chart(const std::string& svg, size_t points) {
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u) << svg.substr(0, 100);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  size_t circles = 0;
  for (size_t p = 0; (p = svg.find("class=\"point", p)) != std::string::npos; ++p) ++circles;
  EXPECT_EQ(circles, points);
  EXPECT_NE(svg.find("class=\"point pareto\""), std::string::npos);
}

}  // namespace kiln::bench::test
