// Per-op GPU time for finding where a step goes (KILN_OP_PROFILE=1): every op the backend runs is
// bracketed by CUDA events, and the totals per op (linears per shape) print when the backend is
// destroyed, largest first (each op's first call apart). Events cannot sit in a captured graph,
// so profiling turns graphs off.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kiln::ops::cuda {

// KILN_OP_SKIP=prefix[,prefix...]: the ops whose profile name starts with one of these are not
// run. Timing only (outputs are wrong): a decode graph without an op, against the whole step,
// gives that op's cost where it runs overlapped with its neighbours (programmatic dependent
// launch), which Nsight's kernel-by-kernel times do not (scripts/op-ablation.sh). The router is
// replaced by a one-launch stand-in with fixed choices (cuda::router_stand_in), so that the MoE
// reads as many experts without it. Warns when set, and on destruction names every prefix that
// matched no op (a typo would read as a free op).
class OpSkip {
 public:
  OpSkip();
  ~OpSkip();
  OpSkip(const OpSkip&) = delete;
  OpSkip& operator=(const OpSkip&) = delete;

  bool empty() const { return prefixes_.empty(); }
  bool skips(const std::string& name);  // counts the match

 private:
  std::vector<std::string> prefixes_;
  std::vector<int64_t> hits_;
};

class OpProfile {
 public:
  static bool requested();
  ~OpProfile();  // prints the table

  // Brackets one op on `stream`.
  class Scope {
   public:
    Scope(OpProfile* p, std::string name, cudaStream_t s);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpProfile* p_;
    std::string name_;
    cudaStream_t s_;
    cudaEvent_t start_ = nullptr;
  };

 private:
  struct Pending {
    std::string name;
    cudaEvent_t start, stop;
  };
  void flush();  // waits for pending events and adds them to the totals
  cudaEvent_t event();

  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> free_;
  std::map<std::string, std::pair<double, int64_t>> totals_;  // name -> (ms, calls), first calls left out
  std::map<std::string, double> first_;                       // name -> ms of its first call
  double first_total_ = 0;
};

}  // namespace kiln::ops::cuda
