// A rule a request's output must follow, token by token: tool_choice "required" or a named
// function forces the tool-call markup and JSON arguments. Rows of a constrained request are
// sampled on the host: the constraint masks the row's logits before the draw and hears about
// the token that was drawn. Lives on the engine thread only.
#pragma once

#include <cstdint>
#include <span>

namespace kiln {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets the logits of tokens not allowed next to -inf. At least one token must stay allowed
  // (a constraint that has nothing left to allow should allow the end-of-sequence token).
  virtual void mask(std::span<float> logits) = 0;
  // The token that was drawn (always one that mask() allowed).
  virtual void advance(int32_t token) = 0;
};

}  // namespace kiln
