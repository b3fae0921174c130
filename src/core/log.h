// Logging: spdlog to stderr, so stdout stays clean for --json output.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace kiln {

// Sets the global level from a name (trace, debug, info, warn, error, off).
void set_log_level(const std::string& level);

// A progress line for long work (checkpoint loading, benchmarks): redraws in place on a terminal,
// prints every ~10% otherwise.
class Progress {
 public:
  Progress(std::string label, size_t total);
  void advance(size_t n = 1);
  void finish();

 private:
  std::string label_;
  size_t total_, done_ = 0;
  int last_decile_ = -1;
  bool tty_;
  bool finished_ = false;
};

}  // namespace kiln
