#include "server/http/request_reader.h"

#include <limits>

namespace kiln::server::http {

namespace bhttp = boost::beast::http;

namespace {

std::string_view unparsed(const boost::beast::flat_buffer& buf) {
  const auto d = buf.data();
  return {static_cast<const char*>(d.data()), d.size()};
}

}  // namespace

RequestReader::RequestReader(const Limits& limits) : limits_(limits) {
  reset();
}

// A fresh parser per request: Beast's parser reads one message.
void RequestReader::reset() {
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(limits_.max_header_bytes));
  // No body limit yet: a Content-Length past it would fail the head before the key is checked
  // (judge_head decides it instead); set once the head is in, it bounds a chunked body. The
  // largest value, not none: Beast 1.74 compares the length with the optional, and none is less.
  parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
  parser_->get().body().limit = limits_.max_body_bytes;
  head_seen_ = false;
  head_used_ = 0;
  req_ = Request{};
  head_refusal_.reset();
}

RequestReader::Step RequestReader::feed(boost::beast::flat_buffer& buf) {
  for (;;) {
    if (!parser_->is_header_done() && head_used_ == 0) {
      if (auto r = check_request_line(unparsed(buf), limits_)) {
        refusal_ = *r;
        return Step::Refused;
      }
    }
    if (parser_->is_done()) return Step::Done;
    if (buf.size() == 0) return Step::NeedMore;
    boost::beast::error_code ec;
    const size_t used = parser_->put(buf.data(), ec);
    // Bytes are used even when more are needed (a head, then part of a chunk's size line): the
    // parser must never see them twice.
    buf.consume(used);
    if (!head_seen_) head_used_ += used;
    const bool line_done = head_used_ > 0;
    if (ec == bhttp::error::need_more) return Step::NeedMore;
    if (ec) {
      refusal_ = refusal_for(ec, unparsed(buf), line_done, limits_);
      return Step::Refused;
    }
    if (parser_->is_header_done() && !head_seen_) {
      head_seen_ = true;
      read_head();
      HeadFacts facts;
      facts.http10 = req_.http10;
      facts.chunked = parser_->chunked();
      facts.field_count = req_.headers.size();
      if (parser_->content_length()) facts.content_length = *parser_->content_length();
      if (auto r = judge_head(req_, facts, limits_)) {
        if (r->status != 413) {
          refusal_ = *r;
          return Step::Refused;
        }
        head_refusal_ = r;
        drop_body();
      }
      parser_->body_limit(static_cast<std::uint64_t>(limits_.max_body_bytes) * limits_.drain_factor);
      return Step::HeadDone;
    }
    if (used == 0 && !parser_->is_done()) return Step::NeedMore;
  }
}

void RequestReader::read_head() {
  const auto& m = parser_->get();
  req_.method = std::string(m.method_string());
  req_.target = std::string(m.target());
  req_.path = decode_path(req_.target);
  req_.http10 = m.version() < 11;
  req_.keep_alive = m.keep_alive();
  for (const auto& f : m) req_.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
}

bool RequestReader::expects_continue() const {
  return !req_.http10 && req_.header("Expect") == "100-continue";
}

Request RequestReader::take() {
  req_.body = std::move(parser_->get().body().data);
  return std::move(req_);
}

}  // namespace kiln::server::http
