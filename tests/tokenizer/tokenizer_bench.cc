// Encode throughput, single thread (a benchmark, not a test):
//   tokenizer_bench --tokenizer DIR --text FILE [--repeats N] [--chunk-bytes N]
// Prints one JSON line like tools/make_tokenizer_refs.py's `bench`, so both can be compared on
// the same machine and the same text. The word cache starts cold in the first repeat; the best
// repeat is reported, as the Python side does.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  std::string dir, file;
  int repeats = 3;
  size_t chunk_bytes = 0;  // 0: one call; else newline-aligned pieces (as make_tokenizer_refs.py cuts)
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokenizer")) dir = argv[i + 1];
    if (!std::strcmp(argv[i], "--text")) file = argv[i + 1];
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--chunk-bytes")) chunk_bytes = static_cast<size_t>(std::atol(argv[i + 1]));
  }
  if (dir.empty() || file.empty()) {
    std::fprintf(stderr, "usage: tokenizer_bench --tokenizer DIR --text FILE [--repeats N]\n");
    return 2;
  }
  std::ifstream f(file, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  std::vector<std::string_view> docs;
  if (chunk_bytes == 0) {
    docs.push_back(text);
  } else {
    size_t start = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\n' && i + 1 - start >= chunk_bytes) {
        docs.push_back(std::string_view(text).substr(start, i + 1 - start));
        start = i + 1;
      }
    }
    if (start < text.size()) docs.push_back(std::string_view(text).substr(start));
  }
  auto t_load = std::chrono::steady_clock::now();
  kiln::tok::Tokenizer tok = kiln::tok::Tokenizer::load(dir);
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  double best = 1e30, first = 0;
  size_t n_tokens = 0;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    n_tokens = 0;
    for (std::string_view d : docs) n_tokens += tok.encode(d, false).size();
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r == 0) first = dt;
    best = std::min(best, dt);
  }
  nlohmann::json out = {{"impl", "kiln"},
                        {"chunks", docs.size()},
                        {"bytes", text.size()},
                        {"tokens", n_tokens},
                        {"seconds", best},
                        {"seconds_cold_cache", first},
                        {"load_seconds", load_s},
                        {"mb_per_s", static_cast<double>(text.size()) / best / 1e6},
                        {"tokens_per_s", static_cast<double>(n_tokens) / best}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
