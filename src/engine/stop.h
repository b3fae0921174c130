// Stop strings over streamed text. Text arrives piece by piece (one detokenized token at a time),
// so a stop string may straddle token boundaries: text that could still be the start of a stop
// string is held back until the next pieces show whether it is.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kiln {

class StopStringMatcher {
 public:
  StopStringMatcher() = default;
  explicit StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // Adds `piece`; returns the text now known to be output. After a match the returned text ends
  // just before the stop string (which is not output), matched() is true and later calls return "".
  std::string feed(std::string_view piece);
  // The held-back text, at the end of the stream (it turned out not to be a stop string).
  std::string flush();

  bool matched() const { return matched_ >= 0; }
  const std::string& matched_string() const;

 private:
  std::vector<std::string> stops_;
  std::string held_;  // text not yet returned: a suffix that a stop string could start with
  int matched_ = -1;  // index into stops_
};

}  // namespace kiln
