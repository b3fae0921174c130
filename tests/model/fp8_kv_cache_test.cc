// The FP8 latent KV cache (`--kv-cache-dtype fp8_e4m3`, core/kv_fp8.h) on the CPU reference: its
// bytes counted exactly wherever KV memory is sized, every read path (both MLA forms, chunked
// prefill over a cached prefix, decode context parallelism) seeing the same stored values, and its
// logprob cost against the f32 cache bounded on every reference fixture and the bundled model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/kv_fp8.h"
#include "dist/sharded_model.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/weight_layout.h"
#include "model_test_util.h"
#include "test_util.h"

namespace kiln::test {
namespace {

using json = nlohmann::json;

std::string name_of(const std::string& dir) {
  return std::filesystem::path(dir).filename().string();
}

// log P(ids[i] | ids[:i]) for i >= 1 from rows of logits (row i - 1 predicts ids[i]).
std::vector<double> logprobs(const std::vector<float>& logits, const std::vector<int32_t>& ids, int64_t V) {
  std::vector<double> out;
  for (size_t i = 1; i < ids.size(); ++i) {
    const auto lp = log_softmax_row(logits.data() + (i - 1) * static_cast<size_t>(V), V);
    out.push_back(lp[static_cast<size_t>(ids[i])]);
  }
  return out;
}

struct Gap {
  double mean = 0, max = 0;
};
Gap gap(const std::vector<double>& a, const std::vector<double>& b) {
  Gap g;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a[i] - b[i]);
    g.mean += d / static_cast<double>(a.size());
    g.max = std::max(g.max, d);
  }
  return g;
}

// Every token's logits from one prefill, or from one token a step (absorbed decode over the cache).
std::vector<float> run(DeepseekV3Model& m, const std::vector<int32_t>& ids, DType kv, bool stepwise) {
  m.set_kv_dtype(kv);
  SequenceCache c = m.new_cache(static_cast<int64_t>(ids.size()));
  if (!stepwise) return m.forward(ids, c, true);
  std::vector<float> out;
  for (int32_t id : ids) {
    auto row = m.forward({id}, c, false);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

TEST(Fp8KvCache, BytesPerTokenCountTheScales) {
  // Moonlight's attention widths (kv_lora 512, rope 64): FlashMLA's 656-byte row a layer.
  const std::string dir = data_path("fixtures/h12_mla512_moonlight_widths");
  auto be = ops::make_cpu_backend();
  auto model = DeepseekV3Model::load(dir, *be);
  const ModelConfig& c = model->config();
  model->set_kv_dtype(DType::F8E4M3);
  const int64_t bs = 16, want = c.num_hidden_layers * 656;
  ASSERT_EQ(kv_fp8_layout(c.kv_lora_rank, c.qk_rope_head_dim).row_bytes, 656);
  // The pool the forward writes, the planner's figure and the engine's sizing agree.
  LatentKvPool pool = model->new_pool(3, bs);
  int64_t bytes = 0;
  for (const auto& layer : pool.layers) bytes += static_cast<int64_t>(layer.t.nbytes());
  EXPECT_EQ(bytes, 3 * bs * want);
  EXPECT_EQ(kv_bytes_per_token(c, 1), want);
  EngineConfig cfg;
  cfg.block_size = bs;
  cfg.kv.memory_bytes = 10 * bs * want + bs * want / 2;  // ten and a half blocks: ten fit
  Engine engine(*model, cfg);
  EXPECT_EQ(engine.kv_plan().bytes_per_token, want);
  EXPECT_EQ(engine.kv_plan().num_blocks, 10);
  EXPECT_EQ(engine.kv_plan().tokens(), 10 * bs);  // the startup line's token count
  // `kiln plan` on the same config: fp8 is the row kiln stores, not one byte a value.
  auto r = run_kiln("plan --model " + dir + "/config.json --gpu H200 --gpus 1 --kv fp8_e4m3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(json::parse(r.out.substr(r.out.find('{')))["kv_bytes_per_token"].get<int64_t>(), want);
  r = run_kiln("model-info --config " + dir + "/config.json --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(json::parse(r.out.substr(r.out.find('{')))["kv_bytes_per_token_fp8"].get<int64_t>(), want);
  // The same against bf16: 1,152 bytes a layer.
  model->set_kv_dtype(DType::BF16);
  EXPECT_EQ(static_cast<int64_t>(model->new_pool(1, bs).layers[0].t.nbytes()), bs * 1152);
}

// The ops on an FP8 pool read exactly what was stored: scatter into it, then gather and attend,
// gives bitwise what an f32 pool holding the dequantized rows gives.
TEST(Fp8KvCache, OpsReadTheStoredValuesExactly) {
  auto be = ops::make_cpu_backend();
  const int64_t lora = 200, rope = 8, row = lora + rope, bs = 4, blocks = 5, heads = 3;  // a short last tile
  const KvFp8Layout l = kv_fp8_layout(lora, rope);
  std::vector<float> rows(static_cast<size_t>(7 * row));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = std::sin(0.37f * static_cast<float>(i)) * (1 + i % 11);
  std::vector<float> deq(rows.size());  // what the rows read back as
  std::vector<uint8_t> tmp(static_cast<size_t>(l.row_bytes));
  for (size_t t = 0; t < 7; ++t) {
    kv_fp8_quantize_row(l, rows.data() + t * row, tmp.data());
    kv_fp8_dequantize_row(l, tmp.data(), deq.data() + t * row);
  }
  // One sequence of 7 tokens whose block table {4, 0, ...} puts positions 0-3 in slots 16-19 and
  // 4-6 in slots 0-2.
  std::vector<int32_t> table = {4, 0, 2, 1, 3}, lens = {7}, cu = {0, 7}, cu_q = {0, 2};
  std::vector<int32_t> slots = {16, 17, 18, 19, 0, 1, 2};
  auto fp8 = be->alloc(DType::U8, {blocks * bs, l.row_bytes}), f32 = be->alloc(DType::F32, {blocks * bs, row});
  be->kv_scatter({rows.data(), slots.data(), fp8.t.data, DType::F8E4M3, 7, row, lora});
  be->kv_scatter({deq.data(), slots.data(), f32.t.data, DType::F32, 7, row});
  const ops::PagedKv p8{fp8.t.data, DType::F8E4M3, table.data(), lens.data(), bs, blocks, lora};
  const ops::PagedKv p32{f32.t.data, DType::F32, table.data(), lens.data(), bs, blocks};
  std::vector<float> g8(rows.size()), g32(rows.size());
  be->kv_gather({p8, cu.data(), 1, row, 7, g8.data()});
  be->kv_gather({p32, cu.data(), 1, row, 7, g32.data()});
  EXPECT_EQ(g8, g32);
  EXPECT_EQ(g8, deq);
  std::vector<float> q(static_cast<size_t>(2 * heads * row)), o8(static_cast<size_t>(2 * heads * lora)), o32(o8);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::cos(0.11f * static_cast<float>(i));
  be->mla_absorbed({q.data(), p8, cu_q.data(), 1, 2, o8.data(), heads, lora, rope, 0.1f});
  be->mla_absorbed({q.data(), p32, cu_q.data(), 1, 2, o32.data(), heads, lora, rope, 0.1f});
  EXPECT_EQ(o8, o32);
}

class Fp8Fixture : public ::testing::TestWithParam<std::string> {};

// Prefill (expanded form over the gathered rows), one token a step (absorbed) and a prefix then a
// chunk over it read the same stored FP8 values. The forms' f32 rounding differs (1e-6 relative,
// within 1e-4 of each other on the f32 cache); quantizing can turn such a difference into a whole
// e4m3 step of a latent value that sits on a rounding boundary (6% of that value, the size of its
// own quantization error), so the bound here is 1e-2, still far below what a misread row gives.
TEST_P(Fp8Fixture, FormsAgreeOnTheFp8Cache) {
  auto be = ops::make_cpu_backend();
  auto model = DeepseekV3Model::load(GetParam(), *be);
  model->set_kv_dtype(DType::F8E4M3);
  const auto ids = read_json(GetParam() + "/expected.json")["ids"].get<std::vector<int32_t>>();
  const int64_t n = static_cast<int64_t>(ids.size());
  SequenceCache ce = model->new_cache(n), ca = model->new_cache(n);
  const auto expanded = model->forward(ids, ce, true, MlaForm::Expanded);
  EXPECT_LE(rel_diff(expanded, model->forward(ids, ca, true, MlaForm::Absorbed)), 1e-2);
  EXPECT_LE(rel_diff(expanded, run(*model, ids, DType::F8E4M3, true)), 1e-2);
  SequenceCache cc = model->new_cache(n);
  const std::vector<int32_t> head(ids.begin(), ids.begin() + n / 2), tail(ids.begin() + n / 2, ids.end());
  auto chunked = model->forward(head, cc, true);
  const auto second = model->forward(tail, cc, true);
  chunked.insert(chunked.end(), second.begin(), second.end());
  EXPECT_LE(rel_diff(expanded, chunked), 1e-2);
}

// The parity bound: FP8 against the f32 cache, through a prefill and through decode steps. Fixed
// weights and ids on the CPU reference, so the figures are deterministic, not timings: a bound is
// ~2x the measured figure (docs/results.md has the table), so a read path that dequantized wrong
// (a scale off by a tile, a code misread) fails, while the same arithmetic always passes. These
// random-weight fixtures amplify the cache's rounding (as for the bf16 cache, results.md): the
// trained model's bound is the tighter one (BundledModelStaysNearTheF32Cache).
struct Bound {
  const char* fixture;
  double mean, max;
};
constexpr Bound kBounds[] = {{"h12_mla512_moonlight_widths", 0.15, 2.0},
                             {"h12_mla512_moonlight_widths_fp8", 0.15, 1.5},
                             {"h12_mla512_moonlight_widths_int4", 0.17, 2.0},
                             {"h12_qlora_grouped_yarn", 0.4, 2.2},
                             {"h12_qlora_grouped_yarn_fp8", 0.63, 5.5},
                             {"h24_kimi_k2_style", 0.33, 3.0},
                             {"h5_noqlora_dense2_odd", 2.4, 19.0}};
constexpr Bound kNewFixture = {"", 2.4, 19.0};  // a fixture added later: the loosest bound until measured

TEST_P(Fp8Fixture, LogprobsStayNearTheF32Cache) {
  auto be = ops::make_cpu_backend();
  auto model = DeepseekV3Model::load(GetParam(), *be);
  const json e = read_json(GetParam() + "/expected.json");
  const auto ids = e["ids"].get<std::vector<int32_t>>();
  const int64_t V = model->config().vocab_size;
  const auto ref = logprobs(run(*model, ids, DType::F32, false), ids, V);
  const auto bf16 = logprobs(run(*model, ids, DType::BF16, false), ids, V);
  const auto prefill = logprobs(run(*model, ids, DType::F8E4M3, false), ids, V);
  const auto decode = logprobs(run(*model, ids, DType::F8E4M3, true), ids, V);
  const Gap p = gap(prefill, ref), d = gap(decode, ref), b = gap(bf16, ref), pd = gap(prefill, decode);
  std::printf("| %s | %zu | %.4f | %.3f | %.4f | %.3f | %.4f | %.4f |\n", name_of(GetParam()).c_str(), ids.size() - 1,
              p.mean, p.max, d.mean, d.max, b.mean, pd.mean);
  Bound bound = kNewFixture;
  for (const Bound& x : kBounds)
    if (name_of(GetParam()) == x.fixture) bound = x;
  EXPECT_LE(p.mean, bound.mean);
  EXPECT_LE(d.mean, bound.mean);
  EXPECT_LE(p.max, bound.max);
  EXPECT_LE(d.max, bound.max);
  // Decode steps and the prefill read the same stored values: they differ only where an f32
  // rounding difference upstream moves a latent value across an e4m3 rounding boundary.
  EXPECT_LE(pd.mean, 0.05 * p.mean);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Fp8Fixture, ::testing::ValuesIn(fixture_dirs()),
                         [](const auto& p) { return name_of(p.param); });

// Decode context parallelism reads the cache through the same ops: each rank stores its own rows
// quantized as one device does, so TP2 with DCP2 gives the one-device FP8 logits (1e-3: the split's
// f32 sums round differently, which an e4m3 boundary can turn into a step, as in the forms above).
TEST(Fp8KvCache, DcpMatchesOneDevice) {
  const std::string dir = data_path("fixtures/h12_qlora_grouped_yarn");
  auto one_be = ops::make_cpu_backend();
  auto one = DeepseekV3Model::load(dir, *one_be);
  dist::ShardedModelOptions o;
  o.parallel.world_size = o.parallel.tp = 2;
  o.parallel.dcp = 2;
  o.make_backend = [](int) { return ops::make_cpu_backend(); };
  dist::ShardedModel split = dist::load_sharded_model(load_model_config(dir + "/config.json"), dir, o);
  DeepseekV3Model& many = *split.model;
  const auto ids = read_json(dir + "/expected.json")["ids"].get<std::vector<int32_t>>();
  const int64_t n = static_cast<int64_t>(ids.size());
  one->set_kv_dtype(DType::F8E4M3);
  many.set_kv_dtype(DType::F8E4M3);
  SequenceCache c1 = one->new_cache(n), cn = many.new_cache(n);
  const std::vector<int32_t> head(ids.begin(), ids.begin() + n / 2);
  EXPECT_LE(rel_diff(one->forward(head, c1, true), many.forward(head, cn, true)), 1e-3) << "prefill";
  const auto [sa, sb] = decode_both(*one, c1, many, cn, ids, n / 2);
  EXPECT_LE(rel_diff(sa, sb), 1e-3) << "decode steps";
}

// The bundled trained model over a held-out window of 512 ids (one prefill, as `kiln score` runs
// it): the trained weights' logprobs move far less than the random fixtures' do.
TEST(Fp8KvCache, BundledModelStaysNearTheF32Cache) {
  const std::string dir = std::string(KILN_TEST_DATA) + "/../../models/kiln-tiny";
  auto be = ops::make_cpu_backend();
  auto model = DeepseekV3Model::load(dir, *be);
  auto all = read_json(dir + "/heldout.json")["ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> ids(all.begin(), all.begin() + 512);
  const int64_t V = model->config().vocab_size;
  const Gap g = gap(logprobs(run(*model, ids, DType::F8E4M3, false), ids, V),
                    logprobs(run(*model, ids, DType::F32, false), ids, V));
  std::printf("kiln-tiny, 512 held-out ids: fp8 vs f32 cache mean %.5f max %.5f\n", g.mean, g.max);
  EXPECT_LE(g.mean, 0.05);  // measured 0.0256 (docs/results.md): the bound of the brief, ~2x
  EXPECT_LE(g.max, 1.2);    // measured 0.607
}

}  // namespace
}  // namespace kiln::test
