// A Beast body that keeps at most `limit` bytes and drops the rest, counting them: an over-limit
// body is read to its end (so the connection's next request starts where it should) without the
// memory, and the request is then answered 413.
#pragma once

#include <boost/beast/core/buffers_range.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/optional.hpp>

#include <cstdint>
#include <string>

namespace kiln::server::http {

struct CappedBody {
  struct value_type {
    std::string data;
    size_t limit = 0;   // bytes kept; past it the body is dropped and `over` set
    bool over = false;  // more than `limit` bytes came
  };

  class reader {
   public:
    template <bool isRequest, class Fields>
    reader(boost::beast::http::header<isRequest, Fields>&, value_type& body) : body_(body) {}

    void init(const boost::optional<std::uint64_t>& length, boost::beast::error_code& ec) {
      ec = {};
      if (length && *length <= body_.limit) body_.data.reserve(static_cast<size_t>(*length));
    }

    template <class ConstBufferSequence>
    std::size_t put(const ConstBufferSequence& buffers, boost::beast::error_code& ec) {
      ec = {};
      std::size_t n = 0;
      for (const auto b : boost::beast::buffers_range_ref(buffers)) {
        n += b.size();
        if (body_.over) continue;
        if (body_.data.size() + b.size() > body_.limit) {
          std::string().swap(body_.data);
          body_.over = true;
          continue;
        }
        body_.data.append(static_cast<const char*>(b.data()), b.size());
      }
      return n;
    }

    void finish(boost::beast::error_code& ec) { ec = {}; }

   private:
    value_type& body_;
  };
};

}  // namespace kiln::server::http
