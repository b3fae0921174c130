// Bad checkpoints: each gets one clear message naming the file / tensor / shapes, a non-zero exit
// and no crash (this suite also runs under ASan + UBSan).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "test_util.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::map<std::string, RawTensor> read_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  uint64_t n;
  std::memcpy(&n, all.data(), 8);
  json h = json::parse(all.substr(8, n));
  std::map<std::string, RawTensor> out;
  for (auto& [name, info] : h.items()) {
    if (name == "__metadata__") continue;
    size_t b = info["data_offsets"][0], e = info["data_offsets"][1];
    out[name] = {info["dtype"], info["shape"].get<std::vector<int64_t>>(), all.substr(8 + n + b, e - b)};
  }
  return out;
}

class BadCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = data_path("fixtures/h24_kimi_k2_style");
    dir_ = testing::TempDir() + "/bad_ckpt_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy_file(src_ + "/config.json", dir_ + "/config.json");
    tensors_ = read_safetensors(src_ + "/model.safetensors");
  }
  void write() { write_safetensors(dir_ + "/model.safetensors", tensors_); }
  // Writes the tensors, then rewrites the file's header through `edit` (data bytes kept, `extra`
  // appended after them).
  void write_edited(const std::function<void(json&)>& edit, const std::string& extra = "") {
    write();
    const std::string path = dir_ + "/model.safetensors";
    std::ifstream in(path, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    uint64_t n = 0;
    std::memcpy(&n, all.data(), 8);
    json h = json::parse(all.substr(8, n));
    edit(h);
    const std::string hs = h.dump(), data = all.substr(8 + n) + extra;
    n = hs.size();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << hs << data;
  }
  RunResult score() { return run_kiln("score --model " + dir_ + " --ids 1,2,3 --json"); }
  void expect_error(const RunResult& r, std::initializer_list<std::string> parts) {
    EXPECT_EQ(r.exit_code, 1) << r.out;  // an error exit, not a signal
    for (const auto& p : parts) EXPECT_NE(r.out.find(p), std::string::npos) << "missing \"" << p << "\" in: " << r.out;
  }
  std::string src_, dir_;
  std::map<std::string, RawTensor> tensors_;
};

TEST_F(BadCheckpoint, ValidCopyLoads) {
  write();
  auto r = score();
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

TEST_F(BadCheckpoint, MissingTensor) {
  tensors_.erase("model.layers.1.mlp.experts.3.up_proj.weight");
  write();
  expect_error(score(), {"missing tensor", "model.layers.1.mlp.experts.3.up_proj.weight", "[32, 96]"});
}

TEST_F(BadCheckpoint, UnexpectedTensor) {
  tensors_["model.layers.0.self_attn.mystery.weight"] = {"F32", {2}, std::string(8, '\0')};
  write();
  expect_error(score(), {"unexpected tensor", "model.layers.0.self_attn.mystery.weight", "model.safetensors"});
}

TEST_F(BadCheckpoint, MisShapedTensor) {
  auto& t = tensors_["model.layers.0.self_attn.o_proj.weight"];  // [96, 384]
  t.shape = {96, 383};
  t.bytes.resize(t.bytes.size() / 384 * 383);  // keep the dtype, drop one column
  write();
  expect_error(score(), {"model.layers.0.self_attn.o_proj.weight", "[96, 383]", "[96, 384]", "model.safetensors"});
}

TEST_F(BadCheckpoint, TruncatedFile) {
  write();
  fs::resize_file(dir_ + "/model.safetensors", fs::file_size(dir_ + "/model.safetensors") - 1000);
  expect_error(score(), {"truncated", "model.safetensors"});
}

TEST_F(BadCheckpoint, CorruptHeaderLength) {
  std::ofstream(dir_ + "/model.safetensors", std::ios::binary) << std::string("\xff\xff\xff\xff\xff\xff\x00\x00{}", 10);
  expect_error(score(), {"corrupt header", "model.safetensors"});
}

TEST_F(BadCheckpoint, CorruptHeaderJson) {
  std::string junk = "{\"a\": [1, 2";
  uint64_t n = junk.size();
  std::ofstream f(dir_ + "/model.safetensors", std::ios::binary);
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << junk;
  f.close();
  expect_error(score(), {"corrupt header", "not valid JSON"});
}

TEST_F(BadCheckpoint, OffsetsDisagreeWithShape) {
  write();
  // Rewrite the header so one tensor claims fewer bytes than its shape needs.
  auto t = tensors_;
  t["model.norm.weight"].bytes.resize(t["model.norm.weight"].bytes.size() - 4);
  write_safetensors(dir_ + "/model.safetensors", t);
  expect_error(score(), {"model.norm.weight", "needs", "bytes"});
}

// The data must be the tensors back to back, as the safetensors format requires: an aliased span
// once loaded another tensor's bytes as a norm weight, silently.
TEST_F(BadCheckpoint, OverlappingOrLooseDataIsRejected) {
  write_edited([](json& h) {  // the norm's 192 bytes read from the start of the embedding's
    const uint64_t b = h["model.embed_tokens.weight"]["data_offsets"][0];
    h["model.norm.weight"]["data_offsets"] = {b, b + 192};
  });
  expect_error(score(), {"model.safetensors", "overlap"});
  write_edited([](json&) {}, std::string(16, '\0'));
  expect_error(score(), {"model.safetensors", "16 data bytes after the last tensor"});
  write_edited([](json& h) {
    auto& off = h["model.norm.weight"]["data_offsets"];
    off[0] = off[0].get<double>() + 0.5;
  });
  expect_error(score(), {"model.norm.weight", "two non-negative integers"});
}

// A shape whose element count wraps int64 (2^62 x 4 -> 0) with 0 data bytes: once accepted as
// empty, then a crash in the forward.
TEST_F(BadCheckpoint, ShapePastInt64IsRejected) {
  tensors_["model.norm.weight"] = {"F32", {int64_t{1} << 62, 4}, ""};
  write();
  expect_error(score(), {"model.norm.weight", "over 2^63 elements"});
}

TEST_F(BadCheckpoint, IntegerWeightNamesTheTensor) {
  tensors_["model.norm.weight"] = {"I32", {96}, std::string(96 * 4, '\0')};  // the right shape, as integers
  write();
  expect_error(score(), {"model.norm.weight", "dtype I32", "weights are"});
}

TEST_F(BadCheckpoint, ConfigThatIsADirectory) {
  write();
  fs::remove(dir_ + "/config.json");
  fs::create_directory(dir_ + "/config.json");
  expect_error(score(), {"config.json", "is a directory"});
}

TEST_F(BadCheckpoint, UnknownDtype) {
  tensors_["model.norm.weight"].dtype = "F4";
  write();
  expect_error(score(), {"model.norm.weight", "unsupported dtype \"F4\""});
}

TEST_F(BadCheckpoint, MissingShard) {
  write();
  fs::rename(dir_ + "/model.safetensors", dir_ + "/model-00001-of-00002.safetensors");
  json idx = {{"weight_map", json::object()}};
  for (auto& [name, t] : tensors_) idx["weight_map"][name] = "model-00001-of-00002.safetensors";
  idx["weight_map"]["model.norm.weight"] = "model-00002-of-00002.safetensors";
  std::ofstream(dir_ + "/model.safetensors.index.json") << idx.dump();
  expect_error(score(), {"model-00002-of-00002.safetensors", "missing"});
}

TEST_F(BadCheckpoint, ShardedCheckpointLoads) {
  // Split the tensors over two shards with an index, as large checkpoints ship.
  std::map<std::string, RawTensor> a, b;
  json idx = {{"weight_map", json::object()}};
  bool flip = false;
  for (auto& [name, t] : tensors_) {
    (flip ? a : b)[name] = t;
    idx["weight_map"][name] = flip ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    flip = !flip;
  }
  write_safetensors(dir_ + "/model-00001-of-00002.safetensors", a);
  write_safetensors(dir_ + "/model-00002-of-00002.safetensors", b);
  std::ofstream(dir_ + "/model.safetensors.index.json") << idx.dump();
  auto sharded = score();
  ASSERT_EQ(sharded.exit_code, 0) << sharded.out;
  auto whole = run_kiln("score --model " + src_ + " --ids 1,2,3 --json");
  EXPECT_EQ(sharded.out, whole.out);
}

TEST_F(BadCheckpoint, BadConfigNamesField) {
  json c = read_json(dir_ + "/config.json");
  c["scoring_func"] = "softmax";
  std::ofstream(dir_ + "/config.json") << c.dump();
  write();
  expect_error(score(), {"scoring_func", "config.json"});
}

TEST_F(BadCheckpoint, BadIdsFlag) {
  write();
  expect_error(run_kiln("score --model " + dir_ + " --ids 1,x,3"), {"--ids", "\"x\""});
  expect_error(run_kiln("score --model " + dir_ + " --ids 1,99999"), {"99999", "vocabulary"});
}

TEST_F(BadCheckpoint, BadPrecisionFlags) {
  write();
  const std::string base = "score --model " + dir_ + " --ids 1,2,3 ";
  expect_error(run_kiln(base + "--activation-dtype fp16"), {"--activation-dtype", "\"fp16\""});
  expect_error(run_kiln(base + "--kv-cache-dtype fp4"), {"--kv-cache-dtype", "\"fp4\""});
  // The FP8 cache has no CUDA kernels yet: refused before any weight loads, never a silent fallback.
  expect_error(run_kiln(base + "--device cuda --kv-cache-dtype fp8"), {"fp8_e4m3", "not built yet"});
  // bf16 activations are a CUDA-backend choice: the CPU reference says so instead of ignoring it.
  expect_error(run_kiln(base + "--device cpu --activation-dtype bf16"), {"--activation-dtype bf16", "--device cuda"});
  expect_error(run_kiln(base + "--expert-activation-dtype half"), {"--expert-activation-dtype", "\"half\""});
  expect_error(run_kiln(base + "--device cpu --expert-activation-dtype bf16"),
               {"--expert-activation-dtype bf16", "--device cuda"});
  auto r = run_kiln(base + "--activation-dtype f32 --json");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  r = run_kiln(base + "--expert-activation-dtype f32 --json");  // f32 is the CPU reference's own choice
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

TEST_F(BadCheckpoint, MissingDirectory) {
  expect_error(run_kiln("score --model /nonexistent/kiln --ids 1,2"), {"/nonexistent/kiln"});
}

}  // namespace
}  // namespace kiln::test
