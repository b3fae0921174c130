// The progress bar of `kiln bench serve` on stderr: redrawn in place on a terminal (done, failed,
// open streams, live tok/s), a line every 10% otherwise; silent when the log level is above info.
#pragma once

#include <string>

#include "bench/client.h"

namespace kiln::bench {

class ProgressBar {
 public:
  ProgressBar(std::string label, bool enabled);
  void update(const RunProgress& p);
  // Ends the line (terminal) or prints the last figures (log).
  void finish(const RunProgress& p);

 private:
  std::string label_;
  bool enabled_, tty_;
  int last_decile_ = 0;  // the log prints from 10% on
  double last_t_ = 0;
  int64_t last_events_ = 0;
  double rate_ = 0;  // token events/s over the last update interval
};

}  // namespace kiln::bench
