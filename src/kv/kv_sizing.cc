#include "kv/kv_sizing.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace kiln::kv {

KvCachePlan plan_kv_cache(const KvCacheSizing& s, int64_t block_size, int64_t bytes_per_token, int64_t free_bytes,
                          int64_t max_tokens) {
  KILN_CHECK(block_size > 0 && bytes_per_token > 0, "internal: KV sizing needs a block size and bytes per token");
  KvCachePlan p;
  p.block_size = block_size;
  p.bytes_per_token = bytes_per_token;
  const int64_t bytes_per_block = block_size * bytes_per_token;
  const int64_t cap = std::max<int64_t>(1, (max_tokens + block_size - 1) / block_size);
  if (s.num_blocks > 0) {
    p.num_blocks = s.num_blocks;
    p.source = "fixed block count";
    return p;
  }
  int64_t budget = 0;
  if (s.memory_bytes > 0) {
    budget = s.memory_bytes;
    p.source = fmt::format("--kv-cache-memory {:.2f} GiB", static_cast<double>(budget) / (1 << 30));
  } else {
    KILN_CHECK(s.memory_fraction > 0 && s.memory_fraction <= 1, "KV memory fraction must be in (0, 1], got {}",
               s.memory_fraction);
    budget = static_cast<int64_t>(static_cast<double>(free_bytes) * s.memory_fraction);
    p.source =
        fmt::format("{:.0f}% of {:.2f} GiB free", s.memory_fraction * 100, static_cast<double>(free_bytes) / (1 << 30));
  }
  p.num_blocks = budget / bytes_per_block;
  KILN_CHECK(p.num_blocks > 0, "KV cache budget of {} bytes ({}) does not hold one block of {} tokens ({} bytes)",
             budget, p.source, block_size, bytes_per_block);
  if (p.num_blocks > cap) {
    p.num_blocks = cap;
    p.source += ", capped at max sequences x max length";
  }
  return p;
}

int64_t parse_memory_size(const std::string& text, const std::string& flag) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  double value = 0;
  try {
    size_t used = 0;
    value = i ? std::stod(text.substr(0, i), &used) : -1;
    if (used != i) value = -1;  // "1.2.3K": stod stops at the second dot
  } catch (...) {
    value = -1;
  }
  std::string unit = text.substr(i);
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  const bool binary = !unit.empty() && unit.back() == 'I';
  if (binary) unit.pop_back();
  const double base = binary ? 1024.0 : 1000.0;
  double mult = -1;
  if (unit.empty()) mult = 1;
  if (unit == "K") mult = base;
  if (unit == "M") mult = std::pow(base, 2);
  if (unit == "G") mult = std::pow(base, 3);
  if (unit == "T") mult = std::pow(base, 4);
  KILN_CHECK(value > 0 && mult > 0 && (!binary || unit.size() == 1),
             "{}: \"{}\" is not a memory size (expected e.g. 8GiB, 512MiB, 4G or a byte count)", flag, text);
  // At least a byte (0.5 would truncate to 0, which the sizing reads as "not given") and at most
  // 2^62 bytes (past int64 the conversion is undefined).
  const double bytes = value * mult;
  KILN_CHECK(bytes >= 1 && bytes <= 0x1p62, "{}: \"{}\" is {} bytes; give 1 byte to 4 EiB", flag, text, bytes);
  return static_cast<int64_t>(bytes);
}

}  // namespace kiln::kv
