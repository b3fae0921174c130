// Safetensors checkpoints: one model.safetensors, or model.safetensors.index.json + shards. Files
// are memory-mapped; every header is validated (JSON, dtypes, shapes, offsets inside the file).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  const void* data;  // into the mapping
  size_t nbytes;
  std::string file;  // for error messages
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
};

// All tensors of a checkpoint directory, by name.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);
  const std::string& dir() const { return dir_; }
  // nullptr when absent.
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, const SafetensorsEntry*>& tensors() const { return index_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsEntry*> index_;
};

}  // namespace kiln
