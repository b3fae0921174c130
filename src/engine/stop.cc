#include "engine/stop.h"

#include <algorithm>
#include <utility>

namespace kiln {

std::string StopStringMatcher::feed(std::string_view piece) {
  if (matched()) return {};
  held_.append(piece);
  if (stops_.empty()) return std::exchange(held_, {});
  // The earliest occurrence of any stop string wins (the first listed on a tie).
  size_t best = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t at = held_.find(stops_[i]);
    if (at < best) {
      best = at;
      matched_ = static_cast<int>(i);
    }
  }
  if (best != std::string::npos) {
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > hold; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopStringMatcher::flush() {
  return std::exchange(held_, {});
}

const std::string& StopStringMatcher::matched_string() const {
  static const std::string none;
  return matched() ? stops_[static_cast<size_t>(matched_)] : none;
}

}  // namespace kiln
