#include "model/rank_group.h"

#include <exception>

#include "core/error.h"
#include "model/deepseek_v3.h"

namespace kiln {

RankWorkers::RankWorkers(int world_size, std::function<void(int)> thread_init)
    : world_(world_size), init_(std::move(thread_init)), errors_(static_cast<size_t>(world_size)) {
  KILN_CHECK(world_size >= 1, "rank workers: world size {}", world_size);
  for (int r = 1; r < world_size; ++r) threads_.emplace_back([this, r] { loop(r); });
}

RankWorkers::~RankWorkers() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void RankWorkers::loop(int rank) {
  std::string init_error;
  if (init_) {
    try {
      init_(rank);
    } catch (const std::exception& e) {
      init_error = e.what();  // reported by every step this rank takes part in
    }
  }
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* fn;
    const std::function<void(int, const std::string&)>* on_error;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      on_error = on_error_;
    }
    std::string error = init_error;
    if (error.empty()) {
      try {
        (*fn)(rank);
      } catch (const std::exception& e) {
        error = e.what()[0] ? e.what() : "(empty error)";
      }
    }
    if (!error.empty() && on_error && *on_error) (*on_error)(rank, error);
    std::lock_guard lock(mu_);
    errors_[static_cast<size_t>(rank)] = std::move(error);
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

void RankWorkers::run(const std::function<void(int)>& fn,
                      const std::function<void(int, const std::string&)>& on_error) {
  {
    std::lock_guard lock(mu_);
    fn_ = &fn;
    on_error_ = &on_error;
    pending_ = world_ - 1;
    for (auto& e : errors_) e.clear();
    ++generation_;
  }
  cv_.notify_all();
  std::string error;
  try {
    fn(0);
  } catch (const std::exception& e) {
    error = e.what()[0] ? e.what() : "(empty error)";
    if (on_error) on_error(0, error);
  }
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  errors_[0] = std::move(error);
  for (int r = 0; r < world_; ++r)
    if (!errors_[static_cast<size_t>(r)].empty()) {
      if (world_ == 1) throw Error(errors_[0]);
      throw Error(fmt::format("rank {} of {}: {}", r, world_, errors_[static_cast<size_t>(r)]));
    }
}

void RankGroup::run(const std::function<void(int)>& fn) {
  workers->run(fn, [this](int rank, const std::string& why) { comms[static_cast<size_t>(rank)]->abort(why); });
}

RankGroup::~RankGroup() {
  workers.reset();
  peers.clear();
  backends.clear();
}

}  // namespace kiln
