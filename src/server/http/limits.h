// What one connection may cost the server: bytes and fields of a request head, time for each
// phase of a request, pending bytes of a stream, and connections open at once.
#pragma once

#include <chrono>
#include <cstddef>

namespace kiln::server::http {

struct Limits {
  size_t max_request_line = 8 << 10;   // longer: 414
  size_t max_header_bytes = 64 << 10;  // request line and fields together; more: 431
  size_t max_header_count = 100;       // fields; more: 431
  size_t max_body_bytes = 8 << 20;     // larger: 413 (read on and dropped, see drain_factor)
  // An over-limit body is read on and dropped up to this many times the limit, so that the
  // connection's next request starts where it should; past it the connection is closed.
  size_t drain_factor = 8;
  std::chrono::milliseconds idle_timeout{30000};    // waiting for a request's first byte
  std::chrono::milliseconds header_timeout{10000};  // from a request's first byte to its head's end
  std::chrono::milliseconds body_timeout{60000};    // from the head's end to the body's end
  std::chrono::milliseconds write_timeout{30000};   // one write that makes no progress
  size_t max_pending_bytes = 4 << 20;               // a stream's bytes not yet taken by its client; more: closed
  size_t max_connections = 16384;                   // open at once; more get 503 and are closed
  // How often a response still being produced is pulled without a wake from its source: the
  // keep-alive byte of a JSON answer being computed, and a safety net for streams.
  std::chrono::milliseconds pull_interval{1000};
};

}  // namespace kiln::server::http
