// The Backend interface's host-side defaults: backends whose ops finish when they return (the CPU)
// have nothing to overlap, so a download completes at once and marks read the host clock.
#include "ops/backend.h"

#include <chrono>
#include <cstring>
#include <vector>

namespace kiln::ops {

std::shared_ptr<void> Backend::start_download(const Tensor& src) {
  auto bytes = std::make_shared<std::vector<char>>(src.nbytes());
  download(bytes->data(), src);
  return bytes;
}

void Backend::finish_download(const std::shared_ptr<void>& started, void* dst) {
  const auto& bytes = *static_cast<const std::vector<char>*>(started.get());
  std::memcpy(dst, bytes.data(), bytes.size());
}

std::shared_ptr<void> Backend::mark() {
  synchronize();
  return std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
}

double Backend::elapsed_seconds(const std::shared_ptr<void>& a, const std::shared_ptr<void>& b) {
  using T = std::chrono::steady_clock::time_point;
  return std::chrono::duration<double>(*static_cast<const T*>(b.get()) - *static_cast<const T*>(a.get())).count();
}

}  // namespace kiln::ops
