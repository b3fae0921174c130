#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>
#include <vector>

#include "core/error.h"

namespace kiln {

namespace fs = std::filesystem;
using json = nlohmann::json;

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  KILN_CHECK(fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    fail("{}: truncated file ({} bytes; a safetensors file starts with an 8-byte header length)", path, size_);
  }
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  KILN_CHECK(map_ != MAP_FAILED, "{}: cannot mmap: {}", path, std::strerror(errno));
  const auto* base = static_cast<const unsigned char*>(map_);
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);
  KILN_CHECK(header_len <= size_ - 8, "{}: corrupt header: header length {} exceeds the file size {}", path, header_len,
             size_);
  json header;
  try {
    header = json::parse(std::string(reinterpret_cast<const char*>(base + 8), header_len));
  } catch (const json::exception& e) {
    fail("{}: corrupt header: not valid JSON ({})", path, e.what());
  }
  KILN_CHECK(header.is_object(), "{}: corrupt header: not a JSON object", path);
  const size_t data_start = 8 + header_len, data_size = size_ - data_start;
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> spans;  // [begin, end) and tensor, for the layout check
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    try {
      KILN_CHECK(info.is_object() && info.contains("dtype") && info.contains("shape") && info.contains("data_offsets"),
                 "needs dtype, shape and data_offsets");
      SafetensorsEntry e;
      e.name = name;
      e.file = path;
      e.dtype = dtype_from_safetensors(info["dtype"].get<std::string>());
      KILN_CHECK(info["shape"].is_array(), "shape must be an array, got {}", info["shape"].dump());
      for (auto& d : info["shape"]) {
        KILN_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0, "shape entries must be non-negative integers");
        e.shape.push_back(d.get<int64_t>());
      }
      const json& off = info["data_offsets"];
      KILN_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
                 "data_offsets must be [begin, end], two non-negative integers");
      const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
      KILN_CHECK(b <= en, "data_offsets [{}, {}] are reversed", b, en);
      KILN_CHECK(en <= data_size, "data ends at byte {} but the file holds only {} data bytes (truncated file)", en,
                 data_size);
      size_t expect = 0;
      KILN_CHECK(!__builtin_mul_overflow(static_cast<size_t>(shape_numel(e.shape)), dtype_size(e.dtype), &expect),
                 "shape {} of {} needs over 2^64 bytes", shape_str(e.shape), dtype_name(e.dtype));
      KILN_CHECK(en - b == expect, "shape {} of {} needs {} bytes but data_offsets span {}", shape_str(e.shape),
                 dtype_name(e.dtype), expect, en - b);
      e.data = base + data_start + b;
      e.nbytes = expect;
      spans.emplace_back(b, en, name);
      entries_.emplace(name, std::move(e));
    } catch (const Error& err) {
      fail("{}: tensor \"{}\": {}", path, name, err.what());
    } catch (const json::exception& err) {
      fail("{}: tensor \"{}\": malformed header entry ({})", path, name, err.what());
    }
  }
  // The data must be the tensors back to back, as the format requires: overlapping spans would load
  // one tensor's bytes as another's, silently, and holes hide data no tensor names.
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;
  for (const auto& [b, en, name] : spans) {
    KILN_CHECK(b >= at, "{}: tensor \"{}\": data_offsets [{}, {}] overlap the tensor before it (which ends at {})",
               path, name, b, en, at);
    KILN_CHECK(b == at, "{}: tensor \"{}\": data_offsets [{}, {}] leave bytes [{}, {}) that no tensor holds", path,
               name, b, en, at, b);
    at = en;
  }
  KILN_CHECK(at == data_size, "{}: {} data bytes after the last tensor's (which ends at {}) that no tensor holds", path,
             data_size - at, at);
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ && map_ != MAP_FAILED) ::munmap(map_, size_);
}

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  const fs::path d(dir);
  KILN_CHECK(fs::is_directory(d), "model directory {} does not exist", dir);
  std::vector<std::string> shard_files;
  if (fs::exists(d / "model.safetensors.index.json")) {
    const std::string ip = (d / "model.safetensors.index.json").string();
    std::ifstream f(ip);
    json idx;
    try {
      idx = json::parse(f);
    } catch (const json::exception& e) {
      fail("{}: not valid JSON ({})", ip, e.what());
    }
    KILN_CHECK(idx.contains("weight_map") && idx["weight_map"].is_object(), "{}: missing \"weight_map\" object", ip);
    std::set<std::string> uniq;
    for (auto& [name, file] : idx["weight_map"].items()) {
      KILN_CHECK(file.is_string(), "{}: weight_map entry \"{}\" is not a file name", ip, name);
      uniq.insert(file.get<std::string>());
    }
    shard_files.assign(uniq.begin(), uniq.end());
    for (const auto& s : shard_files) {
      KILN_CHECK(s.find("..") == std::string::npos && s.find('/') == std::string::npos,
                 "{}: shard name \"{}\" must be a plain file name", ip, s);
      KILN_CHECK(fs::exists(d / s), "{}: shard {} is listed but missing", ip, (d / s).string());
    }
  } else if (fs::exists(d / "model.safetensors")) {
    shard_files.push_back("model.safetensors");
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json", dir);
  }
  for (const auto& s : shard_files) {
    files_.push_back(std::make_unique<SafetensorsFile>((d / s).string()));
    for (const auto& [name, e] : files_.back()->entries()) {
      auto [it, inserted] = index_.emplace(name, &e);
      KILN_CHECK(inserted, "tensor \"{}\" appears in both {} and {}", name, it->second->file, e.file);
    }
  }
}

const SafetensorsEntry* Checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

}  // namespace kiln
