// libFuzzer target for the HTTP front end's request reading (src/server/http/request_reader.h):
// arbitrary bytes as what a connection receives (request lines, headers, chunked and
// Content-Length framing, pipelined requests), delivered in pieces whose sizes the input's first
// bytes choose, through the same reader the connections run. Beyond memory errors and undefined
// behaviour, a finding is: a body kept past the limit, a refusal with a status other than the
// documented ones, a request completed after a refusal, or a step that neither uses bytes nor
// asks for more.
#include <boost/asio/buffer.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "server/http/request_reader.h"

using namespace kiln::server::http;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // Small limits, so that the fuzzer reaches them.
  Limits limits;
  limits.max_request_line = 64;
  limits.max_header_bytes = 256;
  limits.max_header_count = 8;
  limits.max_body_bytes = 32;
  limits.drain_factor = 4;
  const size_t piece = 1 + data[0] % 64;
  const bool screen_drops = data[1] & 1;  // as the server does for a refused route or key
  std::string_view rest(reinterpret_cast<const char*>(data + 2), size - 2);
  RequestReader reader(limits);
  boost::beast::flat_buffer buf;
  int requests = 0;
  while (!rest.empty() || buf.size() > 0) {
    const size_t n = std::min(piece, rest.size());
    if (n > 0) {
      auto b = buf.prepare(n);
      std::memcpy(b.data(), rest.data(), n);
      buf.commit(n);
      rest.remove_prefix(n);
    }
    bool refused = false;
    for (int steps = 0; steps < 10000; ++steps) {
      const size_t before = buf.size();
      const RequestReader::Step s = reader.feed(buf);
      check(buf.size() <= before);
      if (s == RequestReader::Step::NeedMore) break;
      if (s == RequestReader::Step::Refused) {
        const int st = reader.refusal().status;
        check(st == 400 || st == 413 || st == 414 || st == 431);
        refused = true;
        break;
      }
      if (s == RequestReader::Step::HeadDone) {
        if (screen_drops) reader.drop_body();
        continue;
      }
      // Done: the request whole, its body within the limit (or dropped), then the next one.
      const bool over = reader.body_over();
      const Request r = reader.take();
      check(r.body.size() <= limits.max_body_bytes);
      check(!over || r.body.empty());
      check(!r.method.empty());
      reader.reset();
      ++requests;
      check(requests < 100000);
    }
    if (refused) return 0;  // the connection closes here
    if (n == 0) break;      // no more input and the reader wants more
  }
  return 0;
}
