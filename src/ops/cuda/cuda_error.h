// Error raising for CUDA sources, free of fmt (nvcc and fmt's compile-time format checks do not
// mix): throw_error raises the usual kiln::Error.
#pragma once

#include <string>

namespace kiln::ops::cuda {
[[noreturn]] void throw_error(const std::string& what);
}  // namespace kiln::ops::cuda

#define KILN_REQUIRE(cond, msg)                       \
  do {                                                \
    if (!(cond)) ::kiln::ops::cuda::throw_error(msg); \
  } while (0)
