#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace kiln {

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  // Checked: a checkpoint's shape [2^62, 4] must not wrap to 0 elements and pass as empty.
  int64_t n = 1;
  for (int64_t d : s)
    KILN_CHECK(d >= 0 && !__builtin_mul_overflow(n, d, &n), "shape {} has a negative dimension or over 2^63 elements",
               shape_str(s));
  return n;
}

void Buffer::Free::operator()(void* p) const {
  std::free(p);
}

Buffer::Buffer(size_t nbytes) : size_(nbytes) {
  size_t rounded = (nbytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  KILN_CHECK(p != nullptr, "out of host memory allocating {} bytes", nbytes);
  std::memset(p, 0, rounded == 0 ? 64 : rounded);
  ptr_.reset(p);
}

HostTensor::HostTensor(DType dtype, Shape shape) {
  size_t n = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  buf = Buffer(n);
  t = Tensor{buf.data(), dtype, std::move(shape), Device::CPU};
}

}  // namespace kiln
