// Judging a request from its head alone, before any of its body is read: framing (RFC 9112 §6:
// one framing per request, anything else refused and the connection closed, since what follows
// cannot be told from a smuggled request), limits, and the status a parse error deserves.
#pragma once

#include <boost/beast/http/error.hpp>

#include <optional>
#include <string>
#include <string_view>

#include "server/http/limits.h"
#include "server/http/message.h"

namespace kiln::server::http {

struct Refusal {
  int status = 400;
  std::string message;
  bool close = true;  // the connection cannot go on (its framing is unknown)
};

// What the head says of the body to come.
struct HeadFacts {
  bool http10 = false;
  bool chunked = false;                    // Beast found chunked as the last transfer coding
  std::optional<uint64_t> content_length;  // Beast's parsed value
  size_t field_count = 0;
};

// A refusal for a head Beast accepted: a transfer coding that is not chunked-last (its length
// unknowable), chunked in HTTP/1.0, too many fields, or a Content-Length over the body limit (413,
// decided here rather than after reading; close set when it is past what is drained, too).
std::optional<Refusal> judge_head(const Request& head, const HeadFacts& facts, const Limits& limits);

// The status for a Beast parse error: 414 when the request line alone is past its limit (while
// `line_done` is false: Beast consumes the line once it is whole), 431 when the head is, 413 for a
// chunked body past the drain bound, 400 for everything malformed.
Refusal refusal_for(const boost::beast::error_code& ec, std::string_view unparsed, bool line_done,
                    const Limits& limits);

// 414 while the request line is still being read and already longer than allowed.
std::optional<Refusal> check_request_line(std::string_view unparsed, const Limits& limits);

// The target's path, percent-decoded ("%00" gives a NUL; a bad escape is kept as sent).
std::string decode_path(std::string_view target);

const char* reason_phrase(int status);

}  // namespace kiln::server::http
