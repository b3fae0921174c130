#include "ops/cuda/kernel_trace.h"

#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ops/cuda/cuda_error.h"

namespace kiln::ops::cuda {
namespace {

std::mutex& mu() {
  static std::mutex m;
  return m;
}
std::vector<const void*>& symbols() {
  static std::vector<const void*> s;
  return s;
}
KernelTraceRecord* ring = nullptr;  // device memory while tracing

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw_error(std::string("KILN_KERNEL_TRACE: ") + what + ": " + cudaGetErrorString(err));
}

const char* trace_path() {
  const char* p = std::getenv("KILN_KERNEL_TRACE");
  return p && *p ? p : nullptr;
}

void point_all_at(KernelTraceRecord* buf) {
  for (const void* s : symbols()) check(cudaMemcpyToSymbol(s, &buf, sizeof(buf)), "cudaMemcpyToSymbol");
}

// Unhooks every translation unit (no kernel may write into the ring once it is freed) and frees
// the ring; never throws.
void release_ring() noexcept {
  try {
    point_all_at(nullptr);
  } catch (const std::exception& e) {
    spdlog::warn("{}", e.what());
  }
  cudaFree(ring);
  cudaGetLastError();
  ring = nullptr;
}

void write_trace() {  // under mu(), ring set; kernel_trace_end frees it
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<KernelTraceRecord> recs(2 * kKernelTraceSlots);
  check(cudaMemcpy(recs.data(), ring, recs.size() * sizeof(KernelTraceRecord), cudaMemcpyDeviceToHost), "cudaMemcpy");
  std::erase_if(recs, [](const KernelTraceRecord& r) { return r.grid_id == 0; });
  std::sort(recs.begin(), recs.end(), [](const auto& a, const auto& b) { return a.enter_ns < b.enter_ns; });
  std::map<uint64_t, std::string> names;  // the name strings live in the kernels' modules
  for (const auto& r : recs) {
    if (names.count(r.name)) continue;
    std::string name;  // byte by byte: a longer read could run past the end of its module
    for (const char* at = reinterpret_cast<const char*>(r.name); at && name.size() < 120; ++at) {
      char c = 0;
      if (cudaMemcpy(&c, at, 1, cudaMemcpyDeviceToHost) != cudaSuccess) {
        cudaGetLastError();
        break;
      }
      if (!c) break;
      name += c;
    }
    names[r.name] = r.ctas == 0 ? "phase" : name.empty() ? "?" : name;
  }
  FILE* f = std::fopen(trace_path(), "w");
  if (!f) {
    spdlog::warn("KILN_KERNEL_TRACE: cannot write {}", trace_path());
    return;
  }
  std::fprintf(f, "grid_id,kernel,enter_ns,release_ns,ctas,threads\n");
  for (const auto& r : recs)
    std::fprintf(f, "%llu,%s,%llu,%llu,%llu,%llu\n", static_cast<unsigned long long>(r.grid_id), names[r.name].c_str(),
                 static_cast<unsigned long long>(r.enter_ns), static_cast<unsigned long long>(r.release_ns),
                 static_cast<unsigned long long>(r.ctas), static_cast<unsigned long long>(r.threads));
  std::fclose(f);
  spdlog::warn("KILN_KERNEL_TRACE: {} kernels written to {}", recs.size(), trace_path());
}

}  // namespace

bool register_kernel_trace_symbol(const void* symbol) {
  std::lock_guard<std::mutex> lock(mu());
  symbols().push_back(symbol);
  return true;
}

void kernel_trace_begin() noexcept {
  if (!trace_path()) return;
  std::lock_guard<std::mutex> lock(mu());
  if (ring) return;
  const size_t bytes = 2 * kKernelTraceSlots * sizeof(KernelTraceRecord);
  try {
    check(cudaMalloc(&ring, bytes), "cudaMalloc");
    check(cudaMemset(ring, 0, bytes), "cudaMemset");
    point_all_at(ring);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  } catch (const std::exception& e) {  // a diagnostic must not stop the backend: run untraced
    spdlog::warn("{} (tracing off)", e.what());
    release_ring();
    return;
  }
  spdlog::warn("KILN_KERNEL_TRACE: stamping every PDL kernel's start into {} ({} translation units)", trace_path(),
               symbols().size());
}

void kernel_trace_end() noexcept {
  std::lock_guard<std::mutex> lock(mu());
  if (!ring) return;
  try {
    write_trace();
  } catch (const std::exception& e) {  // a diagnostic must not take the process down at exit
    spdlog::warn("{}", e.what());
  }
  release_ring();
}

}  // namespace kiln::ops::cuda
