#include "ops/cuda/op_profile.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace kiln::ops::cuda {

OpSkip::OpSkip() {
  const char* v = std::getenv("KILN_OP_SKIP");
  for (std::string_view rest = v ? v : ""; !rest.empty();) {
    const size_t comma = rest.find(',');
    if (comma != 0) prefixes_.emplace_back(rest.substr(0, comma));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  hits_.assign(prefixes_.size(), 0);
  for (const std::string& p : prefixes_)
    spdlog::warn("KILN_OP_SKIP: ops named '{}*' are not run; outputs are wrong", p);
}

OpSkip::~OpSkip() {
  for (size_t i = 0; i < prefixes_.size(); ++i)
    if (hits_[i] == 0) spdlog::warn("KILN_OP_SKIP: '{}' matched no op", prefixes_[i]);
}

bool OpSkip::skips(const std::string& name) {
  for (size_t i = 0; i < prefixes_.size(); ++i)
    if (name.starts_with(prefixes_[i])) {
      ++hits_[i];
      return true;
    }
  return false;
}

bool OpProfile::requested() {
  const char* v = std::getenv("KILN_OP_PROFILE");
  return v != nullptr && *v != '\0' && *v != '0';
}

cudaEvent_t OpProfile::event() {
  if (free_.empty()) {
    cudaEvent_t e = nullptr;
    cudaEventCreate(&e);
    return e;
  }
  cudaEvent_t e = free_.back();
  free_.pop_back();
  return e;
}

OpProfile::Scope::Scope(OpProfile* p, std::string name, cudaStream_t s) : p_(p), name_(std::move(name)), s_(s) {
  if (!p_) return;
  start_ = p_->event();
  cudaEventRecord(start_, s_);
}

OpProfile::Scope::~Scope() {
  if (!p_) return;
  cudaEvent_t stop = p_->event();
  cudaEventRecord(stop, s_);
  p_->pending_.push_back({std::move(name_), start_, stop});
  if (p_->pending_.size() >= 4096) p_->flush();
}

void OpProfile::flush() {
  for (Pending& p : pending_) {
    cudaEventSynchronize(p.stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, p.start, p.stop);
    if (first_.try_emplace(p.name, ms).second) {  // a first call pays lazy loading and algorithm search
      first_total_ += ms;
    } else {
      auto& [total, calls] = totals_[p.name];
      total += ms;
      ++calls;
    }
    free_.push_back(p.start);
    free_.push_back(p.stop);
  }
  pending_.clear();
}

OpProfile::~OpProfile() {
  flush();
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  double all = 0;
  for (const auto& r : rows) all += r.second.first;
  std::fprintf(stderr,
               "op profile (GPU time between events, %.1f ms in all; the first call of each op, %.1f ms in all, "
               "is left out: it pays lazy module loading and algorithm search):\n",
               all, first_total_);
  for (const auto& [name, t] : rows)
    std::fprintf(stderr, "  %9.2f ms %5.1f%% %8lld calls %8.1f us/call  %s\n", t.first, 100 * t.first / all,
                 static_cast<long long>(t.second), 1e3 * t.first / static_cast<double>(t.second), name.c_str());
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

}  // namespace kiln::ops::cuda
