// Errors that say what went wrong and where: every message names the thing at fault (a file, a
// tensor, a config field, a request parameter); the C++ source location rides along for logs.
#pragma once

#include <fmt/format.h>

#include <source_location>
#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, std::source_location loc = std::source_location::current())
      : std::runtime_error(what), message_(what), loc_(loc) {}
  const std::source_location& where() const { return loc_; }
  // The whole message: what() stops at a NUL byte, which text from a request or a file may hold.
  const std::string& message() const { return message_; }

 private:
  std::string message_;
  std::source_location loc_;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace kiln

// KILN_CHECK(cond, "format {}", args...): throws kiln::Error with the formatted message.
#define KILN_CHECK(cond, ...)                                   \
  do {                                                          \
    if (!(cond)) throw ::kiln::Error(fmt::format(__VA_ARGS__)); \
  } while (0)
