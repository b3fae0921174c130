// The request and response the routes see, independent of the wire: the connection (connection.h)
// fills a Request from the parser and writes a Response, whole or as a stream it pulls from.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::server::http {

struct Request {
  std::string method;
  std::string target;  // as sent
  std::string path;    // the target's path, percent-decoded
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  bool keep_alive = true;
  bool http10 = false;

  // The first value of a header (names compare without case), or "".
  const std::string& header(std::string_view name) const;
};

// Where a streamed body goes. write() returns false when the bytes cannot be taken: the client is
// gone, or it stopped reading and its pending bytes passed the connection's bound.
struct DataSink {
  std::function<bool(const char* data, size_t n)> write;
  std::function<void()> done;
};

// A body produced in steps: called whenever the connection may take more (at first, when the
// response's source signals new output, and once a second). It must not block: it writes what is
// ready, and calls done() at the end. false drops the response and closes the connection.
using ContentProvider = std::function<bool(DataSink& sink)>;

// Wakes the connection when the stream has more to give (any thread; cheap, may be called often).
using Wake = std::function<void()>;

struct Response {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string content_type;
  std::string body;
  ContentProvider provider;             // set: the body is streamed (chunked)
  std::function<void(Wake)> subscribe;  // with provider: how the source wakes the connection
  bool close = false;                   // close the connection after this response

  void set_header(std::string name, std::string value) { headers.emplace_back(std::move(name), std::move(value)); }
  void set_content(std::string b, std::string type) {
    body = std::move(b);
    content_type = std::move(type);
  }
};

}  // namespace kiln::server::http
