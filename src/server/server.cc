// Routing, auth, error bodies, lifecycle. The generation endpoints live in generate.cc, the wire
// in src/server/http.
#include "server/server.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "server/http/http_server.h"

namespace kiln::server {
namespace {

using nlohmann::json;

void send_json(http::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", "application/json");
}

void send_error(http::Response& res, const ApiError& e) {
  if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
  // Overload and shutdown are passing: say when to come back (RFC 9110 10.2.3).
  if (e.status == 503 || e.status == 429) res.set_header("Retry-After", "1");
  send_json(res, e.status, error_body(e));
}

// Compares without an early exit, so the key cannot be guessed a byte at a time from timings.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0;
}

const std::set<std::string>& known_paths() {
  static const std::set<std::string> known = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health",
                                              "/metrics"};
  return known;
}

bool is_model_path(const std::string& path) {
  return path.rfind("/v1/models/", 0) == 0 && path.size() > 11;
}

bool is_generate(const http::Request& r) {
  return r.method == "POST" && (r.path == "/v1/chat/completions" || r.path == "/v1/completions");
}

bool is_get_route(const http::Request& r) {
  return r.method == "GET" &&
         (r.path == "/health" || r.path == "/v1/models" || r.path == "/metrics" || is_model_path(r.path));
}

// An I/O thread per core is plenty for an event loop; more only take memory.
int io_threads(int configured) {
  return std::clamp(configured, 1, 16);
}

}  // namespace

Server::Server(Engine& engine, const tok::Tokenizer& tokenizer, std::optional<tok::ChatTemplate> chat_template,
               ServerConfig cfg)
    : engine_(engine), tok_(tokenizer), template_(std::move(chat_template)), cfg_(std::move(cfg)) {
  if (cfg_.limits.vocab_size <= 0) cfg_.limits.vocab_size = static_cast<int64_t>(tok_.vocab_size());
  max_token_bytes_ = tok_.max_token_bytes();
  http::Limits limits;
  limits.max_body_bytes = cfg_.max_body_bytes;
  limits.pull_interval = cfg_.pull_interval;
  http_ = std::make_unique<http::HttpServer>(limits, *this, io_threads(cfg_.threads));
}

// The engine stops first: its last pushes call wakers that hold connections, and a connection
// that outlived the front end would end its job on a dead server.
// Then the front end: its connections hold jobs, whose end counts on this server's members.
Server::~Server() {
  engine_.stop();
  http_.reset();
}

bool Server::bind() {
  return http_->bind(cfg_.host, cfg_.port);
}

int Server::port() const {
  return http_->port();
}

void Server::run() {
  http_->run();
}

// Connections still sending a request are closed at once; requests in flight may finish until
// shortly before the deadline, then are cancelled (their answers end with finish_reason
// "length") and given a moment to be written; then the loop stops, within --shutdown-timeout.
void Server::shutdown() {
  draining_ = true;
  http_->stop_accepting();
  const auto total = std::chrono::duration<double>(cfg_.shutdown_timeout_s);
  const auto grace = std::min(std::chrono::duration<double>(2.0), total / 4);
  std::unique_lock<std::mutex> lock(mu_);
  const auto start = std::chrono::steady_clock::now();
  if (!idle_.wait_until(lock, start + (total - grace), [&] { return jobs_ == 0; })) {
    spdlog::warn("shutdown: {} requests still running after {}s; cancelling them", jobs_, cfg_.shutdown_timeout_s);
    for (auto& w : live_)
      if (auto job = w.lock()) cancel_job(*job);
    idle_.wait_until(lock, start + total, [&] { return jobs_ == 0; });
  }
  lock.unlock();
  http_->stop();
}

void Server::job_finished() {
  std::lock_guard<std::mutex> l(mu_);
  --jobs_;
  metrics_.inflight = jobs_;
  // Drop expired entries now and then so the list stays the size of what is running.
  if (live_.size() > 64 && live_.size() > 2 * static_cast<size_t>(jobs_ + 1))
    std::erase_if(live_, [](const std::weak_ptr<Job>& w) { return w.expired(); });
  idle_.notify_all();
}

bool Server::authorized(const http::Request& req, http::Response& res) const {
  if (cfg_.api_key.empty()) return true;
  const std::string& h = req.header("Authorization");
  const std::string prefix = "bearer ";  // the scheme is case-insensitive (RFC 9110 11.1)
  auto lower = [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); };
  const bool bearer = h.size() > prefix.size() && std::equal(prefix.begin(), prefix.end(), h.begin(),
                                                             [&](char a, char b) { return a == lower(b); });
  if (bearer && same_secret(h.substr(prefix.size()), cfg_.api_key)) return true;
  send_error(res, ApiError(401, h.empty() ? "missing API key: send 'Authorization: Bearer <key>'" : "invalid API key",
                           "", "authentication_error", "invalid_api_key"));
  return false;
}

// From the head alone: the wrong method (405), no such path (404), or a generation request
// without the key (401). Their bodies are never kept.
std::optional<http::Response> Server::screen(const http::Request& head) {
  http::Response res;
  if (is_generate(head)) {
    if (!authorized(head, res)) return res;
    return std::nullopt;
  }
  if (is_get_route(head)) return std::nullopt;
  if (known_paths().count(head.path) || is_model_path(head.path))
    send_error(res, ApiError(405, fmt::format("{} is not allowed on {}", head.method, head.path)));
  else
    send_error(res, ApiError(404, fmt::format("no route for {} {}", head.method, head.path)));
  return res;
}

http::Response Server::error(int status, const std::string& message) {
  http::Response res;
  send_error(res, ApiError(status, message));
  return res;
}

void Server::answered(const http::Request& req, const http::Response& res) {
  // Known paths only: a client probing random URLs must not grow the label set without bound.
  std::string ep = "other";
  if (known_paths().count(req.path)) ep = req.path;
  if (is_model_path(req.path)) ep = "/v1/models";
  metrics_.request_done(ep, res.status);
}

void Server::handle(http::Request& req, http::Response& res) {
  try {
    if (is_generate(req)) return handle_generate(req, res, req.path == "/v1/chat/completions");
    if (req.path == "/health") {
      if (draining_) return send_error(res, ApiError(503, "the server is shutting down"));
      return send_json(res, 200, {{"status", "ok"}});
    }
    if (!authorized(req, res)) return;
    if (req.path == "/v1/models") {
      json m = {{"id", cfg_.model_name},
                {"object", "model"},
                {"created", 0},
                {"owned_by", "kiln"},
                {"max_model_len", engine_.max_model_len()}};
      return send_json(res, 200, {{"object", "list"}, {"data", json::array({m})}});
    }
    if (req.path == "/metrics") {
      res.status = 200;
      return res.set_content(metrics_.render(engine_.stats(), cfg_.model_name), "text/plain; version=0.0.4");
    }
    const std::string id = req.path.substr(11);  // is_model_path
    if (id != cfg_.model_name)
      return send_error(
          res, ApiError(404, fmt::format("the model '{}' does not exist", id), "model", "", "model_not_found"));
    send_json(res, 200, {{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "kiln"}});
  } catch (const std::exception& e) {
    res = http::Response{};
    send_json(res, 500, error_body(500, e.what()));
  }
}

}  // namespace kiln::server
