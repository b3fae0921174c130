#include "bench/client.h"

#include <curl/curl.h>
#include <netdb.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>

#include "bench/sse.h"
#include "core/error.h"

namespace kiln::bench {
namespace {

using Clock = std::chrono::steady_clock;
std::atomic<bool> g_stop{false};

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { KILN_CHECK(curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK, "libcurl init failed"); });
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double thread_cpu_s() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

// "host:port:addr,addr" for CURLOPT_RESOLVE: the name is looked up once here, not once per new
// connection (libcurl's threaded resolver would start a thread for each of a thousand simultaneous
// connects), and every request goes to the same addresses.
std::string pinned_resolve(const std::string& url) {
  CURLU* u = curl_url();
  std::string out;
  char *host = nullptr, *port = nullptr;
  if (curl_url_set(u, CURLUPART_URL, url.c_str(), 0) == CURLUE_OK &&
      curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
      curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK) {
    std::string h = host;
    in6_addr probe{};
    const bool numeric = inet_pton(AF_INET, h.c_str(), &probe) == 1 || (!h.empty() && h.front() == '[');
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (!numeric && getaddrinfo(h.c_str(), port, &hints, &res) == 0) {
      std::string addrs;
      for (addrinfo* a = res; a; a = a->ai_next) {
        char buf[INET6_ADDRSTRLEN] = {};
        const void* src = a->ai_family == AF_INET
                              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
                              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
        if (!inet_ntop(a->ai_family, src, buf, sizeof buf)) continue;
        std::string one = a->ai_family == AF_INET6 ? "[" + std::string(buf) + "]" : std::string(buf);
        if (addrs.find(one) != std::string::npos) continue;
        addrs += (addrs.empty() ? "" : ",") + one;
      }
      freeaddrinfo(res);
      if (!addrs.empty()) out = h + ":" + port + ":" + addrs;
    }
  }
  curl_free(host);
  curl_free(port);
  curl_url_cleanup(u);
  return out;
}

struct Stream;

class Driver {
 public:
  Driver(const ClientConfig& cfg, const std::vector<Prompt>& prompts, const RunOptions& opt);
  ~Driver();
  RunResult run();

 private:
  friend struct Stream;
  static int on_socket(CURL*, curl_socket_t fd, int what, void* userp, void*);
  static int on_timer(CURLM*, long timeout_ms, void* userp);
  static size_t on_write(char* p, size_t size, size_t n, void* ud);
  void launch(size_t i, Clock::time_point now);
  void finish(Stream& s, CURLcode rc);
  void drain();
  void report(Clock::time_point now);

  const ClientConfig& cfg_;
  const RunOptions& opt_;
  std::string url_;
  std::vector<std::string> bodies_;
  CURLM* multi_ = nullptr;
  int epfd_ = -1;
  curl_slist* headers_ = nullptr;
  curl_slist* resolve_ = nullptr;
  std::optional<Clock::time_point> timer_;
  std::vector<std::unique_ptr<Stream>> open_;  // by prompt index while in flight
  Clock::time_point t0_, last_done_;
  RunResult res_;
  RunProgress prog_;
};

struct Stream {
  Driver* driver = nullptr;
  size_t index = 0;
  CURL* easy = nullptr;
  Clock::time_point sent;
  long status = 0;
  SseParser sse;
  StreamState st;
  std::vector<std::string> events;  // scratch for one write
  std::string err_body;             // the start of a non-2xx answer
  char errbuf[CURL_ERROR_SIZE] = {};
};

Driver::Driver(const ClientConfig& cfg, const std::vector<Prompt>& prompts, const RunOptions& opt)
    : cfg_(cfg), opt_(opt), url_(normalize_base_url(cfg.base_url) + endpoint_path(cfg)) {
  global_init();
  // Bodies are serialised before the clock starts: a 172k-token prompt takes a while to dump.
  bodies_.reserve(prompts.size());
  for (const auto& p : prompts) bodies_.push_back(request_body(cfg, p).dump());
  KILN_CHECK(opt.send_at_s.empty() || opt.send_at_s.size() == prompts.size(), "send_at_s: one time per prompt");
  open_.resize(prompts.size());
  res_.records.resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    res_.records[i].index = static_cast<int64_t>(i);
    res_.records[i].group = prompts[i].group;
    res_.records[i].max_tokens = prompts[i].max_tokens;
    res_.records[i].prompt_tokens = res_.records[i].workload_prompt_tokens = prompts[i].prompt_tokens;
  }
  prog_.total = static_cast<int64_t>(prompts.size());
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  KILN_CHECK(epfd_ >= 0, "epoll_create1 failed");
  multi_ = curl_multi_init();
  KILN_CHECK(multi_, "curl_multi_init failed");
  curl_multi_setopt(multi_, CURLMOPT_SOCKETFUNCTION, &Driver::on_socket);
  curl_multi_setopt(multi_, CURLMOPT_SOCKETDATA, this);
  curl_multi_setopt(multi_, CURLMOPT_TIMERFUNCTION, &Driver::on_timer);
  curl_multi_setopt(multi_, CURLMOPT_TIMERDATA, this);
  // Keep one idle connection per stream so that HTTP/1.1 keep-alive reuses them.
  const long keep =
      static_cast<long>(std::max<int64_t>(16, opt.max_concurrency > 0 ? opt.max_concurrency : prog_.total));
  curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS, keep);
  headers_ = curl_slist_append(headers_, "Content-Type: application/json");
  headers_ = curl_slist_append(headers_, "Accept: text/event-stream");
  // No "Expect: 100-continue" round trip before long prompt bodies.
  headers_ = curl_slist_append(headers_, "Expect:");
  if (!cfg.api_key.empty()) headers_ = curl_slist_append(headers_, ("Authorization: Bearer " + cfg.api_key).c_str());
  if (std::string r = pinned_resolve(url_); !r.empty()) resolve_ = curl_slist_append(resolve_, r.c_str());
}

Driver::~Driver() {
  for (auto& s : open_) {
    if (!s) continue;
    curl_multi_remove_handle(multi_, s->easy);
    curl_easy_cleanup(s->easy);
  }
  if (multi_) curl_multi_cleanup(multi_);
  curl_slist_free_all(headers_);
  curl_slist_free_all(resolve_);
  if (epfd_ >= 0) close(epfd_);
}

int Driver::on_socket(CURL*, curl_socket_t fd, int what, void* userp, void*) {
  auto* d = static_cast<Driver*>(userp);
  if (what == CURL_POLL_REMOVE) {
    epoll_ctl(d->epfd_, EPOLL_CTL_DEL, fd, nullptr);
    return 0;
  }
  epoll_event ev{};
  ev.data.fd = fd;
  ev.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0u) | ((what & CURL_POLL_OUT) ? EPOLLOUT : 0u);
  if (epoll_ctl(d->epfd_, EPOLL_CTL_MOD, fd, &ev) != 0) epoll_ctl(d->epfd_, EPOLL_CTL_ADD, fd, &ev);
  return 0;
}

int Driver::on_timer(CURLM*, long timeout_ms, void* userp) {
  auto* d = static_cast<Driver*>(userp);
  if (timeout_ms < 0)
    d->timer_.reset();
  else
    d->timer_ = Clock::now() + std::chrono::milliseconds(timeout_ms);
  return 0;
}

size_t Driver::on_write(char* p, size_t size, size_t n, void* ud) {
  auto* s = static_cast<Stream*>(ud);
  const size_t len = size * n;
  const double now_ms = ms_between(s->sent, Clock::now());
  if (s->status == 0) curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &s->status);
  if (s->status < 200 || s->status >= 300) {
    if (s->err_body.size() < 1024) s->err_body.append(p, std::min(len, 1024 - s->err_body.size()));
    return len;
  }
  s->events.clear();
  s->sse.feed(std::string_view(p, len), s->events);
  const size_t before = s->st.event_ms.size();
  for (const auto& e : s->events) apply_event(e, now_ms, s->st);
  s->driver->prog_.token_events += static_cast<int64_t>(s->st.event_ms.size() - before);
  return len;
}

void Driver::launch(size_t i, Clock::time_point now) {
  auto s = std::make_unique<Stream>();
  s->driver = this;
  s->index = i;
  CURL* e = curl_easy_init();
  KILN_CHECK(e, "curl_easy_init failed");
  s->easy = e;
  const std::string& body = bodies_[i];
  curl_easy_setopt(e, CURLOPT_URL, url_.c_str());
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers_);
  if (resolve_) curl_easy_setopt(e, CURLOPT_RESOLVE, resolve_);
  curl_easy_setopt(e, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &Driver::on_write);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, s.get());
  curl_easy_setopt(e, CURLOPT_PRIVATE, s.get());
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, s->errbuf);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
  const long timeout_ms = static_cast<long>(std::max(1.0, cfg_.request_timeout_s * 1000.0));
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, std::min(timeout_ms, 30000L));
  res_.records[i].start_s = std::chrono::duration<double>(now - t0_).count();
  s->sent = now;
  curl_multi_add_handle(multi_, e);
  open_[i] = std::move(s);
  ++prog_.launched;
  ++prog_.in_flight;
  res_.max_in_flight = std::max(res_.max_in_flight, prog_.in_flight);
}

void Driver::finish(Stream& s, CURLcode rc) {
  const auto now = Clock::now();
  RequestRecord& r = res_.records[s.index];
  r.e2e_ms = ms_between(s.sent, now);
  long status = 0;
  curl_easy_getinfo(s.easy, CURLINFO_RESPONSE_CODE, &status);
  r.http_status = static_cast<int>(status);
  r.event_ms = std::move(s.st.event_ms);
  r.text = std::move(s.st.text);
  r.finish_reason = std::move(s.st.finish_reason);
  r.usage_prompt_tokens = s.st.usage_prompt_tokens;
  r.usage_completion_tokens = s.st.usage_completion_tokens;
  if (rc != CURLE_OK) {
    r.error_kind = rc == CURLE_OPERATION_TIMEDOUT                                      ? "timeout"
                   : (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST) ? "connect"
                                                                                       : "transfer";
    r.error = s.errbuf[0] ? std::string(s.errbuf) : std::string(curl_easy_strerror(rc));
  } else if (status < 200 || status >= 300) {
    r.error_kind = "http_" + std::to_string(status);
    r.error = s.err_body.substr(0, 300);
  } else if (!s.st.error.empty()) {
    r.error_kind = s.st.error.rfind("malformed", 0) == 0 ? "malformed_event" : "error_event";
    r.error = s.st.error;
  } else if (r.event_ms.empty()) {
    r.error_kind = "no_tokens";
    r.error = "the stream ended without a token";
  }
  r.success = r.error_kind.empty();
  if (!r.event_ms.empty()) r.ttft_ms = r.event_ms.front();
  ++(r.success ? prog_.completed : prog_.failed);
  --prog_.in_flight;
  last_done_ = now;
  curl_multi_remove_handle(multi_, s.easy);
  curl_easy_cleanup(s.easy);
  open_[s.index].reset();
}

void Driver::drain() {
  int left = 0;
  while (CURLMsg* m = curl_multi_info_read(multi_, &left)) {
    if (m->msg != CURLMSG_DONE) continue;
    Stream* s = nullptr;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, reinterpret_cast<char**>(&s));
    const CURLcode rc = m->data.result;
    finish(*s, rc);
  }
}

void Driver::report(Clock::time_point now) {
  if (!opt_.on_progress) return;
  prog_.elapsed_s = std::chrono::duration<double>(now - t0_).count();
  opt_.on_progress(prog_);
}

RunResult Driver::run() {
  const double cpu0 = thread_cpu_s();
  t0_ = last_done_ = Clock::now();
  const size_t n = bodies_.size();
  const auto limit = opt_.max_concurrency;
  size_t next = 0;
  auto next_report = t0_;
  constexpr int kMaxEvents = 512;
  epoll_event evs[kMaxEvents];
  while (true) {
    auto now = Clock::now();
    if (stop_requested()) {
      res_.interrupted = true;
      break;
    }
    const double elapsed = std::chrono::duration<double>(now - t0_).count();
    while (next < n && (limit <= 0 || prog_.in_flight < limit) &&
           (opt_.send_at_s.empty() || opt_.send_at_s[next] <= elapsed))
      launch(next++, now);
    if (prog_.in_flight == 0 && next == n) break;
    // Sleep until libcurl's timer, the next arrival or the next progress/stop check, whichever is
    // first; rounding up so that a wait never ends just before its deadline and spins.
    double wait_ms = 100;
    if (timer_) wait_ms = std::min(wait_ms, ms_between(now, *timer_));
    if (next < n && (limit <= 0 || prog_.in_flight < limit) && !opt_.send_at_s.empty())
      wait_ms = std::min(wait_ms, (opt_.send_at_s[next] - elapsed) * 1000.0);
    const int nev = epoll_wait(epfd_, evs, kMaxEvents, static_cast<int>(std::ceil(std::max(wait_ms, 0.0))));
    int running = 0;
    for (int k = 0; k < nev; ++k) {
      const uint32_t e = evs[k].events;
      const int flags = ((e & EPOLLIN) ? CURL_CSELECT_IN : 0) | ((e & EPOLLOUT) ? CURL_CSELECT_OUT : 0) |
                        ((e & (EPOLLERR | EPOLLHUP)) ? CURL_CSELECT_ERR : 0);
      curl_multi_socket_action(multi_, evs[k].data.fd, flags, &running);
    }
    if (timer_ && Clock::now() >= *timer_) {
      timer_.reset();
      curl_multi_socket_action(multi_, CURL_SOCKET_TIMEOUT, 0, &running);
    }
    drain();
    now = Clock::now();
    if (now >= next_report) {
      report(now);
      next_report = now + std::chrono::milliseconds(200);
    }
  }
  auto end = res_.interrupted ? Clock::now() : last_done_;
  for (auto& s : open_) {
    if (!s) continue;
    RequestRecord& r = res_.records[s->index];
    r.error_kind = "interrupted";
    r.error = "stopped by Ctrl-C before the response ended";
    r.e2e_ms = ms_between(s->sent, end);
    r.event_ms = std::move(s->st.event_ms);
    curl_multi_remove_handle(multi_, s->easy);
    curl_easy_cleanup(s->easy);
    s.reset();
  }
  res_.records.resize(next);  // requests never sent have no record
  res_.duration_s = std::chrono::duration<double>(end - t0_).count();
  res_.client_cpu_s = thread_cpu_s() - cpu0;
  report(Clock::now());
  return std::move(res_);
}

size_t append_to_string(char* p, size_t size, size_t n, void* ud) {
  static_cast<std::string*>(ud)->append(p, size * n);
  return size * n;
}

}  // namespace

std::string normalize_base_url(const std::string& url) {
  std::string u = url;
  while (!u.empty() && u.back() == '/') u.pop_back();
  if (u.size() >= 3 && u.compare(u.size() - 3, 3, "/v1") == 0) u.resize(u.size() - 3);
  return u;
}

std::string endpoint_path(const ClientConfig& c) {
  if (c.endpoint == "completions") return "/v1/completions";
  if (c.endpoint == "chat") return "/v1/chat/completions";
  fail("--endpoint {}: expected completions or chat", c.endpoint);
}

nlohmann::json request_body(const ClientConfig& c, const Prompt& p) {
  nlohmann::json b = {{"model", c.model},
                      {"max_tokens", p.max_tokens},
                      {"temperature", c.temperature},
                      {"stream", true},
                      {"stream_options", {{"include_usage", true}}}};
  if (c.ignore_eos) b["ignore_eos"] = true;
  if (c.endpoint == "chat") {
    nlohmann::json msgs = nlohmann::json::array();
    if (!p.system.empty()) msgs.push_back({{"role", "system"}, {"content", p.system}});
    msgs.push_back({{"role", "user"}, {"content", p.text}});
    b["messages"] = std::move(msgs);
  } else {
    b["prompt"] = p.system + p.text;
  }
  if (c.extra_body.is_object()) b.merge_patch(c.extra_body);
  return b;
}

RunResult run_requests(const ClientConfig& cfg, const std::vector<Prompt>& prompts, const RunOptions& opt) {
  Driver d(cfg, prompts, opt);
  return d.run();
}

namespace {

// GET url: the HTTP status and body, or an error message when the request failed.
struct GetResult {
  long status = 0;
  std::string body, error;
};
GetResult http_get(const std::string& url, const std::string& api_key, double timeout_s) {
  global_init();
  GetResult r;
  CURL* e = curl_easy_init();
  if (!e) return {0, {}, "curl_easy_init failed"};
  curl_slist* h = nullptr;
  if (!api_key.empty()) h = curl_slist_append(h, ("Authorization: Bearer " + api_key).c_str());
  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &append_to_string);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &r.body);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_s * 1000));
  const CURLcode rc = curl_easy_perform(e);
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r.status);
  curl_slist_free_all(h);
  curl_easy_cleanup(e);
  if (rc != CURLE_OK) r.error = fmt::format("GET {}: {}", url, curl_easy_strerror(rc));
  return r;
}

}  // namespace

nlohmann::json fetch_models(const std::string& base_url, const std::string& api_key, double timeout_s) {
  const std::string url = normalize_base_url(base_url) + "/v1/models";
  const GetResult r = http_get(url, api_key, timeout_s);
  if (!r.error.empty()) return {{"error", r.error}};
  nlohmann::json j = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (r.status != 200 || j.is_discarded())
    return {{"error", fmt::format("GET {}: HTTP {}: {}", url, r.status, r.body.substr(0, 300))}};
  return j;
}

std::string fetch_metrics(const std::string& base_url, const std::string& api_key, double timeout_s) {
  const GetResult r = http_get(normalize_base_url(base_url) + "/metrics", api_key, timeout_s);
  return r.error.empty() && r.status == 200 ? r.body : std::string();
}

void request_stop() {
  g_stop.store(true, std::memory_order_relaxed);
}
bool stop_requested() {
  return g_stop.load(std::memory_order_relaxed);
}
void clear_stop() {
  g_stop.store(false, std::memory_order_relaxed);
}

std::string http_client_version() {
  return curl_version();
}

}  // namespace kiln::bench
