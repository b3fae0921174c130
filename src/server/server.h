// `kiln serve`: the OpenAI-compatible HTTP front end over one Engine (DESIGN.md §1).
//
// Threads: a few I/O threads (src/server/http) run every connection as a state machine, so an open
// connection or stream costs memory, not a thread. A request is validated, tokenized and submitted
// to the engine on the I/O thread that read it; its answer is then pulled from the engine's
// per-request streams when they signal output (RequestStream::on_output), so no thread waits on
// the engine. Requests past --max-pending-requests get 503 with Retry-After at once instead of
// queueing without bound.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/http/handler.h"
#include "server/metrics.h"
#include "server/output_parser.h"
#include "server/protocol.h"
#include "server/tool_constraint.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server {

namespace http {
class HttpServer;
}  // namespace http

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;                        // empty: no auth
  std::string model_name;                     // what /v1/models lists and requests must name
  std::vector<std::string> model_aliases;     // also accepted in requests (e.g. the --model path)
  size_t max_body_bytes = 8u << 20;           // larger bodies get 413
  int threads = 4;                            // HTTP I/O threads (every connection shares them)
  int64_t max_pending_requests = 1024;        // generation requests in flight; more get 503
  double shutdown_timeout_s = 30;             // SIGTERM: how long in-flight requests may finish
  ToolFormat tool_format = ToolFormat::None;  // how tool calls are written by the model
  bool reasoning = false;                     // split <think>...</think> into reasoning_content
  ProtocolLimits limits;
  std::chrono::milliseconds pull_interval{1000};  // http::Limits::pull_interval
};

class Server : public http::Handler {
 public:
  Server(Engine& engine, const tok::Tokenizer& tokenizer, std::optional<tok::ChatTemplate> chat_template,
         ServerConfig cfg);
  ~Server() override;  // stops the engine (Engine::stop) before closing the connections
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (port 0: any free port); false when the address is taken.
  bool bind();
  int port() const;
  // Serves until shutdown() finishes. Call after bind().
  void run();
  // Graceful stop (SIGTERM): new generation requests get 503, in-flight ones may finish until the
  // deadline, then are cancelled; then the listener closes and run() returns.
  void shutdown();

  Metrics& metrics() { return metrics_; }

 private:
  struct Job;  // one generation request (generate.cc)
  // http::Handler: routing and auth from the head, then the routes.
  std::optional<http::Response> screen(const http::Request& head) override;
  void handle(http::Request& req, http::Response& res) override;
  http::Response error(int status, const std::string& message) override;
  void answered(const http::Request& req, const http::Response& res) override;
  bool authorized(const http::Request& req, http::Response& res) const;
  void handle_generate(const http::Request& req, http::Response& res, bool chat);
  std::shared_ptr<Job> start_job(const ParsedRequest& p);
  void respond_json(const std::shared_ptr<Job>& job, http::Response& res);
  nlohmann::json json_body(Job& job);  // the finished job's response (or an error body)
  void respond_stream(const std::shared_ptr<Job>& job, http::Response& res);
  void job_finished();
  // tool_choice "required" / a named function: the grammar its choices must follow (null: none).
  std::shared_ptr<const ToolCallGrammar> tool_grammar(const ParsedRequest& p);
  // response_format json_object / json_schema: the grammar of one JSON object.
  std::shared_ptr<const ToolCallGrammar> json_grammar(const ParsedRequest& p);
  // Every token's bytes (built on first use) and the ids that end generation, its units.
  const TokenVocab& vocab();
  std::vector<int32_t> end_ids() const;
  void cancel_job(Job& job);

  Engine& engine_;
  tok::Tokenizer tok_;
  std::optional<tok::ChatTemplate> template_;
  ServerConfig cfg_;
  Metrics metrics_;
  size_t max_token_bytes_ = 1;  // the tokenizer's longest token, for judging prompts by their bytes
  std::unique_ptr<http::HttpServer> http_;

  std::once_flag vocab_once_;
  std::shared_ptr<const TokenVocab> vocab_;  // every token's bytes, built on first use

  std::atomic<bool> draining_{false};
  std::mutex mu_;
  std::condition_variable idle_;
  int64_t jobs_ = 0;                      // generation requests being answered, under mu_
  std::vector<std::weak_ptr<Job>> live_;  // for cancelling at the shutdown deadline, under mu_
};

}  // namespace kiln::server
