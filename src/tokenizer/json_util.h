// Internal: reading numbers from untrusted JSON. nlohmann's get<int>() on a float or an
// out-of-range value is undefined behaviour or a silent wrap; these check first.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>

#include "core/error.h"

namespace kiln::tok {

// Ids index dense tables; 4M is 16x the largest vocabulary in use and bounds memory on bad input.
constexpr uint64_t kMaxTokenId = uint64_t{1} << 22;

// A non-negative integer no larger than `max`; `what` names the field in the error.
inline uint64_t json_uint(const nlohmann::json& j, const char* what, uint64_t max) {
  KILN_CHECK(j.is_number_integer() && (j.is_number_unsigned() || j.get<int64_t>() >= 0) && j.get<uint64_t>() <= max,
             "tokenizer.json: {} must be an integer in [0, {}], got {}", what, max, j.dump());
  return j.get<uint64_t>();
}

inline uint32_t json_token_id(const nlohmann::json& j, const char* what) {
  return static_cast<uint32_t>(json_uint(j, what, kMaxTokenId - 1));
}

}  // namespace kiln::tok
