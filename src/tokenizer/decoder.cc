#include "tokenizer/decoder.h"

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {

using nlohmann::json;

namespace {

class Sequence : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& t) const override {
    for (const auto& d : steps_) d->decode_chain(t);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

// Byte-level tokens back to bytes; a token with a character outside the byte alphabet (an added
// token such as "<｜User｜>") is kept as its own UTF-8. The bytes are then repaired lossily.
class ByteLevel : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& t) const override {
    std::string bytes, tmp;
    for (const std::string& s : t) {
      if (byte_level_to_bytes(s, tmp)) {
        bytes += tmp;
      } else {
        bytes += s;
      }
    }
    t.assign(1, sanitize_utf8(bytes));
  }
};

// "<0xAB>" tokens become bytes; each run of them becomes its UTF-8 text, or one U+FFFD per byte
// when the run is not valid UTF-8.
class ByteFallback : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& t) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_len = 0;
    auto flush = [&] {
      if (run_len == 0) return;
      if (is_valid_utf8(run)) {
        out.push_back(run);
      } else {
        for (size_t k = 0; k < run_len; ++k) out.push_back("\xEF\xBF\xBD");
      }
      run.clear();
      run_len = 0;
    };
    for (std::string& s : t) {
      int byte = parse(s);
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
        ++run_len;
      } else {
        flush();
        out.push_back(std::move(s));
      }
    }
    flush();
    t = std::move(out);
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int parse(const std::string& s) {
    if (s.size() != 6 || s.compare(0, 3, "<0x") != 0 || s[5] != '>') return -1;
    int hi = hex(s[3]), lo = hex(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
};

class Fuse : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& t) const override {
    std::string all;
    for (const std::string& s : t) all += s;
    t.assign(1, all);
  }
};

class Replace : public Decoder {
 public:
  Replace(const json& pattern, std::string content) : content_(std::move(content)) {
    if (pattern.contains("String")) {
      regex_ = std::make_unique<Regex>(regex_escape(pattern["String"].get<std::string>()));
    } else if (pattern.contains("Regex")) {
      regex_ = std::make_unique<Regex>(pattern["Regex"].get<std::string>());
    } else {
      fail("tokenizer.json: Replace decoder pattern must hold \"String\" or \"Regex\"");
    }
  }
  void decode_chain(std::vector<std::string>& t) const override {
    for (std::string& s : t) {
      std::string out;
      size_t pos = 0, b, e;
      while (pos < s.size() && regex_->search(s, pos, b, e) && e > b) {
        out.append(s, pos, b - pos);
        out += content_;
        pos = e;
      }
      out.append(s, pos);
      s = std::move(out);
    }
  }

 private:
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

class Strip : public Decoder {
 public:
  Strip(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& t) const override {
    for (std::string& s : t) {
      std::u32string c = to_u32(s);
      size_t b = 0;
      while (b < start_ && b < c.size() && c[b] == content_) ++b;
      size_t e = c.size();
      for (size_t k = 0; k < stop_ && e > b && c[e - 1] == content_; ++k) --e;
      s = from_u32(std::u32string_view(c).substr(b, e - b));
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

// The replacement character becomes a space, except in the first token, where Hugging Face drops
// every occurrence when a prefix space is being added.
class Metaspace : public Decoder {
 public:
  Metaspace(char32_t rep, bool strip_first) : rep_(rep), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& t) const override {
    for (size_t k = 0; k < t.size(); ++k) {
      std::string out;
      for (size_t i = 0; i < t[k].size();) {
        size_t b = i;
        char32_t c = next_code_point(t[k], i);
        if (c == rep_) {
          if (!(k == 0 && strip_first_)) out += ' ';
        } else {
          out.append(t[k], b, i - b);
        }
      }
      t[k] = std::move(out);
    }
  }

 private:
  char32_t rep_;
  bool strip_first_;
};

class BpeSuffix : public Decoder {
 public:
  explicit BpeSuffix(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& t) const override {
    for (size_t k = 0; k < t.size(); ++k) {
      std::string out;
      std::string& s = t[k];
      size_t pos = 0;
      for (size_t f; !suffix_.empty() && (f = s.find(suffix_, pos)) != std::string::npos; pos = f + suffix_.size()) {
        out.append(s, pos, f - pos);
        out += k + 1 == t.size() ? "" : " ";
      }
      out.append(s, pos);
      s = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

char32_t first_char(const std::string& s, const char* what) {
  KILN_CHECK(!s.empty(), "tokenizer.json: decoder {} must be one character", what);
  size_t i = 0;
  return next_code_point(s, i);
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& j) {
  if (j.is_null()) return nullptr;
  KILN_CHECK(j.is_object() && j.contains("type"), "tokenizer.json: a decoder must be an object with a \"type\"");
  std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const json& d : j.at("decoders")) {
      if (auto step = make_decoder(d)) steps.push_back(std::move(step));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Replace") return std::make_unique<Replace>(j.at("pattern"), j.at("content").get<std::string>());
  if (type == "Strip")
    return std::make_unique<Strip>(first_char(j.at("content").get<std::string>(), "Strip content"),
                                   j.contains("start") ? json_uint(j["start"], "Strip start", 1 << 20) : 0,
                                   j.contains("stop") ? json_uint(j["stop"], "Strip stop", 1 << 20) : 0);
  if (type == "Metaspace") {
    bool strip_first = j.value("add_prefix_space", true);
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string())
      strip_first = j["prepend_scheme"].get<std::string>() != "never";
    return std::make_unique<Metaspace>(first_char(j.value("replacement", std::string("\xE2\x96\x81")), "replacement"),
                                       strip_first);
  }
  if (type == "BPEDecoder") return std::make_unique<BpeSuffix>(j.value("suffix", std::string("</w>")));
  fail("tokenizer.json: decoder type {} is not supported", quote(type));
}

std::string run_decoder(const Decoder* d, std::vector<std::string> tokens) {
  std::string out;
  if (!d) {
    for (size_t k = 0; k < tokens.size(); ++k) {
      if (k) out += ' ';
      out += tokens[k];
    }
    return out;
  }
  d->decode_chain(tokens);
  for (const std::string& s : tokens) out += s;
  return out;
}

}  // namespace kiln::tok
