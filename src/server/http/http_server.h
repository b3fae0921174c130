// The listener and the I/O threads: a few threads run every connection's state machine
// (connection.h), so an open connection costs a socket, a buffer and a timer, not a thread.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <optional>
#include <string>

#include "server/http/connection.h"

namespace kiln::server::http {

class HttpServer {
 public:
  HttpServer(const Limits& limits, Handler& handler, int io_threads);
  ~HttpServer();

  // Listens on host:port (port 0: any free port); false when the address cannot be had.
  bool bind(const std::string& host, int port);
  int port() const { return port_; }
  // Runs the I/O threads (this one among them) until stop().
  void run();
  // Shutdown, first step: no new connections, and those not answering a request are closed;
  // connections answering finish their answer, then close.
  void stop_accepting();
  void stop();  // ends run(); connections still open are dropped
  size_t open_connections() { return set_.size(); }

 private:
  void accept();
  void refuse_overload(boost::asio::ip::tcp::socket socket);

  ConnectionSet set_;  // first: connections still queued in ioc_ leave it when ioc_ is destroyed
  boost::asio::io_context ioc_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  boost::asio::ip::tcp::acceptor acceptor_;
  int threads_;
  int port_ = 0;
};

}  // namespace kiln::server::http
