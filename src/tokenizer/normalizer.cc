#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <vector>

#include "core/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {

using nlohmann::json;

namespace {

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void apply(std::string& s) const override {
    for (const auto& n : steps_) n->apply(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class Unicode : public Normalizer {
 public:
  explicit Unicode(NormalForm f) : form_(f) {}
  void apply(std::string& s) const override { s = normalize(s, form_); }

 private:
  NormalForm form_;
};

class Lowercase : public Normalizer {
 public:
  void apply(std::string& s) const override { s = lower(s); }
};

class StripAccents : public Normalizer {
 public:
  // Removes combining marks (category Mn), which is what Hugging Face's StripAccents does.
  void apply(std::string& s) const override {
    std::string out;
    for (size_t i = 0; i < s.size();) {
      size_t start = i;
      char32_t c = next_code_point(s, i);
      if (utf8proc_category(static_cast<utf8proc_int32_t>(c)) != UTF8PROC_CATEGORY_MN) out.append(s, start, i - start);
    }
    s = std::move(out);
  }
};

class Replace : public Normalizer {
 public:
  Replace(const json& pattern, std::string content) : content_(std::move(content)) {
    if (pattern.contains("String")) {
      literal_ = pattern["String"].get<std::string>();
    } else if (pattern.contains("Regex")) {
      regex_ = std::make_unique<Regex>(pattern["Regex"].get<std::string>());
    } else {
      fail("tokenizer.json: Replace pattern must hold \"String\" or \"Regex\"");
    }
  }
  void apply(std::string& s) const override {
    std::string out;
    size_t pos = 0;
    if (regex_) {
      size_t b, e;
      while (pos <= s.size() && regex_->search(s, pos, b, e)) {
        out.append(s, pos, b - pos);
        out += content_;
        if (e == b) {  // empty match: keep one character and move on
          if (b >= s.size()) {
            pos = s.size() + 1;
            break;
          }
          size_t n = b;
          next_code_point(s, n);
          out.append(s, b, n - b);
          e = n;
        }
        pos = e;
      }
      if (pos <= s.size()) out.append(s, pos);
    } else {
      if (literal_.empty()) return;
      for (size_t f; (f = s.find(literal_, pos)) != std::string::npos; pos = f + literal_.size()) {
        out.append(s, pos, f - pos);
        out += content_;
      }
      out.append(s, pos);
    }
    s = std::move(out);
  }

 private:
  std::string literal_, content_;
  std::unique_ptr<Regex> regex_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string p) : prefix_(std::move(p)) {}
  void apply(std::string& s) const override {
    if (!s.empty()) s.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& s) const override {
    size_t b = 0, e = s.size();
    if (left_) {
      while (b < e) {
        size_t i = b;
        if (!is_unicode_whitespace(next_code_point(s, i))) break;
        b = i;
      }
    }
    if (right_) {
      while (e > b) {
        size_t p = e - 1;
        while (p > b && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
        size_t i = p;
        if (!is_unicode_whitespace(next_code_point(s, i))) break;
        e = p;
      }
    }
    s = s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j) {
  if (j.is_null()) return nullptr;
  KILN_CHECK(j.is_object() && j.contains("type"), "tokenizer.json: a normalizer must be an object with a \"type\"");
  std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const json& n : j.at("normalizers")) {
      if (auto step = make_normalizer(n)) steps.push_back(std::move(step));
    }
    if (steps.empty()) return nullptr;
    if (steps.size() == 1) return std::move(steps[0]);
    return std::make_unique<Sequence>(std::move(steps));
  }
  if (type == "NFC") return std::make_unique<Unicode>(NormalForm::NFC);
  if (type == "NFD") return std::make_unique<Unicode>(NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<Unicode>(NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<Unicode>(NormalForm::NFKD);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Replace") return std::make_unique<Replace>(j.at("pattern"), j.at("content").get<std::string>());
  if (type == "Prepend") return std::make_unique<Prepend>(j.at("prepend").get<std::string>());
  if (type == "Strip") return std::make_unique<Strip>(j.value("strip_left", true), j.value("strip_right", true));
  fail("tokenizer.json: normalizer type {} is not supported", quote(type));
}

}  // namespace kiln::tok
