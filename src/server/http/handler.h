// What the front end asks of the application: routing and auth from a request's head, the answer
// to a whole request, error answers in its format, and a note of each answer (for metrics).
#pragma once

#include <optional>
#include <string>

#include "server/http/message.h"

namespace kiln::server::http {

class Handler {
 public:
  virtual ~Handler() = default;
  // After the head, before any body is read: an answer now (a missing API key, an unknown route),
  // or nullopt to read the body and call handle(). A body answered here is read on and dropped.
  virtual std::optional<Response> screen(const Request& head) = 0;
  // Runs on an I/O thread: it must not wait on the engine (a stream's provider is pulled later).
  virtual void handle(Request& req, Response& res) = 0;
  virtual Response error(int status, const std::string& message) = 0;
  virtual void answered(const Request& req, const Response& res) = 0;  // for the metrics
};

}  // namespace kiln::server::http
