// Reading one request from the bytes a connection received, with no I/O of its own, so that the
// connection (connection.h) and the fuzz target (fuzz/fuzz_http_request.cc) run the same code:
// Beast's parser with the limits applied as bytes arrive, the head judged once it is complete
// (request_head.h), and a body over the limit read on and dropped (capped_body.h).
#pragma once

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>

#include <optional>

#include "server/http/capped_body.h"
#include "server/http/limits.h"
#include "server/http/message.h"
#include "server/http/request_head.h"

namespace kiln::server::http {

class RequestReader {
 public:
  enum class Step {
    NeedMore,  // everything in the buffer was used; read more
    HeadDone,  // the head is complete (once per request): screen it, then feed on
    Done,      // the request is complete; what follows in the buffer is the next one
    Refused,   // malformed or over a limit (refusal()); the connection cannot go on
  };

  explicit RequestReader(const Limits& limits);
  void reset();  // ready for the connection's next request

  // Parses from `buf`, consuming what it uses.
  Step feed(boost::beast::flat_buffer& buf);

  const Request& head() const { return req_; }
  // A refusal of a well-framed request from its head (413 from Content-Length): answer it (after
  // screening: a missing key is told first), drop the body, and go on unless it says close.
  const std::optional<Refusal>& head_refusal() const { return head_refusal_; }
  const Refusal& refusal() const { return refusal_; }
  void drop_body() { parser_->get().body().limit = 0; }
  bool body_over() const { return parser_->get().body().over; }
  bool expects_continue() const;
  // The whole request (after Done); the reader is then to be reset().
  Request take();

 private:
  using Parser = boost::beast::http::request_parser<CappedBody>;
  void read_head();

  const Limits& limits_;
  std::optional<Parser> parser_;
  bool head_seen_ = false;
  size_t head_used_ = 0;  // bytes of the head Beast has consumed (the request line once whole)
  Request req_;
  std::optional<Refusal> head_refusal_;
  Refusal refusal_;
};

}  // namespace kiln::server::http
