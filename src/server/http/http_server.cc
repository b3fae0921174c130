#include "server/http/http_server.h"

#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>

#include <spdlog/spdlog.h>

#include <memory>
#include <thread>
#include <vector>

namespace kiln::server::http {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

HttpServer::HttpServer(const Limits& limits, Handler& handler, int io_threads)
    : work_(asio::make_work_guard(ioc_)), acceptor_(ioc_), threads_(std::max(io_threads, 1)) {
  set_.limits = limits;
  set_.handler = &handler;
}

HttpServer::~HttpServer() {
  stop();
}

bool HttpServer::bind(const std::string& host, int port) {
  error_code ec;
  tcp::resolver resolver(ioc_);
  const auto found = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || found.empty()) return false;
  const tcp::endpoint ep = found.begin()->endpoint();
  acceptor_.open(ep.protocol(), ec);
  if (ec) return false;
  acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  acceptor_.bind(ep, ec);
  if (ec) return false;
  // A burst of connections (thousands of clients at once) must not overflow the backlog.
  acceptor_.listen(4096, ec);
  if (ec) return false;
  port_ = acceptor_.local_endpoint(ec).port();
  accept();
  return true;
}

void HttpServer::accept() {
  acceptor_.async_accept(asio::make_strand(ioc_), [this](const error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) {
      if (set_.size() >= set_.limits.max_connections)
        refuse_overload(std::move(socket));
      else
        std::make_shared<Connection>(std::move(socket), set_)->start();
    } else if (ec == asio::error::no_descriptors) {
      spdlog::warn("accept: out of file descriptors ({} connections open)", set_.size());
    }
    accept();
  });
}

// Past the connection cap: one canned answer, then the socket closes (no state kept).
void HttpServer::refuse_overload(tcp::socket socket) {
  static const std::string body =
      R"({"error":{"message":"the server has too many open connections; retry later","type":"server_error",)"
      R"("param":null,"code":"server_overloaded"}})";
  static const std::string answer =
      "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n"
      "Content-Type: application/json\r\nConnection: close\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  auto s = std::make_shared<tcp::socket>(std::move(socket));
  asio::async_write(*s, asio::buffer(answer), [s](const error_code&, size_t) {
    error_code ec;
    s->shutdown(tcp::socket::shutdown_both, ec);
    s->close(ec);
  });
}

void HttpServer::run() {
  std::vector<std::thread> others;
  for (int i = 1; i < threads_; ++i) others.emplace_back([this] { ioc_.run(); });
  ioc_.run();
  for (auto& t : others) t.join();
}

void HttpServer::stop_accepting() {
  set_.draining = true;
  asio::post(acceptor_.get_executor(), [this] {
    error_code ec;
    acceptor_.close(ec);
  });
  // Taken under the lock, closed outside it: the last reference may go here, and its destructor
  // takes the lock. A connection being destroyed is still listed until then (lock() fails).
  std::vector<std::shared_ptr<Connection>> open;
  {
    std::lock_guard l(set_.mu);
    for (Connection* c : set_.open)
      if (auto alive = c->weak_from_this().lock()) open.push_back(std::move(alive));
  }
  for (auto& c : open) c->close_unless_answering();
}

void HttpServer::stop() {
  work_.reset();
  ioc_.stop();
}

}  // namespace kiln::server::http
