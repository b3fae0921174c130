// One client connection as a state machine on the event loop (no thread of its own): wait for a
// request (idle deadline), read its head (header deadline, limits checked as bytes arrive), judge
// it before any body is read, read the body (body deadline), answer it whole or as a stream it
// pulls from when woken, then the next request, in order (pipelined requests wait in the buffer).
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>

#include "server/http/handler.h"
#include "server/http/limits.h"
#include "server/http/message.h"
#include "server/http/request_reader.h"

namespace kiln::server::http {

class Connection;

// What all connections of one server share.
struct ConnectionSet {
  Limits limits;
  Handler* handler = nullptr;
  std::atomic<bool> draining{false};
  std::mutex mu;
  std::unordered_set<Connection*> open;  // under mu
  size_t size() {
    std::lock_guard l(mu);
    return open.size();
  }
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(boost::asio::ip::tcp::socket socket, ConnectionSet& set);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void start();
  // Shutdown: closes the connection now unless it is answering a request (any thread).
  void close_unless_answering();

 private:
  enum class Phase { Idle, Header, Body, Answering, Closing };

  void next_request();
  void read();
  void on_read(const boost::system::error_code& ec, size_t n);
  void parse();
  bool on_head();  // false: answered and closing, read no further
  void finish_exchange();
  void on_request();
  void refuse(int status, const std::string& message, bool close);
  void send_response();
  void pump();
  void flush();
  void response_done();
  void linger();
  void drop_input();
  void close_now();
  void arm(std::chrono::milliseconds d);
  void tick();

  boost::asio::ip::tcp::socket socket_;
  ConnectionSet& set_;
  const Limits& limits_;
  boost::asio::steady_timer deadline_;  // the current phase's deadline
  boost::asio::steady_timer ticker_;    // a stream's once-a-second pull
  boost::beast::flat_buffer buf_;
  RequestReader reader_;
  Phase phase_ = Phase::Idle;
  bool early_answer_ = false;    // answered from the head while its body is read on and dropped
  bool request_read_ = false;    // this exchange's request is read to its end
  bool answer_written_ = false;  // and its answer is written
  Request req_;
  Response res_;
  bool keep_alive_ = true;
  bool chunked_ = false;      // the stream is framed in chunks (HTTP/1.1)
  bool body_queued_ = false;  // the whole response is in pending_ or out_
  bool writing_ = false;
  bool closed_ = false;
  std::string pending_, out_;
  size_t lingered_ = 0;
  std::atomic<bool> wake_posted_{false};
};

}  // namespace kiln::server::http
