// Helpers for backend parity tests: random host data, device copies, poisoned outputs and a
// normalised error (max |a - b| / max |a|).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ops/backend.h"

namespace kiln::test {

struct Backends {
  std::unique_ptr<ops::Backend> cpu = ops::make_cpu_backend();
  std::unique_ptr<ops::Backend> gpu;
  Backends() {
    if (ops::cuda_available()) gpu = ops::make_cuda_backend();
  }
};

// One process-wide pair: creating a CUDA context per test would dominate the run time.
inline Backends& backends() {
  static Backends b;
  return b;
}

// Sets the GPU backend's GEMM activation dtype for one scope (the backends are process-wide).
struct GpuActivations {
  explicit GpuActivations(DType t) { backends().gpu->set_activation_dtype(t); }
  ~GpuActivations() { backends().gpu->set_activation_dtype(DType::F32); }
  GpuActivations(const GpuActivations&) = delete;
  GpuActivations& operator=(const GpuActivations&) = delete;
};

// Sets the GPU backend's expert GEMM activation dtype for one scope; back to following the rest after.
struct GpuExpertActivations {
  explicit GpuExpertActivations(DType t) { backends().gpu->set_expert_activation_dtype(t); }
  ~GpuExpertActivations() { backends().gpu->set_expert_activation_dtype(backends().gpu->activation_dtype()); }
  GpuExpertActivations(const GpuExpertActivations&) = delete;
  GpuExpertActivations& operator=(const GpuExpertActivations&) = delete;
};

// Sets an environment variable for one scope and restores what was there (the CUDA backend's
// A/B switches that are read per call); a null value unsets it.
struct ScopedEnv {
  ScopedEnv(std::string name, const char* value) : name_(std::move(name)) {
    const char* was = std::getenv(name_.c_str());
    had_ = was != nullptr;
    if (was) saved_ = was;
    if (value)
      setenv(name_.c_str(), value, 1);
    else
      unsetenv(name_.c_str());
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), saved_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, saved_;
  bool had_ = false;
};

#define KILN_NEED_GPU() \
  if (!::kiln::test::backends().gpu) GTEST_SKIP() << "no CUDA GPU (or a build without CUDA)"

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Rounds through bf16 so CPU (f32) and GPU (bf16 weights) see the same values.
inline std::vector<float> bf16_round(std::vector<float> v) {
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

// A tensor on one backend holding `v` (as f32 or bf16).
inline ops::OwnedTensor put(ops::Backend& be, const std::vector<float>& v, DType dt = DType::F32) {
  ops::OwnedTensor t = be.alloc(dt, {static_cast<int64_t>(v.size())});
  if (dt == DType::F32) {
    be.upload(t.t, v.data());
  } else {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
    be.upload(t.t, h.data());
  }
  return t;
}
template <typename T>
inline ops::OwnedTensor put_raw(ops::Backend& be, const std::vector<T>& v, DType dt) {
  ops::OwnedTensor t = be.alloc(dt, {static_cast<int64_t>(v.size())});
  be.upload(t.t, v.data());
  return t;
}
// An output buffer filled with NaN, so anything the op fails to write shows up.
inline ops::OwnedTensor poisoned(ops::Backend& be, size_t n) {
  return put(be, std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()));
}
inline std::vector<float> get(ops::Backend& be, const ops::OwnedTensor& t) {
  std::vector<float> v(static_cast<size_t>(t.t.numel()));
  be.download(v.data(), t.t);
  return v;
}

inline double norm_err(const std::vector<float>& ref, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    num = std::max(num, std::fabs(static_cast<double>(ref[i]) - got[i]));
    den = std::max(den, std::fabs(static_cast<double>(ref[i])));
  }
  return num / std::max(den, 1e-12);
}

// A latent pool after an op wrote some of its rows into NaN poison: the same values are written on
// both backends (counted into `written`), each within a few f32 ulps, or one bf16 ulp (2^-7
// relative) when the pool is bf16 (f32 sums in another order may round the other way).
inline void compare_pool(const std::vector<float>& want, const std::vector<float>& got, bool bf16,
                         const std::string& what, int64_t& written) {
  for (size_t i = 0; i < want.size(); ++i) {
    const float a = want[i], b = got[i];
    ASSERT_EQ(std::isnan(a), std::isnan(b)) << what << ", pool[" << i << "]";
    if (std::isnan(a)) continue;
    ++written;
    const float tol = bf16 ? std::ldexp(std::fabs(a), -7) : 1e-5f * (1 + std::fabs(a));
    ASSERT_LE(std::fabs(a - b), tol) << what << ", pool[" << i << "]";
  }
}

}  // namespace kiln::test
