// `kiln serve`: the OpenAI-compatible HTTP front end over one Engine (DESIGN.md §1).
//
// Threads: cpp-httplib serves each connection on a thread of a fixed pool (ServerConfig::threads).
// A handler validates the request, tokenizes it, submits it to the engine and then only waits on
// its RequestStream, so HTTP threads never touch engine state. A streaming response holds its
// thread for the life of the stream; the pool is sized above the connection target (1,000
// streams), which costs a stack's worth of *virtual* memory per thread and little else, and
// requests past --max-pending-requests get 503 at once instead of queueing without bound.
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
#include "server/metrics.h"
#include "server/output_parser.h"
#include "server/protocol.h"
#include "server/tool_constraint.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
class Server;
struct Request;
struct Response;
class ContentReader;
}  // namespace httplib

namespace kiln::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;                        // empty: no auth
  std::string model_name;                     // what /v1/models lists and requests must name
  std::vector<std::string> model_aliases;     // also accepted in requests (e.g. the --model path)
  size_t max_body_bytes = 8u << 20;           // larger bodies get 413
  int threads = 1100;                         // HTTP worker threads (concurrent connections served)
  int64_t max_pending_requests = 1024;        // generation requests in flight; more get 503
  double shutdown_timeout_s = 30;             // SIGTERM: how long in-flight requests may finish
  ToolFormat tool_format = ToolFormat::None;  // how tool calls are written by the model
  bool reasoning = false;                     // split <think>...</think> into reasoning_content
  ProtocolLimits limits;
};

class Server {
 public:
  Server(Engine& engine, const tok::Tokenizer& tokenizer, std::optional<tok::ChatTemplate> chat_template,
         ServerConfig cfg);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (port 0: any free port); false when the address is taken.
  bool bind();
  int port() const { return port_; }
  // Serves until shutdown() finishes. Call after bind().
  void run();
  // Graceful stop (SIGTERM): new generation requests get 503, in-flight ones may finish until the
  // deadline, then are cancelled; then the listener closes and run() returns.
  void shutdown();

  Metrics& metrics() { return metrics_; }

 private:
  struct Job;  // one generation request (generate.cc)
  void routes();
  bool authorized(const httplib::Request& req, httplib::Response& res) const;
  void handle_generate(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& body,
                       bool chat);
  // The request body, at most cfg_.max_body_bytes however it is framed (throws ApiError 413/415).
  std::string read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& body) const;
  std::shared_ptr<Job> start_job(const ParsedRequest& p);
  void respond_json(const std::shared_ptr<Job>& job, httplib::Response& res);
  nlohmann::json json_body(Job& job);  // the finished job's response (or an error body)
  void respond_stream(const std::shared_ptr<Job>& job, httplib::Response& res);
  void job_finished();
  // tool_choice "required" / a named function: the grammar its choices must follow (null: none).
  std::shared_ptr<const ToolCallGrammar> tool_grammar(const ParsedRequest& p);
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
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  int listen_fd_ = -1;  // the listening socket, to widen its backlog

  std::once_flag vocab_once_;
  std::shared_ptr<const TokenVocab> vocab_;  // every token's bytes, built on first use

  std::atomic<bool> draining_{false};
  std::mutex mu_;
  std::condition_variable idle_;
  int64_t jobs_ = 0;                      // generation requests being answered, under mu_
  std::vector<std::weak_ptr<Job>> live_;  // for cancelling at the shutdown deadline, under mu_
};

}  // namespace kiln::server
