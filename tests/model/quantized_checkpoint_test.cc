// Quantized checkpoints kept quantized: a fixture rewritten as DeepSeek-V3 FP8 (128x128 blocks)
// and as compressed-tensors INT4 (routed experts, group 32) must load with its projections still
// quantized and compute exactly what a plain checkpoint of the dequantized values computes; the
// same for `--quantization fp8` and random quantized weights. The quantizers here are written
// independently of the loader's (the packing order follows compressed-tensors' pack_to_int32).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/dtype.h"
#include "model/deepseek_v3.h"
#include "model/weights.h"
#include "test_util.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Tensors = std::map<std::string, RawTensor>;

Tensors read_tensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  uint64_t n;
  std::memcpy(&n, all.data(), 8);
  json h = json::parse(all.substr(8, n));
  Tensors out;
  for (auto& [name, info] : h.items()) {
    if (name == "__metadata__") continue;
    size_t b = info["data_offsets"][0], e = info["data_offsets"][1];
    out[name] = {info["dtype"], info["shape"].get<std::vector<int64_t>>(), all.substr(8 + n + b, e - b)};
  }
  return out;
}

std::vector<float> values(const RawTensor& t) {
  std::vector<float> v;
  if (t.dtype == "F32") {
    v.resize(t.bytes.size() / 4);
    std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  } else {
    EXPECT_EQ(t.dtype, "BF16");
    for (size_t i = 0; i < t.bytes.size(); i += 2) {
      uint16_t h;
      std::memcpy(&h, t.bytes.data() + i, 2);
      v.push_back(bf16_to_f32(h));
    }
  }
  return v;
}

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

RawTensor f32_tensor(std::vector<int64_t> shape, const std::vector<float>& v) {
  return {"F32", std::move(shape), bytes_of(v)};
}

// DeepSeek-V3 FP8: e4m3 codes of w / s, s = block amax / 448 (f32), `_scale_inv` = s. Returns the
// dequantized values.
std::vector<float> put_fp8(Tensors& out, const std::string& name, const std::vector<int64_t>& shape,
                           const std::vector<float>& w, int64_t block) {
  const int64_t n = shape[0], k = shape[1], gn = (n + block - 1) / block, gk = (k + block - 1) / block;
  std::vector<float> scale(static_cast<size_t>(gn * gk), 0.0f), deq(w.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) {
      float& s = scale[static_cast<size_t>(i / block * gk + j / block)];
      s = std::max(s, std::fabs(w[static_cast<size_t>(i * k + j)]) / 448.0f);
    }
  for (float& s : scale) s = s > 0 ? s : 1.0f;
  std::vector<uint8_t> codes(w.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const size_t at = static_cast<size_t>(i * k + j);
      const float s = scale[static_cast<size_t>(i / block * gk + j / block)];
      codes[at] = f32_to_fp8e4m3(w[at] / s);
      deq[at] = fp8e4m3_to_f32(codes[at]) * s;
    }
  out[name] = {"F8_E4M3", shape, bytes_of(codes)};
  out[name + "_scale_inv"] = f32_tensor({gn, gk}, scale);
  return deq;
}

// compressed-tensors pack-quantized INT4, symmetric, group 32: q = clamp(round(w / s), -8, 7) with
// s = group amax / 7 in bf16; value j of a word is column 8c + j in bits 4j.. as q + 8.
std::vector<float> put_int4(Tensors& out, const std::string& base, const std::vector<int64_t>& shape,
                            const std::vector<float>& w, int64_t group) {
  const int64_t n = shape[0], k = shape[1], words = (k + 7) / 8, groups = (k + group - 1) / group;
  std::vector<uint16_t> scale(static_cast<size_t>(n * groups));
  std::vector<uint32_t> packed(static_cast<size_t>(n * words), 0);
  std::vector<float> deq(w.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t g = 0; g < groups; ++g) {
      float amax = 0;
      for (int64_t j = g * group; j < std::min(k, (g + 1) * group); ++j)
        amax = std::max(amax, std::fabs(w[static_cast<size_t>(i * k + j)]));
      const uint16_t sb = f32_to_bf16(amax > 0 ? amax / 7.0f : 1.0f);
      const float s = bf16_to_f32(sb);
      scale[static_cast<size_t>(i * groups + g)] = sb;
      for (int64_t j = g * group; j < std::min(k, (g + 1) * group); ++j) {
        const size_t at = static_cast<size_t>(i * k + j);
        const int q = std::clamp(static_cast<int>(std::nearbyint(w[at] / s)), -8, 7);
        packed[static_cast<size_t>(i * words + j / 8)] |= static_cast<uint32_t>(q + 8) << (4 * (j % 8));
        deq[at] = static_cast<float>(q) * s;
      }
    }
  out[base + ".weight_packed"] = {"I32", {n, words}, bytes_of(packed)};
  out[base + ".weight_scale"] = {"BF16", {n, groups}, bytes_of(scale)};
  out[base + ".weight_shape"] = {
      "I32", {2}, bytes_of(std::vector<int32_t>{static_cast<int32_t>(n), static_cast<int32_t>(k)})};
  return deq;
}

bool is_projection(const std::string& name, const RawTensor& t) {
  return t.shape.size() == 2 && name != "lm_head.weight" && name.find("embed_tokens") == std::string::npos &&
         name.find("mlp.gate.weight") == std::string::npos;
}

// Writes `quant` and `plain` copies of a fixture: the quantized checkpoint and a plain f32 one of
// its dequantized values.
void write_pair(const std::string& fixture, const std::string& quant, const std::string& plain, const json& qcfg,
                const std::function<std::vector<float>(Tensors&, const std::string&, const RawTensor&)>& quantize) {
  Tensors src = read_tensors(fixture + "/model.safetensors"), q, p;
  json cfg = read_json(fixture + "/config.json");
  for (const auto& [name, t] : src) {
    std::vector<float> deq = quantize(q, name, t);
    if (deq.empty()) {
      q[name] = t;
      p[name] = t;
    } else {
      p[name] = f32_tensor(t.shape, deq);
    }
  }
  for (const std::string& d : {quant, plain}) {
    fs::remove_all(d);
    fs::create_directories(d);
  }
  write_safetensors(quant + "/model.safetensors", q);
  write_safetensors(plain + "/model.safetensors", p);
  std::ofstream(plain + "/config.json") << cfg.dump(2);
  cfg["quantization_config"] = qcfg;
  std::ofstream(quant + "/config.json") << cfg.dump(2);
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, static_cast<double>(std::fabs(a[i] - b[i])));
    den = std::max(den, static_cast<double>(std::fabs(a[i])));
  }
  return num / den;
}

std::vector<float> all_logits(const std::string& dir, WeightQuant quant = WeightQuant::None,
                              MlaForm form = MlaForm::Auto) {
  auto be = ops::make_cpu_backend();
  auto model = DeepseekV3Model::load(dir, *be, quant);
  auto ids =
      read_json(data_path("fixtures/h12_mla512_moonlight_widths/expected.json"))["ids"].get<std::vector<int32_t>>();
  SequenceCache cache = model->new_cache(static_cast<int64_t>(ids.size()));
  return model->forward(ids, cache, true, form);
}

ModelWeights load_cpu(const std::string& dir, ops::Backend& be, WeightQuant quant = WeightQuant::None) {
  return load_weights(load_model_config(dir + "/config.json"), Checkpoint(dir), be, quant);
}

class Quantized : public ::testing::Test {
 protected:
  void SetUp() override {
    fixture_ = data_path("fixtures/h12_mla512_moonlight_widths");
    dir_ = testing::TempDir() + "/quant_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  std::string fixture_, dir_;
};

// Every projection FP8 at DeepSeek-V3's 128 x 128 blocks, the rest as shipped.
TEST_F(Quantized, Fp8CheckpointStaysFp8AndMatchesItsDequantizedWeights) {
  write_pair(
      fixture_, dir_ + "/q", dir_ + "/p",
      {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}}},
      [](Tensors& q, const std::string& name, const RawTensor& t) {
        return is_projection(name, t) ? put_fp8(q, name, t.shape, values(t), 128) : std::vector<float>{};
      });
  auto be = ops::make_cpu_backend();
  ModelWeights w = load_cpu(dir_ + "/q", *be);
  const LayerWeights& l = w.layers[0];
  for (const Weight* x :
       {&l.qkv_a, &l.kv_b, &l.o_proj, &l.experts_gate_up, &l.experts_down, &l.shared_gate_up, &l.shared_down}) {
    EXPECT_EQ(x->t.dtype, DType::F8E4M3);
    EXPECT_TRUE(x->quantized());
    EXPECT_EQ(x->scale.t.dtype, DType::F32);
  }
  // kv_b's heads (128 + 128 rows) start on block edges: its 128-row scale grid stays as shipped.
  EXPECT_EQ(l.kv_b.block_n, 128);
  EXPECT_EQ(l.kv_b.scale.t.shape, (Shape{12 * 256 / 128, 512 / 128}));
  // gate (32 rows) then up: up starts inside a block, so the stacked grid has a row per weight row.
  EXPECT_EQ(l.experts_gate_up.block_n, 1);
  EXPECT_EQ(l.experts_gate_up.scale.t.shape, (Shape{8, 64, 1}));
  EXPECT_FALSE(w.lm_head.t.dtype == DType::F8E4M3);
  EXPECT_EQ(l.w_uk_t.t.dtype, DType::F32);  // dequantized at load
  const auto ql = all_logits(dir_ + "/q"), pl = all_logits(dir_ + "/p");
  EXPECT_LE(rel_diff(pl, ql), 1e-5);
  // The absorbed form (W_uv read per head out of the FP8 kv_b) computes the same model.
  EXPECT_LE(rel_diff(ql, all_logits(dir_ + "/q", WeightQuant::None, MlaForm::Absorbed)), 1e-4);
}

// Kimi K2-Thinking's layout: routed experts INT4, everything else bf16 and named in `ignore`.
TEST_F(Quantized, Int4CheckpointKeepsExpertsPackedAndMatchesItsDequantizedWeights) {
  json ignore = json::array({"lm_head"});
  Tensors src = read_tensors(fixture_ + "/model.safetensors");
  for (const auto& [name, t] : src)
    if (is_projection(name, t) && name.find(".mlp.experts.") == std::string::npos)
      ignore.push_back(name.substr(0, name.size() - std::strlen(".weight")));
  const json qcfg = {{"quant_method", "compressed-tensors"},
                     {"format", "pack-quantized"},
                     {"quantization_status", "compressed"},
                     {"ignore", ignore},
                     {"config_groups",
                      {{"group_0",
                        {{"targets", {"Linear"}},
                         {"input_activations", nullptr},
                         {"weights",
                          {{"num_bits", 4},
                           {"type", "int"},
                           {"symmetric", true},
                           {"strategy", "group"},
                           {"group_size", 32},
                           {"dynamic", false}}}}}}}};
  write_pair(fixture_, dir_ + "/q", dir_ + "/p", qcfg, [](Tensors& q, const std::string& name, const RawTensor& t) {
    if (name.find(".mlp.experts.") == std::string::npos) return std::vector<float>{};
    return put_int4(q, name.substr(0, name.size() - std::strlen(".weight")), t.shape, values(t), 32);
  });
  auto be = ops::make_cpu_backend();
  ModelWeights w = load_cpu(dir_ + "/q", *be);
  const LayerWeights& l = w.layers[0];
  for (const Weight* x : {&l.experts_gate_up, &l.experts_down}) {
    EXPECT_EQ(x->t.dtype, DType::I4X8);
    EXPECT_EQ(x->scale.t.dtype, DType::BF16);
    EXPECT_EQ(x->block_n, 1);
    EXPECT_EQ(x->block_k, 32);
  }
  EXPECT_EQ(l.experts_gate_up.t.shape, (Shape{8, 64, 128 / 8}));
  EXPECT_EQ(l.experts_down.scale.t.shape, (Shape{8, 128, 1}));
  EXPECT_FALSE(l.shared_gate_up.quantized());
  EXPECT_FALSE(l.kv_b.quantized());
  EXPECT_LE(rel_diff(all_logits(dir_ + "/p"), all_logits(dir_ + "/q")), 1e-5);

  // A module the ignore list names must not ship packed.
  json cfg = read_json(dir_ + "/q/config.json");
  cfg["quantization_config"]["ignore"].push_back("model.layers.0.mlp.experts.2.up_proj");
  std::ofstream(dir_ + "/q/config.json") << cfg.dump();
  auto r = run_kiln("score --model " + dir_ + "/q --ids 1,2,3 --json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("model.layers.0.mlp.experts.2.up_proj"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ignore"), std::string::npos) << r.out;
}

// Packed tensors that disagree with the config or with each other fail naming the tensor.
TEST_F(Quantized, BadInt4TensorsNameTheTensor) {
  const json qcfg = {
      {"quant_method", "compressed-tensors"},
      {"format", "pack-quantized"},
      {"config_groups",
       {{"group_0",
         {{"weights",
           {{"num_bits", 4}, {"type", "int"}, {"symmetric", true}, {"strategy", "group"}, {"group_size", 32}}}}}}}};
  auto quantize = [](Tensors& q, const std::string& name, const RawTensor& t) {
    if (name.find(".mlp.experts.") == std::string::npos) return std::vector<float>{};
    return put_int4(q, name.substr(0, name.size() - std::strlen(".weight")), t.shape, values(t), 32);
  };
  const std::string base = "model.layers.0.mlp.experts.1.down_proj";
  struct Case {
    std::function<void(Tensors&)> edit;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {[&](Tensors& t) {
         t[base + ".weight_shape"].bytes = bytes_of(std::vector<int32_t>{128, 31});
       },
       {base + ".weight_shape", "[128, 31]", "[128, 32]"}},
      {[&](Tensors& t) { t.erase(base + ".weight_scale"); }, {base + ".weight_scale"}},
      {[&](Tensors& t) {
         t[base + ".weight_scale"].shape = {64, 2};
       },
       {base + ".weight_scale", "[64, 2]"}},
      {[&](Tensors& t) { t[base + ".weight_packed"].dtype = "F32"; }, {base + ".weight_packed", "I32"}},
  };
  for (const Case& c : cases) {
    write_pair(fixture_, dir_ + "/q", dir_ + "/p", qcfg, quantize);
    Tensors t = read_tensors(dir_ + "/q/model.safetensors");
    c.edit(t);
    write_safetensors(dir_ + "/q/model.safetensors", t);
    auto r = run_kiln("score --model " + dir_ + "/q --ids 1,2,3 --json");
    EXPECT_EQ(r.exit_code, 1) << r.out;
    for (const auto& s : c.says) EXPECT_NE(r.out.find(s), std::string::npos) << "missing \"" << s << "\": " << r.out;
  }
  // Packed tensors in a checkpoint whose config does not say compressed-tensors.
  write_pair(fixture_, dir_ + "/q", dir_ + "/p", qcfg, quantize);
  json cfg = read_json(dir_ + "/q/config.json");
  cfg.erase("quantization_config");
  std::ofstream(dir_ + "/q/config.json") << cfg.dump();
  auto r = run_kiln("score --model " + dir_ + "/q --ids 1,2,3 --json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("weight_packed"), std::string::npos) << r.out;
}

// --quantization fp8 block-quantizes a plain checkpoint at load: its projections become FP8 and
// the model computes what an FP8 checkpoint quantized by the same rule (amax / 448 per 128 x 128
// block, round to nearest even) computes.
TEST_F(Quantized, OnlineFp8QuantizesAPlainCheckpoint) {
  auto be = ops::make_cpu_backend();
  ModelWeights w = load_cpu(fixture_, *be, WeightQuant::Fp8);
  EXPECT_EQ(w.layers[0].qkv_a.t.dtype, DType::F8E4M3);
  EXPECT_EQ(w.layers[0].experts_down.t.dtype, DType::F8E4M3);
  EXPECT_EQ(w.layers[0].experts_down.block_k, 128);
  EXPECT_EQ(w.lm_head.t.dtype, DType::F32);
  write_pair(fixture_, dir_ + "/q", dir_ + "/p", {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}},
             [](Tensors& q, const std::string& name, const RawTensor& t) {
               return is_projection(name, t) ? put_fp8(q, name, t.shape, values(t), 128) : std::vector<float>{};
             });
  const auto plain = all_logits(fixture_), online = all_logits(fixture_, WeightQuant::Fp8);
  EXPECT_GT(rel_diff(plain, online), 1e-3);  // quantized, not the plain weights
  EXPECT_LE(rel_diff(all_logits(dir_ + "/p"), online), 1e-5);
  // Through the CLI, and refused for a checkpoint that is quantized already.
  auto r = run_kiln("score --quantization fp8 --model " + fixture_ + " --ids 1,2,3 --json");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  auto bad = run_kiln("score --quantization fp8 --model " + data_path("fixtures/h12_qlora_grouped_yarn_fp8") +
                      " --ids 1,2,3 --json");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.out.find("quantized already"), std::string::npos) << bad.out;
  auto typo = run_kiln("score --quantization int3 --model " + fixture_ + " --ids 1,2,3 --json");
  EXPECT_EQ(typo.exit_code, 1);
  EXPECT_NE(typo.out.find("--quantization"), std::string::npos) << typo.out;
}

// Random quantized weights (bench model --weight-dtype): both MLA forms agree over them, so the
// absorbed form's W_uv view of a quantized kv_b and W_uk^T describe one kv_b.
TEST_F(Quantized, RandomQuantizedWeightsKeepTheFormsInAgreement) {
  ModelConfig c = load_model_config(fixture_ + "/config.json");
  for (WeightQuant q : {WeightQuant::Fp8, WeightQuant::Int4Experts}) {
    auto be = ops::make_cpu_backend();
    ModelWeights w = random_weights(c, *be, 7, q);
    EXPECT_EQ(w.layers[0].experts_gate_up.t.dtype, q == WeightQuant::Fp8 ? DType::F8E4M3 : DType::I4X8);
    EXPECT_EQ(w.layers[0].kv_b.quantized(), q == WeightQuant::Fp8);
    DeepseekV3Model model(c, std::move(w), *be);
    std::vector<int32_t> ids = {5, 17, 200, 3, 99, 41, 7, 250};
    SequenceCache ce = model.new_cache(8), ca = model.new_cache(8);
    auto e = model.forward(ids, ce, true, MlaForm::Expanded);
    auto a = model.forward(ids, ca, true, MlaForm::Absorbed);
    for (float v : e) ASSERT_TRUE(std::isfinite(v));
    EXPECT_LE(rel_diff(e, a), 1e-4);
  }
}

// `bench model --random-weights --weight-dtype fp8|int4` runs quantized random weights (odd widths:
// partial blocks, groups and words) and records the format; misuse names the flag.
TEST_F(Quantized, BenchModelTakesQuantizedRandomWeights) {
  const std::string cfg = data_path("fixtures/h5_noqlora_dense2_odd/config.json");
  fs::create_directories(dir_);
  for (const std::string d : {"fp8", "int4"}) {
    const std::string out = dir_ + "/bench_" + d + ".json";
    auto r = run_kiln("bench model --config " + cfg + " --random-weights --weight-dtype " + d +
                      " --batch-sizes 2 --prompt-len 4 --decode-steps 3 --json " + out);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const json j = read_json(out);
    EXPECT_EQ(j["weight_dtype"], d);
    ASSERT_EQ(j["results"].size(), 1u);
    EXPECT_EQ(j["results"][0]["decode_steps"], 2);  // the first new token comes from the prefill
  }
  auto bad = run_kiln("bench model --config " + cfg + " --random-weights --weight-dtype int3");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.out.find("--weight-dtype"), std::string::npos) << bad.out;
  auto ckpt = run_kiln("bench model --model " + fixture_ + " --weight-dtype fp8");
  EXPECT_EQ(ckpt.exit_code, 1);
  EXPECT_NE(ckpt.out.find("--random-weights"), std::string::npos) << ckpt.out;
}

// The fixtures tools/make_fixtures.py writes from transformers at the production attention widths
// (FP8 128 x 128 blocks; INT4 routed experts, group 32). fixture_parity_test compares every fixture
// folder's scores and greedy tokens with transformers' (CPU bound 1e-3); this checks these two load
// with their projections still quantized.
class QuantizedFixture : public ::testing::TestWithParam<std::pair<const char*, DType>> {};

TEST_P(QuantizedFixture, LoadsQuantized) {
  const std::string dir = data_path(std::string("fixtures/") + GetParam().first);
  if (!fs::exists(dir + "/expected.json"))
    GTEST_SKIP() << dir << " is absent: it is made on a machine with torch + transformers by "
                 << "`python3 tools/make_fixtures.py --out OUT --only h12_mla512_moonlight_widths` and copied into "
                 << "tests/data/fixtures/";
  auto be = ops::make_cpu_backend();
  ModelWeights w = load_cpu(dir, *be);
  EXPECT_EQ(w.layers[0].experts_gate_up.t.dtype, GetParam().second);
  EXPECT_EQ(w.layers[0].experts_down.t.dtype, GetParam().second);
  EXPECT_EQ(w.layers[0].kv_b.quantized(), GetParam().second == DType::F8E4M3);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizedFixture,
                         ::testing::Values(std::pair{"h12_mla512_moonlight_widths_fp8", DType::F8E4M3},
                                           std::pair{"h12_mla512_moonlight_widths_int4", DType::I4X8}),
                         [](const auto& p) { return std::string(p.param.second == DType::I4X8 ? "int4" : "fp8"); });

}  // namespace
}  // namespace kiln::test
