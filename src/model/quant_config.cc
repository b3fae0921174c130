// config.json's `quantization_config`: DeepSeek-V3's block-scaled FP8 and compressed-tensors'
// pack-quantized INT4 (docs/quantization.md has both formats and their sources).
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"

namespace kiln {
namespace {

using json = nlohmann::json;

Fp8Quant parse_fp8(const json& q, const std::string& src) {
  Fp8Quant out;
  if (auto b = q.find("weight_block_size"); b != q.end()) {
    // Published FP8 checkpoints use 128 x 128; a cap keeps the scale grid's arithmetic in range.
    auto block = [&](size_t i) {
      const json& v = b->at(i);
      KILN_CHECK(v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() <= 65536,
                 "{}: field \"quantization_config.weight_block_size\" must be two integers 1 to 65536, got {}", src,
                 b->dump());
      return v.get<int64_t>();
    };
    KILN_CHECK(b->is_array() && b->size() == 2, "{}: field \"quantization_config.weight_block_size\" must be [n, k]",
               src);
    out.block_n = block(0);
    out.block_k = block(1);
  }
  const auto f = q.find("fmt");
  KILN_CHECK(f == q.end() || f->is_string(), "{}: field \"quantization_config.fmt\" must be a string", src);
  std::string fmt_name = q.value("fmt", "e4m3");
  KILN_CHECK(fmt_name == "e4m3", "{}: field \"quantization_config.fmt\" is \"{}\"; supported: e4m3", src, fmt_name);
  return out;
}

// One string field of an object, or `def` when absent or null.
std::string string_field(const json& o, const char* key, const std::string& def, const std::string& what) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return def;
  KILN_CHECK(it->is_string(), "{}.{} must be a string, got {}", what, key, it->dump());
  return it->get<std::string>();
}

// compressed-tensors: one config group of symmetric int4 group-wise weights, no activation
// quantisation (W4A16), packed eight to an int32.
Int4Quant parse_compressed_tensors(const json& q, const std::string& src) {
  const std::string where = src + ": field \"quantization_config";
  const std::string format = string_field(q, "format", "", where + "\"");
  KILN_CHECK(format == "pack-quantized", "{}.format\" is \"{}\"; supported: pack-quantized", where, format);
  const auto groups = q.find("config_groups");
  KILN_CHECK(groups != q.end() && groups->is_object() && groups->size() == 1,
             "{}.config_groups\" must hold exactly one group (one weight scheme), got {}", where,
             groups == q.end() ? "none" : groups->dump());
  const json& g = groups->begin().value();
  const std::string gw = where + ".config_groups." + groups->begin().key();
  KILN_CHECK(g.is_object(), "{}\" must be an object", gw);
  KILN_CHECK(string_field(g, "format", "pack-quantized", gw + "\"") == "pack-quantized",
             "{}.format\" must be pack-quantized", gw);
  for (const char* act : {"input_activations", "output_activations"}) {
    auto a = g.find(act);
    KILN_CHECK(a == g.end() || a->is_null(), "{}.{}\" is set; only weight-only INT4 (W4A16) is supported", gw, act);
  }
  const auto w = g.find("weights");
  KILN_CHECK(w != g.end() && w->is_object(), "{}.weights\" must be an object", gw);
  auto num = [&](const char* key) -> int64_t {
    auto it = w->find(key);
    KILN_CHECK(it != w->end() && it->is_number_integer(), "{}.weights.{}\" must be an integer", gw, key);
    return it->get<int64_t>();
  };
  KILN_CHECK(num("num_bits") == 4, "{}.weights.num_bits\" is {}; supported: 4", gw, num("num_bits"));
  KILN_CHECK(string_field(*w, "type", "int", gw + ".weights\"") == "int", "{}.weights.type\" must be int", gw);
  const std::string strategy = string_field(*w, "strategy", "group", gw + ".weights\"");
  KILN_CHECK(strategy == "group", "{}.weights.strategy\" is \"{}\"; supported: group", gw, strategy);
  const auto sym = w->find("symmetric");
  KILN_CHECK(sym == w->end() || (sym->is_boolean() && sym->get<bool>()),
             "{}.weights.symmetric\" must be true (zero points are not supported)", gw);
  const auto dyn = w->find("dynamic");
  KILN_CHECK(dyn == w->end() || dyn->is_null() || (dyn->is_boolean() && !dyn->get<bool>()),
             "{}.weights.dynamic\" must be false", gw);
  const auto order = w->find("actorder");
  KILN_CHECK(order == w->end() || order->is_null(),
             "{}.weights.actorder\" is set; activation reordering (g_idx) is "
             "not supported",
             gw);
  Int4Quant out;
  out.group_size = num("group_size");
  // Eight nibbles share an int32, so a group is a whole number of int32 words.
  KILN_CHECK(out.group_size >= 8 && out.group_size <= 65536 && out.group_size % 8 == 0,
             "{}.weights.group_size\" must be a multiple of 8 from 8 to 65536, got {}", gw, out.group_size);
  if (auto ig = q.find("ignore"); ig != q.end() && !ig->is_null()) {
    KILN_CHECK(ig->is_array(), "{}.ignore\" must be a list of module names", where);
    for (const json& n : *ig) {
      KILN_CHECK(n.is_string(), "{}.ignore\" must hold strings, got {}", where, n.dump());
      out.ignore.push_back(n.get<std::string>());
    }
  }
  return out;
}

}  // namespace

void parse_quantization_config(const json& j, const std::string& src, ModelConfig& c) {
  auto it = j.find("quantization_config");
  if (it == j.end() || it->is_null()) return;
  KILN_CHECK(it->is_object(), "{}: field \"quantization_config\" must be an object", src);
  const auto m = it->find("quant_method");
  KILN_CHECK(m == it->end() || m->is_string(), "{}: field \"quantization_config.quant_method\" must be a string", src);
  const std::string method = it->value("quant_method", "");
  if (method == "fp8") {
    c.fp8 = parse_fp8(*it, src);
  } else if (method == "compressed-tensors") {
    c.int4 = parse_compressed_tensors(*it, src);
  } else {
    fail(
        "{}: field \"quantization_config.quant_method\" is \"{}\"; supported: fp8, compressed-tensors "
        "(pack-quantized int4)",
        src, method);
  }
}

}  // namespace kiln
