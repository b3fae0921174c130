// Server metrics in the Prometheus text format (GET /metrics). HTTP threads record into atomics;
// engine figures come from Engine::stats(), a snapshot the engine loop publishes, so rendering
// never touches engine state (DESIGN.md §1).
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace kiln::server {

// A fixed-bucket histogram of seconds.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double seconds);
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<std::atomic<uint64_t>> counts_;  // [bounds + 1], the last is +Inf
  std::atomic<uint64_t> sum_us_{0};
};

class Metrics {
 public:
  Metrics();
  void request_done(const std::string& endpoint, int status);
  void tokens(int64_t prompt, int64_t generated);
  Histogram ttft, itl, e2e;

  std::atomic<int64_t> inflight{0};  // requests submitted to the engine and not yet answered

  // The kernel plan becomes the labels of kiln_kernel_plan_info (one series per op).
  void set_kernel_plan(std::vector<std::pair<std::string, std::string>> plan) { plan_ = std::move(plan); }
  std::string render(const EngineStats& s, const std::string& model) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::atomic<int64_t> prompt_tokens_{0}, generated_tokens_{0};
  std::vector<std::pair<std::string, std::string>> plan_;
};

}  // namespace kiln::server
