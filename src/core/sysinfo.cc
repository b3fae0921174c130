#include "core/sysinfo.h"

#include <fstream>
#include <sstream>
#include <string>

namespace kiln {

int64_t host_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream ss(line.substr(13));
    int64_t kib = 0;
    ss >> kib;
    return kib * 1024;
  }
  return 0;
}

}  // namespace kiln
