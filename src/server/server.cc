// Routing, auth, error bodies, lifecycle. The generation endpoints live in generate.cc.
#include "server/server.h"

#include <httplib.h>

#include <fmt/format.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "core/error.h"
#include "core/log.h"

namespace kiln::server {
namespace {

using nlohmann::json;

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
  send_json(res, e.status, error_body(e));
}

// Compares without an early exit, so the key cannot be guessed a byte at a time from timings.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0;
}

// How far past the limit an over-limit body is still read, and dropped, so that the connection's
// next request starts where it should: httplib 0.11 keeps a connection open whatever the handler
// answers, so unread body bytes would be parsed as requests. Past this the client is abusive and
// reading stops (what follows is then answered as malformed requests). Not covered, as httplib
// 0.11 reads no such body for a handler: a chunked DELETE, a GET/HEAD/OPTIONS with a body, and a
// multipart body its parser gives up on (no boundary, an oversized part header).
constexpr size_t kDrainFactor = 8;

struct BodyRead {
  std::string body;       // empty when over the limit
  bool over = false;      // past the limit: read on and dropped
  bool complete = false;  // read to its end
};

// Reads a request's body through httplib's reader, whatever its framing: httplib 0.11 bounds only a
// Content-Length body by set_payload_max_length, and buffered a chunked one whole.
BodyRead drain_body(const httplib::Request& req, const httplib::ContentReader& reader, size_t limit) {
  BodyRead r;
  size_t seen = 0;
  auto take = [&](const char* data, size_t n) {
    seen += n;
    if (!r.over && r.body.size() + n <= limit) {
      r.body.append(data, n);
      return true;
    }
    if (!r.over) std::string().swap(r.body);
    r.over = true;
    return seen <= kDrainFactor * limit;
  };
  // A multipart body goes through httplib's multipart reader only (the plain one would call an
  // empty callback); the parts' contents are dropped the same way (boundaries and part headers are
  // not counted against the cap).
  r.complete = req.is_multipart_form_data() ? reader([](const httplib::MultipartFormData&) { return true; }, take)
                                            : reader(take);
  return r;
}

}  // namespace

std::string Server::read_body(const httplib::Request& req, httplib::Response& res,
                              const httplib::ContentReader& reader) const {
  BodyRead r = drain_body(req, reader, cfg_.max_body_bytes);
  // httplib answers a Content-Length past set_payload_max_length with 413 itself (and skips it).
  if (r.over || res.status == 413)
    throw ApiError(413,
                   fmt::format("the request body is larger than the server's limit of {} bytes", cfg_.max_body_bytes));
  if (!r.complete) throw ApiError(400, "the request body could not be read");
  const std::string ct = req.get_header_value("Content-Type");
  if (ct.find("application/json") == std::string::npos || req.is_multipart_form_data())
    throw ApiError(415, fmt::format("Content-Type must be application/json, got '{}'", ct), "", "",
                   "unsupported_media_type");
  return std::move(r.body);
}

Server::Server(Engine& engine, const tok::Tokenizer& tokenizer, std::optional<tok::ChatTemplate> chat_template,
               ServerConfig cfg)
    : engine_(engine),
      tok_(tokenizer),
      template_(std::move(chat_template)),
      cfg_(std::move(cfg)),
      http_(std::make_unique<httplib::Server>()) {
  if (cfg_.limits.vocab_size <= 0) cfg_.limits.vocab_size = static_cast<int64_t>(tok_.vocab_size());
  max_token_bytes_ = tok_.max_token_bytes();
  const int threads = std::max(cfg_.threads, 2);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_->set_payload_max_length(cfg_.max_body_bytes);
  // httplib uses this both for idle keep-alive connections and for how long a newly accepted
  // connection may take to send its first request: under a burst of 1,000 connects clients take
  // seconds to write them all, and a short value closes connections unanswered. It also bounds
  // how long a graceful shutdown waits on idle connections. At 10 s, 1,000 concurrent streams on
  // the 2-core development machine lost one request in about half the runs (ServeLoad: a request
  // written, the connection then closed unanswered: 4 of 8 runs failed), at 30 s none of 8 did,
  // the waves taking longer (their threads are held longer by idle connections). Not explained
  // further: the thread-per-connection front end is what such bursts strain.
  http_->set_keep_alive_timeout(30);
  http_->set_read_timeout(30);
  http_->set_write_timeout(30);
  http_->set_tcp_nodelay(true);
  // httplib listens with a backlog of 5: a burst of connections (1,000 clients at once) would
  // overflow it and clients would see resets and SYN retries. Keep the listening socket to widen
  // the backlog after bind.
  http_->set_socket_options([this](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_fd_ = sock;
  });
  routes();
}

Server::~Server() = default;

bool Server::bind() {
  bool ok = false;
  if (cfg_.port == 0) {
    port_ = http_->bind_to_any_port(cfg_.host);
    ok = port_ > 0;
  } else {
    port_ = cfg_.port;
    ok = http_->bind_to_port(cfg_.host, cfg_.port);
  }
  // Linux lets listen() on a listening socket change its backlog (capped by net.core.somaxconn).
  if (ok && listen_fd_ >= 0) ::listen(listen_fd_, 4096);
  return ok;
}

void Server::run() {
  http_->listen_after_bind();
}

void Server::shutdown() {
  draining_ = true;
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(cfg_.shutdown_timeout_s);
  if (!idle_.wait_until(lock, deadline, [&] { return jobs_ == 0; })) {
    spdlog::warn("shutdown: {} requests still running after {}s; cancelling them", jobs_, cfg_.shutdown_timeout_s);
    for (auto& w : live_)
      if (auto job = w.lock()) cancel_job(*job);
    idle_.wait_for(lock, std::chrono::seconds(10), [&] { return jobs_ == 0; });
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

bool Server::authorized(const httplib::Request& req, httplib::Response& res) const {
  if (cfg_.api_key.empty()) return true;
  const std::string h = req.get_header_value("Authorization");
  const std::string prefix = "bearer ";  // the scheme is case-insensitive (RFC 9110 11.1)
  auto lower = [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); };
  const bool bearer = h.size() > prefix.size() && std::equal(prefix.begin(), prefix.end(), h.begin(),
                                                             [&](char a, char b) { return a == lower(b); });
  if (bearer && same_secret(h.substr(prefix.size()), cfg_.api_key)) return true;
  send_error(res, ApiError(401, h.empty() ? "missing API key: send 'Authorization: Bearer <key>'" : "invalid API key",
                           "", "authentication_error", "invalid_api_key"));
  return false;
}

void Server::routes() {
  httplib::Server& s = *http_;
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) return send_json(res, 503, error_body(503, "the server is shutting down"));
    send_json(res, 200, {{"status", "ok"}});
  });
  s.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    json m = {{"id", cfg_.model_name},
              {"object", "model"},
              {"created", 0},
              {"owned_by", "kiln"},
              {"max_model_len", engine_.max_model_len()}};
    send_json(res, 200, {{"object", "list"}, {"data", json::array({m})}});
  });
  s.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    const std::string id = req.matches[1];
    if (id != cfg_.model_name)
      return send_error(
          res, ApiError(404, fmt::format("the model '{}' does not exist", id), "model", "", "model_not_found"));
    send_json(res, 200, {{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "kiln"}});
  });
  s.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    res.set_content(metrics_.render(engine_.stats(), cfg_.model_name), "text/plain; version=0.0.4");
  });
  // These read their bodies themselves (Server::read_body): httplib 0.11 bounds only bodies with a
  // Content-Length by set_payload_max_length, and a chunked one once grew without end. So does
  // every other POST, PUT, PATCH and DELETE (below).
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res,
                                        const httplib::ContentReader& body) { handle_generate(req, res, body, true); });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res,
                                   const httplib::ContentReader& body) { handle_generate(req, res, body, false); });
  // The wrong method on a known path is 405, not 404.
  auto not_allowed = [](const httplib::Request& req, httplib::Response& res) {
    send_error(res, ApiError(405, fmt::format("{} is not allowed on {}", req.method, req.path)));
  };
  for (const char* p : {"/v1/chat/completions", "/v1/completions"}) s.Get(p, not_allowed);
  // Any other POST, PUT, PATCH or DELETE: its body read (bounded, dropped), then 405 on a known path
  // and 404 elsewhere. Any path: httplib matches the decoded path, and ECMAScript's "." stops at a
  // newline, so ".*" let "/a%0Ab" through to httplib's own unbounded read.
  auto no_route = [this, not_allowed](const httplib::Request& req, httplib::Response& res,
                                      const httplib::ContentReader& reader) {
    drain_body(req, reader, cfg_.max_body_bytes);
    static const std::set<std::string> known = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health",
                                                "/metrics"};
    if (known.count(req.path) || req.path.rfind("/v1/models/", 0) == 0) return not_allowed(req, res);
    send_error(res, ApiError(404, fmt::format("no route for {} {}", req.method, req.path)));
  };
  const std::string any_path = R"([\s\S]*)";
  s.Post(any_path, no_route);
  s.Put(any_path, no_route);
  s.Patch(any_path, no_route);
  s.Delete(any_path, no_route);

  // httplib answers some errors itself (unknown path, 413 body too large, unparseable HTTP):
  // give them the OpenAI body too.
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg = res.status == 404   ? fmt::format("no route for {} {}", req.method, req.path)
                      : res.status == 413 ? "the request body is larger than the server's limit"
                                          : fmt::format("HTTP {}", res.status);
    send_json(res, res.status, error_body(res.status, msg));
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    send_json(res, 500, error_body(500, msg));
  });
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    // Known paths only: a client probing random URLs must not grow the label set without bound.
    static const char* known[] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"};
    std::string ep = "other";
    for (const char* k : known)
      if (req.path == k) ep = k;
    if (req.path.rfind("/v1/models/", 0) == 0) ep = "/v1/models";
    metrics_.request_done(ep, res.status);
  });
}

}  // namespace kiln::server
