#include "bench/progress.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>

namespace kiln::bench {

ProgressBar::ProgressBar(std::string label, bool enabled)
    : label_(std::move(label)),
      enabled_(enabled && spdlog::get_level() <= spdlog::level::info),
      tty_(isatty(STDERR_FILENO) != 0) {}

void ProgressBar::update(const RunProgress& p) {
  if (!enabled_ || p.total <= 0) return;
  if (p.elapsed_s > last_t_) {
    rate_ = static_cast<double>(p.token_events - last_events_) / (p.elapsed_s - last_t_);
    last_t_ = p.elapsed_s;
    last_events_ = p.token_events;
  }
  const int64_t finished = p.completed + p.failed;
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(finished * kWidth / p.total);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    std::fprintf(stderr, "\r%s [%s] %lld/%lld done, %lld failed, %lld open, %.0f tok/s, %.1f s\x1b[K", label_.c_str(),
                 bar.c_str(), static_cast<long long>(finished), static_cast<long long>(p.total),
                 static_cast<long long>(p.failed), static_cast<long long>(p.in_flight), rate_, p.elapsed_s);
    std::fflush(stderr);
    return;
  }
  const int decile = static_cast<int>(finished * 10 / p.total);
  if (decile != last_decile_) {
    last_decile_ = decile;
    spdlog::info("{}: {}/{} done, {} failed, {:.1f} s", label_, finished, p.total, p.failed, p.elapsed_s);
  }
}

void ProgressBar::finish(const RunProgress& p) {
  if (!enabled_) return;
  update(p);
  if (tty_) std::fprintf(stderr, "\n");
}

}  // namespace kiln::bench
