#include "tokenizer/post_processor.h"

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {

using nlohmann::json;

namespace {

class Wrap : public PostProcessor {
 public:
  Wrap(std::vector<uint32_t> prefix, std::vector<uint32_t> suffix)
      : prefix_(std::move(prefix)), suffix_(std::move(suffix)) {}
  void process(std::vector<uint32_t>& ids) const override {
    ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
    ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  }

 private:
  std::vector<uint32_t> prefix_, suffix_;
};

class Sequence : public PostProcessor {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  void process(std::vector<uint32_t>& ids) const override {
    for (const auto& p : steps_) p->process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

std::unique_ptr<PostProcessor> template_processing(const json& j) {
  const json& single = j.at("single");
  const json& specials = j.value("special_tokens", json::object());
  std::vector<uint32_t> prefix, suffix;
  bool seen_sequence = false;
  for (const json& item : single) {
    if (item.contains("Sequence")) {
      KILN_CHECK(!seen_sequence, "tokenizer.json: TemplateProcessing single template has two sequences");
      seen_sequence = true;
      continue;
    }
    KILN_CHECK(item.contains("SpecialToken"),
               "tokenizer.json: TemplateProcessing item is neither Sequence nor SpecialToken");
    std::string name = item["SpecialToken"].at("id").get<std::string>();
    KILN_CHECK(specials.contains(name), "tokenizer.json: TemplateProcessing uses {}, which special_tokens lacks",
               quote(name));
    for (const json& id : specials[name].at("ids"))
      (seen_sequence ? suffix : prefix).push_back(json_token_id(id, "a special token id"));
  }
  return std::make_unique<Wrap>(std::move(prefix), std::move(suffix));
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const json& j) {
  if (j.is_null()) return nullptr;
  KILN_CHECK(j.is_object() && j.contains("type"), "tokenizer.json: a post_processor must be an object with a \"type\"");
  std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return nullptr;  // only adjusts offsets, which Kiln does not track
  if (type == "TemplateProcessing") return template_processing(j);
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    uint32_t cls = json_token_id(j.at("cls").at(1), "cls id"), sep = json_token_id(j.at("sep").at(1), "sep id");
    return std::make_unique<Wrap>(std::vector<uint32_t>{cls}, std::vector<uint32_t>{sep});
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (const json& p : j.at("processors"))
      if (auto step = make_post_processor(p)) steps.push_back(std::move(step));
    if (steps.empty()) return nullptr;
    return std::make_unique<Sequence>(std::move(steps));
  }
  fail("tokenizer.json: post_processor type {} is not supported", quote(type));
}

std::unique_ptr<PostProcessor> make_bos_eos_processor(std::vector<uint32_t> prefix, std::vector<uint32_t> suffix) {
  return std::make_unique<Wrap>(std::move(prefix), std::move(suffix));
}

}  // namespace kiln::tok
