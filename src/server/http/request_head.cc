#include "server/http/request_head.h"

#include <fmt/format.h>

#include <cctype>

namespace kiln::server::http {

namespace beast_http = boost::beast::http;

const std::string& Request::header(std::string_view name) const {
  static const std::string none;
  auto same = [&](const std::string& n) {
    if (n.size() != name.size()) return false;
    for (size_t i = 0; i < n.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(n[i])) != std::tolower(static_cast<unsigned char>(name[i])))
        return false;
    return true;
  };
  for (const auto& [n, v] : headers)
    if (same(n)) return v;
  return none;
}

std::optional<Refusal> judge_head(const Request& head, const HeadFacts& facts, const Limits& limits) {
  if (facts.field_count > limits.max_header_count)
    return Refusal{431, fmt::format("more than {} header fields", limits.max_header_count)};
  const bool has_te = !head.header("Transfer-Encoding").empty();
  if (has_te && !facts.chunked)
    return Refusal{400, "a Transfer-Encoding whose last coding is not chunked leaves the body's length unknown"};
  if (facts.chunked && facts.http10) return Refusal{400, "chunked transfer coding is not HTTP/1.0"};
  if (facts.content_length && *facts.content_length > limits.max_body_bytes)
    return Refusal{413,
                   fmt::format("the request body is larger than the server's limit of {} bytes", limits.max_body_bytes),
                   /*close=*/*facts.content_length > limits.max_body_bytes * limits.drain_factor};
  return std::nullopt;
}

std::optional<Refusal> check_request_line(std::string_view unparsed, const Limits& limits) {
  const size_t eol = unparsed.substr(0, limits.max_request_line + 2).find("\r\n");
  if (eol == std::string_view::npos && unparsed.size() > limits.max_request_line + 1)
    return Refusal{414, fmt::format("the request line is longer than {} bytes", limits.max_request_line)};
  return std::nullopt;
}

Refusal refusal_for(const boost::beast::error_code& ec, std::string_view unparsed, bool line_done,
                    const Limits& limits) {
  if (ec == beast_http::error::header_limit) {
    if (!line_done)
      if (auto r = check_request_line(unparsed, limits)) return *r;
    return Refusal{431, fmt::format("the request head is larger than {} bytes", limits.max_header_bytes)};
  }
  if (ec == beast_http::error::body_limit)
    return Refusal{
        413, fmt::format("the request body is larger than the server's limit of {} bytes", limits.max_body_bytes)};
  if (ec == beast_http::error::bad_content_length) return Refusal{400, "a malformed or conflicting Content-Length"};
  if (ec == beast_http::error::bad_transfer_encoding)
    return Refusal{400, "a malformed Transfer-Encoding, or one together with Content-Length"};
  if (ec == beast_http::error::bad_chunk || ec == beast_http::error::bad_chunk_extension)
    return Refusal{400, "a malformed chunk in the request body"};
  return Refusal{400, fmt::format("a malformed request: {}", ec.message())};
}

std::string decode_path(std::string_view target) {
  const std::string_view path = target.substr(0, target.find('?'));
  std::string out;
  out.reserve(path.size());
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%' && i + 2 < path.size()) {
      const int hi = hex(path[i + 1]), lo = hex(path[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        continue;
      }
    }
    out.push_back(path[i]);
  }
  return out;
}

const char* reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

}  // namespace kiln::server::http
