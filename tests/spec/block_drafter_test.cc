// The DSpark-style block drafter (spec/block_drafter_model.h) on the CPU reference backend: shapes,
// what the attention mask lets through and what it does not, the Markov head's sequential order,
// loading errors, and (when tools/dspark/reference.py has written it) parity with the PyTorch
// reference of the same architecture.
#include "spec/block_drafter_model.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "dspark_util.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace kiln::spec {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json small_config(bool q_lora = true) {
  return {{"model_type", "deepseek_v3"},
          {"vocab_size", 97},
          {"hidden_size", 32},
          {"intermediate_size", 48},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 2},
          {"q_lora_rank", q_lora ? json(16) : json(nullptr)},
          {"kv_lora_rank", 16},
          {"qk_rope_head_dim", 8},
          {"qk_nope_head_dim", 8},
          {"v_head_dim", 8},
          {"first_k_dense_replace", 2},
          {"n_routed_experts", 0},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},
          {"rope_interleave", true},
          {"num_target_layers", 4},
          {"target_layer_ids", {0, 2}},
          {"block_size", 4},
          {"mask_token_id", 96},
          {"markov_rank", 8},
          {"markov_head_type", "vanilla"},
          {"enable_confidence_head", true},
          {"confidence_head_with_markov", true}};
}

// Every tensor of a draft with config j, random, by name (f32 values).
std::map<std::string, std::vector<float>> random_tensors(const json& j, std::map<std::string, Shape>& shapes) {
  const int64_t V = j["vocab_size"], H = j["hidden_size"];
  shapes = test::dspark_shapes(j);
  shapes["embed_tokens.weight"] = {V, H};
  shapes["lm_head.weight"] = {V, H};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, s] : shapes) {
    std::vector<float> v(static_cast<size_t>(shape_numel(s)));
    const bool is_norm = s.size() == 1 && name.find("bias") == std::string::npos;
    const float scale = s.size() == 2 && name != "embed_tokens.weight" && name != "markov_head.markov_w1.weight"
                            ? 1.0f / std::sqrt(static_cast<float>(s[1]))
                            : 1.0f;
    for (float& x : v) x = is_norm ? 1.0f + 0.1f * normal(rng) : scale * normal(rng);
    out[name] = std::move(v);
  }
  return out;
}

// Writes config j and random weights (less `drop`, plus `extra`) to a fresh directory.
std::string write_draft(const std::string& name, const json& j, const std::string& drop = "",
                        const std::string& extra = "") {
  const fs::path dir = test::fresh_draft_dir("kiln_block_drafter", name);  // removed when the test program ends
  std::ofstream(dir / "config.json") << j.dump(2);
  std::map<std::string, Shape> shapes;
  std::map<std::string, test::RawTensor> raw;
  for (auto& [n, v] : random_tensors(j, shapes)) {
    if (n == drop) continue;
    raw[n] = {"F32", shapes[n], std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4)};
  }
  if (!extra.empty()) raw[extra] = {"F32", {1}, std::string(4, '\0')};
  test::write_safetensors((dir / "model.safetensors").string(), raw);
  return dir.string();
}

std::vector<float> features(int64_t rows, int64_t dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(static_cast<size_t>(rows * dim));
  for (float& x : v) x = normal(rng);
  return v;
}

double max_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

struct Fixture {
  std::unique_ptr<ops::Backend> be = ops::make_cpu_backend();
  std::unique_ptr<BlockDrafterModel> model;
  explicit Fixture(const json& j = small_config()) { model = BlockDrafterModel::load(write_draft("m", j), *be); }
  BlockDraft propose(const std::vector<float>& ctx_rows, int32_t anchor) {
    BlockDrafterContext ctx = model->new_context(64);
    model->append_context(ctx, ctx_rows);
    return model->propose(ctx, anchor);
  }
};

constexpr int64_t kF = 64;  // feature width of small_config: 2 target layers x hidden 32

TEST(BlockDrafter, ProposesABlockWhoseTokensAreTheArgmaxOfItsMarkovLogits) {
  for (bool q_lora : {true, false}) {
    Fixture f(small_config(q_lora));
    const int64_t B = 4, V = 97, R = 8;
    const BlockDraft d = f.propose(features(7, kF, 1), 5);
    ASSERT_EQ(d.tokens.size(), 4u);
    ASSERT_EQ(d.logits.size(), static_cast<size_t>(B * V));
    ASSERT_EQ(d.confidence.size(), 4u);
    // The Markov bias of position k is markov_w2 · markov_w1[prev_k]: prev_0 the anchor, then each
    // drafted token in turn (the weights as written, re-derived on the host).
    std::map<std::string, Shape> shapes;
    const auto w = random_tensors(small_config(q_lora), shapes);
    const auto& w1 = w.at("markov_head.markov_w1.weight");
    const auto& w2 = w.at("markov_head.markov_w2.weight");
    int32_t prev = 5;
    for (int64_t k = 0; k < B; ++k) {
      const float* row = d.logits.data() + k * V;
      EXPECT_EQ(d.tokens[static_cast<size_t>(k)], std::max_element(row, row + V) - row) << "position " << k;
      for (int64_t v = 0; v < V; ++v) {
        double bias = 0;
        for (int64_t i = 0; i < R; ++i)
          bias += w2[static_cast<size_t>(v * R + i)] * w1[static_cast<size_t>(prev * R + i)];
        ASSERT_NEAR(row[v] - d.base_logits[static_cast<size_t>(k * V + v)], bias, 1e-4) << "position " << k;
      }
      EXPECT_GT(d.confidence[static_cast<size_t>(k)], 0.0f);
      EXPECT_LT(d.confidence[static_cast<size_t>(k)], 1.0f);
      prev = d.tokens[static_cast<size_t>(k)];
    }
  }
}

TEST(BlockDrafter, ContextPastTheAnchorDoesNotLeakButContextBeforeItCounts) {
  Fixture f;
  const std::vector<float> rows = features(9, kF, 2);
  const std::vector<float> first6(rows.begin(), rows.begin() + 6 * kF);
  const BlockDraft want = f.propose(first6, 11);
  // Rows 6..8 appended then rolled back (rejected tokens): the anchor at position 6 must not see them.
  BlockDrafterContext ctx = f.model->new_context(64);
  f.model->append_context(ctx, rows);
  f.model->truncate_context(ctx, 6);
  const BlockDraft got = f.model->propose(ctx, 11);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(max_diff(got.logits.data(), want.logits.data(), static_cast<int64_t>(want.logits.size())), 0.0);
  // A change to a row before the anchor changes what every block position sees.
  std::vector<float> changed = first6;
  changed[3 * kF + 5] += 1.0f;
  const BlockDraft other = f.propose(changed, 11);
  for (int64_t k = 0; k < 4; ++k)
    EXPECT_GT(max_diff(other.base_logits.data() + k * 97, want.base_logits.data() + k * 97, 97), 1e-4) << k;
}

TEST(BlockDrafter, AnEarlierBlocksRowsDoNotLeakIntoTheNextForward) {
  Fixture f;
  const std::vector<float> rows = features(8, kF, 3);
  BlockDrafterContext ctx = f.model->new_context(64);
  f.model->append_context(ctx, std::span<const float>(rows.data(), 5 * kF));
  f.model->propose(ctx, 40);  // writes its block's latent rows at pool rows 5..8
  f.model->append_context(ctx, std::span<const float>(rows.data() + 5 * kF, 3 * kF));
  const BlockDraft got = f.model->propose(ctx, 41), want = f.propose(rows, 41);
  // Equal up to rounding (the context projected in two pieces rather than one); a stale row would
  // move the logits by far more.
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_LT(max_diff(got.logits.data(), want.logits.data(), 4 * 97), 1e-5);
}

TEST(BlockDrafter, TheBlockAttendsNonCausally) {
  // Another MASK token changes only the embeddings of positions 1..B-1; position 0 (the anchor)
  // sees it, which a causal block would not.
  Fixture f;
  json j = small_config();
  j["mask_token_id"] = 50;
  Fixture g(j);
  const std::vector<float> rows = features(5, kF, 4);
  const BlockDraft a = f.propose(rows, 9), b = g.propose(rows, 9);
  EXPECT_GT(max_diff(a.base_logits.data(), b.base_logits.data(), 97), 1e-4);
  // And the anchor reaches every later position.
  const BlockDraft c = f.propose(rows, 10);
  for (int64_t k = 1; k < 4; ++k)
    EXPECT_GT(max_diff(a.base_logits.data() + k * 97, c.base_logits.data() + k * 97, 97), 1e-4) << k;
}

TEST(BlockDrafter, TheTokenDraftedAtKChangesOnlyLaterLogits) {
  Fixture f;
  const std::vector<float> rows = features(6, kF, 5);
  BlockDrafterContext ctx = f.model->new_context(64);
  f.model->append_context(ctx, rows);
  const BlockDraft greedy = f.model->propose(ctx, 21);
  // Teacher-forced with the greedy tokens as the previous ones: the same block.
  std::vector<int32_t> prev = {21, greedy.tokens[0], greedy.tokens[1], greedy.tokens[2]};
  const BlockDraft same = f.model->score(ctx, prev);
  EXPECT_EQ(same.tokens, greedy.tokens);
  EXPECT_LT(max_diff(same.logits.data(), greedy.logits.data(), 4 * 97), 1e-5);
  EXPECT_LT(max_diff(same.confidence.data(), greedy.confidence.data(), 4), 1e-6);
  for (int64_t k = 0; k < 3; ++k) {  // the token drafted at k is prev[k + 1]
    std::vector<int32_t> p = prev;
    p[static_cast<size_t>(k + 1)] = (p[static_cast<size_t>(k + 1)] + 1) % 97;
    const BlockDraft d = f.model->score(ctx, p);
    EXPECT_EQ(d.base_logits, same.base_logits) << "the backbone never sees drafted tokens";
    for (int64_t j = 0; j < 4; ++j) {
      const double diff = max_diff(d.logits.data() + j * 97, same.logits.data() + j * 97, 97);
      if (j == k + 1)
        EXPECT_GT(diff, 1e-4) << "token at " << k << ", logits at " << j;
      else
        EXPECT_EQ(diff, 0.0) << "token at " << k << ", logits at " << j;
    }
  }
}

TEST(BlockDrafter, TheTargetsEmbeddingAndLmHeadReplaceTheCheckpointsCopies) {
  auto be = ops::make_cpu_backend();
  std::map<std::string, Shape> shapes;
  const auto w = random_tensors(small_config(), shapes);
  ModelWeights target;
  target.embed = be->alloc(DType::F32, {97, 32});
  be->upload(target.embed.t, w.at("embed_tokens.weight").data());
  target.lm_head = be->alloc(DType::F32, {97, 32});
  be->upload(target.lm_head.t, w.at("lm_head.weight").data());
  const std::string dir = write_draft("no_embed", small_config(), "embed_tokens.weight");
  auto m = BlockDrafterModel::load(dir, *be, &target);
  BlockDrafterContext ctx = m->new_context(16);
  m->append_context(ctx, features(4, kF, 6));
  Fixture f;
  EXPECT_EQ(m->propose(ctx, 3).logits, f.propose(features(4, kF, 6), 3).logits);
  try {
    BlockDrafterModel::load(dir, *be);
    FAIL() << "a draft without embed_tokens loaded without a target";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("\"embed_tokens.weight\""), std::string::npos) << e.message();
  }
}

void expect_load_error(const std::string& dir, const std::string& needle) {
  auto be = ops::make_cpu_backend();
  try {
    BlockDrafterModel::load(dir, *be);
    FAIL() << "loaded; expected an error naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
  }
}

TEST(BlockDrafter, LoadingErrorsNameTheTensorOrField) {
  expect_load_error(write_draft("missing", small_config(), "layers.1.self_attn.kv_b_proj.weight"),
                    "missing tensor \"layers.1.self_attn.kv_b_proj.weight\"");
  expect_load_error(write_draft("markov", small_config(), "markov_head.markov_w2.weight"),
                    "\"markov_head.markov_w2.weight\"");
  expect_load_error(write_draft("extra", small_config(), "", "layers.0.self_attn.q_norm.weight"),
                    "unexpected tensor \"layers.0.self_attn.q_norm.weight\"");
  json j = small_config();
  j["target_layer_ids"] = {2, 0};
  expect_load_error(write_draft("order", j), "strictly increasing");
  j = small_config();
  j.erase("block_size");
  expect_load_error(write_draft("no_block", j), "\"block_size\"");
  j = small_config();
  j["markov_head_type"] = "rnn";
  expect_load_error(write_draft("rnn", j), "markov_head_type \"rnn\"");
  const std::string dir = write_draft("shape", small_config());
  j = small_config();
  j["num_target_layers"] = 5, j["target_layer_ids"] = {0, 2, 4};  // fc.weight stays [32, 64]
  std::ofstream(dir + "/config.json") << j.dump(2);
  expect_load_error(dir, "tensor \"fc.weight\" has shape [32, 64] but the config expects [32, 96]");
}

// ---- parity with the reference implementation's fixture (tests/data/fixtures/dspark_tiny/README.md) ----

std::vector<float> read_f32(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsEntry& e = f.entries().at(name);
  std::vector<float> v(static_cast<size_t>(shape_numel(e.shape)));
  convert_to_f32(e.dtype, e.data, v.data(), v.size());
  return v;
}

std::vector<int32_t> read_i32(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsEntry& e = f.entries().at(name);
  std::vector<int32_t> v(static_cast<size_t>(shape_numel(e.shape)));
  std::memcpy(v.data(), e.data, v.size() * 4);
  return v;
}

TEST(BlockDrafterParity, MatchesTheReferenceFixture) {
  const std::string dir = test::data_path("fixtures/dspark_tiny");
  if (!fs::exists(dir + "/io.json"))
    GTEST_SKIP()
        << "no fixture at " << dir
        << "; write it with python3 tools/dspark/reference.py (torch) or tools/dspark/crosscheck_nodeps.py (stdlib) "
           "tests/data/fixtures/dspark_tiny";
  const json io = test::read_json(dir + "/io.json");
  auto be = ops::make_cpu_backend();
  auto m = BlockDrafterModel::load(dir, *be);
  const int64_t B = m->config().block_size, V = m->config().vocab(), F = m->config().feature_dim();
  const SafetensorsFile f(dir + "/io.safetensors");
  const std::vector<float> rows = read_f32(f, "context_features");
  const int64_t a = io["anchor_position"];
  ASSERT_EQ(static_cast<int64_t>(rows.size()), io["n_context"].get<int64_t>() * F);
  BlockDrafterContext ctx = m->new_context(a);
  m->append_context(ctx, std::span<const float>(rows.data(), static_cast<size_t>(a * F)));  // rows >= a: masked
  const BlockDraft d = m->propose(ctx, io["anchor_token"].get<int32_t>());
  const BlockDraft s = m->score(ctx, read_i32(f, "score_prev"));
  const double dl = max_diff(d.logits.data(), read_f32(f, "expected_logits").data(), B * V),
               db = max_diff(d.base_logits.data(), read_f32(f, "expected_base_logits").data(), B * V),
               dc = max_diff(d.confidence.data(), read_f32(f, "expected_confidence").data(), B),
               sl = max_diff(s.logits.data(), read_f32(f, "score_logits").data(), B * V),
               sc = max_diff(s.confidence.data(), read_f32(f, "score_confidence").data(), B);
  std::printf(
      "max |diff|: greedy logits %.3g, base %.3g, confidence %.3g; teacher-forced logits %.3g, confidence %.3g\n", dl,
      db, dc, sl, sc);
  EXPECT_EQ(d.tokens, read_i32(f, "expected_tokens"));
  EXPECT_LE(dl, 1e-3);
  EXPECT_LE(db, 1e-3);
  EXPECT_LE(dc, 1e-3);
  EXPECT_LE(sl, 1e-3);
  EXPECT_LE(sc, 1e-3);
}

}  // namespace
}  // namespace kiln::spec
