#include "server/http/connection.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include <fmt/format.h>

#include "server/http/request_head.h"

namespace kiln::server::http {

namespace asio = boost::asio;
using boost::system::error_code;

Connection::Connection(asio::ip::tcp::socket socket, ConnectionSet& set)
    : socket_(std::move(socket)),
      set_(set),
      limits_(set.limits),
      deadline_(socket_.get_executor()),
      ticker_(socket_.get_executor()),
      reader_(set.limits) {
  std::lock_guard l(set_.mu);
  set_.open.insert(this);
}

Connection::~Connection() {
  std::lock_guard l(set_.mu);
  set_.open.erase(this);
}

void Connection::start() {
  error_code ec;
  socket_.set_option(asio::ip::tcp::no_delay(true), ec);
  asio::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->next_request(); });
}

void Connection::close_unless_answering() {
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    if (self->phase_ != Phase::Answering) self->close_now();
  });
}

void Connection::next_request() {
  phase_ = Phase::Idle;
  early_answer_ = request_read_ = answer_written_ = false;
  req_ = Request{};
  reader_.reset();
  if (buf_.size() > 0) {  // a pipelined request already here
    phase_ = Phase::Header;
    arm(limits_.header_timeout);
    parse();
    return;
  }
  arm(limits_.idle_timeout);
  read();
}

void Connection::read() {
  socket_.async_read_some(buf_.prepare(16 << 10),
                          [self = shared_from_this()](const error_code& ec, size_t n) { self->on_read(ec, n); });
}

void Connection::on_read(const error_code& ec, size_t n) {
  if (closed_) return;
  if (ec) return close_now();  // end of stream or reset: a request cut short gets no answer
  buf_.commit(n);
  if (phase_ == Phase::Idle) {
    phase_ = Phase::Header;
    arm(limits_.header_timeout);
  }
  parse();
}

void Connection::parse() {
  while (!closed_) {
    switch (reader_.feed(buf_)) {
      case RequestReader::Step::NeedMore: return read();
      case RequestReader::Step::Refused: {
        const Refusal& r = reader_.refusal();
        return refuse(r.status, r.message, true);
      }
      case RequestReader::Step::HeadDone:
        if (!on_head()) return;
        break;
      case RequestReader::Step::Done: return on_request();
    }
  }
}

// A missing key or an unknown route is answered before anything about the body; so is an
// over-limit body, from its Content-Length. The answer is written at once while the body is read
// on and dropped (keeping the connection in step), unless the body is past even what is drained:
// then the connection closes after the answer.
bool Connection::on_head() {
  req_ = reader_.head();
  std::optional<Response> early = set_.handler->screen(req_);
  const std::optional<Refusal>& too_big = reader_.head_refusal();
  if (!early && too_big) early = set_.handler->error(too_big->status, too_big->message);
  if (early) {
    reader_.drop_body();
    res_ = std::move(*early);
    if (too_big && too_big->close) {
      res_.close = true;
      request_read_ = true;
      phase_ = Phase::Answering;
      deadline_.cancel();
      send_response();
      return false;
    }
    early_answer_ = true;
    send_response();
  } else if (reader_.expects_continue()) {
    static const std::string go_on = "HTTP/1.1 100 Continue\r\n\r\n";
    error_code ec;
    asio::write(socket_, asio::buffer(go_on), ec);
  }
  phase_ = Phase::Body;
  arm(limits_.body_timeout);
  return true;
}

void Connection::on_request() {
  request_read_ = true;
  phase_ = Phase::Answering;
  deadline_.cancel();
  if (early_answer_) {
    if (writing_) arm(limits_.write_timeout);
    return finish_exchange();
  }
  if (reader_.body_over()) {
    res_ = set_.handler->error(
        413, fmt::format("the request body is larger than the server's limit of {} bytes", limits_.max_body_bytes));
  } else {
    req_ = reader_.take();
    res_ = Response{};
    set_.handler->handle(req_, res_);
  }
  send_response();
}

void Connection::refuse(int status, const std::string& message, bool close) {
  request_read_ = true;  // nothing more is read: the connection closes after this answer
  phase_ = Phase::Answering;
  deadline_.cancel();
  res_ = set_.handler->error(status, message);
  res_.close = res_.close || close;
  send_response();
}

void Connection::send_response() {
  keep_alive_ = req_.keep_alive && !res_.close && !set_.draining;
  const bool stream = static_cast<bool>(res_.provider);
  if (stream && req_.http10) keep_alive_ = false;  // no chunks in HTTP/1.0: the close ends the body
  chunked_ = stream && !req_.http10;
  std::string head = fmt::format("HTTP/1.1 {} {}\r\n", res_.status, reason_phrase(res_.status));
  for (const auto& [n, v] : res_.headers) head += fmt::format("{}: {}\r\n", n, v);
  if (!res_.content_type.empty()) head += fmt::format("Content-Type: {}\r\n", res_.content_type);
  if (chunked_)
    head += "Transfer-Encoding: chunked\r\n";
  else if (!stream)
    head += fmt::format("Content-Length: {}\r\n", res_.body.size());
  if (!keep_alive_) head += "Connection: close\r\n";
  head += "\r\n";
  pending_ += head;
  if (!stream) {
    pending_ += res_.body;
    body_queued_ = true;
    return flush();
  }
  body_queued_ = false;
  if (res_.subscribe) {
    std::weak_ptr<Connection> weak = weak_from_this();
    res_.subscribe([weak] {
      auto self = weak.lock();
      if (!self || self->wake_posted_.exchange(true)) return;
      asio::post(self->socket_.get_executor(), [self] {
        self->wake_posted_ = false;
        self->pump();
      });
    });
  }
  tick();
  pump();
}

// Pulls what the stream has ready into pending_. A client that lets more than max_pending_bytes
// pile up is not reading: its write fails, the provider gives up, and the connection closes
// (dropping the provider cancels its request, which frees its KV).
void Connection::pump() {
  if (closed_ || !res_.provider || body_queued_) return;
  DataSink sink;
  sink.write = [this](const char* d, size_t n) {
    if (pending_.size() + out_.size() > limits_.max_pending_bytes) return false;
    if (n == 0) return true;
    if (chunked_) pending_ += fmt::format("{:x}\r\n", n);
    pending_.append(d, n);
    if (chunked_) pending_ += "\r\n";
    return true;
  };
  sink.done = [this] {
    body_queued_ = true;
    if (chunked_) pending_ += "0\r\n\r\n";
  };
  if (!res_.provider(sink)) return close_now();
  flush();
}

void Connection::tick() {
  ticker_.expires_after(limits_.pull_interval);
  ticker_.async_wait([self = shared_from_this()](const error_code& ec) {
    if (ec || self->closed_ || !self->res_.provider || self->body_queued_) return;
    self->pump();
    self->tick();
  });
}

void Connection::flush() {
  if (closed_ || writing_) return;
  if (pending_.empty()) {
    if (body_queued_) response_done();
    return;
  }
  out_.swap(pending_);
  pending_.clear();
  writing_ = true;
  // An answer written while its body is still read (on_head) runs under the body's deadline.
  if (phase_ == Phase::Answering) arm(limits_.write_timeout);
  asio::async_write(socket_, asio::buffer(out_), [self = shared_from_this()](const error_code& ec, size_t) {
    self->writing_ = false;
    self->out_.clear();
    if (self->closed_) return;
    if (self->phase_ == Phase::Answering) self->deadline_.cancel();
    if (ec) return self->close_now();  // the client went away
    self->flush();
  });
}

void Connection::response_done() {
  set_.handler->answered(req_, res_);
  ticker_.cancel();
  res_ = Response{};  // a stream's source goes with it
  body_queued_ = false;
  answer_written_ = true;
  finish_exchange();
}

// The next request once this one is both read and answered (an early answer may be written
// before its body is all read).
void Connection::finish_exchange() {
  if (!request_read_ || !answer_written_ || closed_) return;
  if (keep_alive_ && !set_.draining) return next_request();
  linger();
}

// Closes after an answer the client may still be sending into: the sending side shuts first and
// what still arrives is read and dropped for a moment, so the client reads the answer instead of
// a reset.
void Connection::linger() {
  phase_ = Phase::Closing;
  error_code ec;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ec);
  if (ec) return close_now();
  arm(std::chrono::milliseconds(2000));
  drop_input();
}

void Connection::drop_input() {
  buf_.clear();
  socket_.async_read_some(buf_.prepare(16 << 10), [self = shared_from_this()](const error_code& e, size_t n) {
    if (self->closed_) return;
    self->lingered_ += n;
    if (e || self->lingered_ > (1u << 20)) return self->close_now();
    self->drop_input();
  });
}

void Connection::close_now() {
  if (closed_) return;
  closed_ = true;
  error_code ec;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  deadline_.cancel();
  ticker_.cancel();
  res_ = Response{};
}

void Connection::arm(std::chrono::milliseconds d) {
  deadline_.expires_after(d);
  deadline_.async_wait([weak = weak_from_this()](const error_code& ec) {
    if (ec) return;
    if (auto self = weak.lock()) self->close_now();
  });
}

}  // namespace kiln::server::http
