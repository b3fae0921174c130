// Tensor: a non-owning view {data, dtype, shape, device}. Views are contiguous row-major unless an
// op's contract says otherwise. Buffer: owning host memory (64-byte aligned) that views point into.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace kiln {

enum class Device : uint8_t { CPU, CUDA };

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3, 4]"
int64_t shape_numel(const Shape& s);

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  Device device = Device::CPU;

  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[static_cast<size_t>(i < 0 ? i + static_cast<int>(shape.size()) : i)]; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  float* f32() const { return as<float>(); }
  bool empty() const { return data == nullptr; }
};

class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t nbytes);
  void* data() const { return ptr_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> ptr_;
  size_t size_ = 0;
};

// A host tensor that owns its memory.
struct HostTensor {
  Buffer buf;
  Tensor t;
  HostTensor() = default;
  HostTensor(DType dtype, Shape shape);
  float* f32() const { return t.f32(); }
  const Shape& shape() const { return t.shape; }
};

}  // namespace kiln
