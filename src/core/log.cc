#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include <cstdio>

namespace kiln {

void set_log_level(const std::string& level) {
  static bool init = [] {
    auto logger = spdlog::stderr_color_mt("kiln");
    logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    spdlog::set_default_logger(logger);
    return true;
  }();
  (void)init;
  spdlog::set_level(spdlog::level::from_str(level));
}

Progress::Progress(std::string label, size_t total)
    : label_(std::move(label)), total_(total), tty_(isatty(STDERR_FILENO) != 0) {}

void Progress::advance(size_t n) {
  done_ += n;
  if (spdlog::get_level() > spdlog::level::info || total_ == 0) return;
  int decile = static_cast<int>(done_ * 10 / total_);
  if (tty_) {
    std::fprintf(stderr, "\r%s: %zu/%zu (%d%%)", label_.c_str(), done_, total_, static_cast<int>(done_ * 100 / total_));
    std::fflush(stderr);
  } else if (decile != last_decile_) {
    last_decile_ = decile;
    spdlog::info("{}: {}/{} ({}%)", label_, done_, total_, decile * 10);
  }
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (tty_ && spdlog::get_level() <= spdlog::level::info && total_ > 0) std::fprintf(stderr, "\n");
}

}  // namespace kiln
