// Runs one function per rank on its own thread over a thread group and rethrows the first failure
// after joining every thread, so a failing rank never leaves a thread behind.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/thread_communicator.h"

namespace kiln::test {

// The message each rank ended with ("" for a rank that returned normally).
inline std::vector<std::string> run_ranks_collect(int world_size, const std::function<void(dist::Communicator&)>& fn) {
  auto comms = dist::make_thread_communicators(world_size);
  std::vector<std::string> errors(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(*comms[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "(empty error)";
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// Fails the test (naming the rank) if any rank threw.
inline void run_ranks(int world_size, const std::function<void(dist::Communicator&)>& fn) {
  const auto errors = run_ranks_collect(world_size, fn);
  for (int r = 0; r < world_size; ++r)
    if (!errors[r].empty()) ADD_FAILURE() << "rank " << r << " of " << world_size << ": " << errors[r];
}

}  // namespace kiln::test
