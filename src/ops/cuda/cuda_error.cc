#include "ops/cuda/cuda_error.h"

#include "core/error.h"

namespace kiln::ops::cuda {

void throw_error(const std::string& what) {
  throw Error(what);
}

}  // namespace kiln::ops::cuda
