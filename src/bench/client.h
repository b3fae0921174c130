// The load generator: one thread drives every stream of a sweep point through libcurl's
// multi-socket interface on an epoll loop, so thousands of concurrent SSE streams cost one core at
// most (docs/results.md, "Load generator"). Requests go out at their arrival times, at most
// `max_concurrency` at once; each is timed from the moment it is handed to libcurl.
//
// Nothing here throws for a failed request: connection errors, HTTP errors, timeouts, error events
// and cut streams become records with an error_kind. Ctrl-C (request_stop) ends the run early with
// what was measured.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "bench/record.h"
#include "bench/workload.h"

namespace kiln::bench {

struct ClientConfig {
  std::string base_url;                  // http://host:port, with or without a trailing /v1
  std::string endpoint = "completions";  // "completions" (/v1/completions) or "chat" (/v1/chat/completions)
  std::string model;                     // the "model" field of every request
  std::string api_key;                   // sent as a bearer token when set
  bool ignore_eos = true;                // ask for exactly max_tokens (vLLM, SGLang and llama.cpp honour it)
  double temperature = 0.0;
  nlohmann::json extra_body = nlohmann::json::object();  // merged into every request body
  double request_timeout_s = 600;                        // whole request, connect to last byte
};

// "http://h:p/v1/" -> "http://h:p"; the endpoint paths are appended to this.
std::string normalize_base_url(const std::string& url);
std::string endpoint_path(const ClientConfig& c);
// The JSON body of one streaming request.
nlohmann::json request_body(const ClientConfig& c, const Prompt& p);

struct RunProgress {
  int64_t total = 0, launched = 0, completed = 0, failed = 0, in_flight = 0;
  int64_t token_events = 0;  // token events received so far
  double elapsed_s = 0;
};

struct RunOptions {
  int64_t max_concurrency = 0;                          // 0: no limit
  std::vector<double> send_at_s;                        // per prompt, from arrival_times(); empty: all at once
  std::function<void(const RunProgress&)> on_progress;  // about 5 times a second, and at the end
};

struct RunResult {
  std::vector<RequestRecord> records;  // one per request sent, in prompt order
  double duration_s = 0;               // first send to last completion
  int64_t max_in_flight = 0;           // most requests open at once
  double client_cpu_s = 0;             // CPU time of the driving thread (user + system)
  bool interrupted = false;
};

RunResult run_requests(const ClientConfig& cfg, const std::vector<Prompt>& prompts, const RunOptions& opt);

// GET /v1/models: the answer as JSON, or {"error": ...} when it failed.
nlohmann::json fetch_models(const std::string& base_url, const std::string& api_key, double timeout_s = 10);
// GET /metrics (Prometheus text); empty when the server has none or the request failed.
std::string fetch_metrics(const std::string& base_url, const std::string& api_key, double timeout_s = 10);

// Async-signal-safe: asks a running run_requests to stop; stays set until clear_stop().
void request_stop();
bool stop_requested();
void clear_stop();

// libcurl's version string, for the environment record.
std::string http_client_version();

}  // namespace kiln::bench
