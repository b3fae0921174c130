// Facts about the host machine.
#pragma once

#include <cstdint>

namespace kiln {

// MemAvailable of /proc/meminfo, in bytes (0 when unreadable).
int64_t host_available_bytes();

}  // namespace kiln
