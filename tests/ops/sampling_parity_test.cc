// The sample op: CUDA against the CPU reference in every mode, at the vocabularies that matter
// (up to Kimi/Moonlight's 163,840) and batch sizes 1..256. Tokens must be identical except where
// the draw or a top-p / min-p cut lands within rounding of a boundary (f32 exp on the GPU vs f64
// on the CPU): such rows are counted across the whole test and must stay ~0.
#include <cstdio>

#include "sampling_util.h"

namespace kiln::test {
namespace {

struct Mode {
  const char* name;
  float temperature;
  int32_t top_k;
  float top_p, min_p, repetition, presence, frequency;
};

const Mode kModes[] = {
    {"greedy", 0, 0, 1, 0, 1, 0, 0},
    {"temperature", 0.8f, 0, 1, 0, 1, 0, 0},
    {"top_k", 1.0f, 50, 1, 0, 1, 0, 0},
    {"top_k1", 1.0f, 1, 1, 0, 1, 0, 0},
    {"top_p", 1.0f, 0, 0.9f, 0, 1, 0, 0},
    {"min_p", 1.0f, 0, 1, 0.05f, 1, 0, 0},
    {"k_p_minp", 0.7f, 40, 0.95f, 0.02f, 1, 0, 0},
    {"k_p", 1.2f, 1000, 0.5f, 0, 1, 0, 0},
    {"penalties", 0.9f, 100, 0.9f, 0, 1.3f, 0.5f, 0.3f},
    {"greedy_penalties", 0, 0, 1, 0, 1.5f, 0.4f, 0.2f},
    {"mixed", -1, 0, 1, 0, 1, 0, 0},  // each row takes the mode of its index
};
constexpr int kNumModes = sizeof(kModes) / sizeof(kModes[0]);

void set_row(SampleBatch& b, int64_t r, const Mode& m) {
  const auto i = static_cast<size_t>(r);
  b.temperature[i] = m.temperature, b.top_k[i] = m.top_k, b.top_p[i] = m.top_p, b.min_p[i] = m.min_p;
  b.repetition[i] = m.repetition, b.presence[i] = m.presence, b.frequency[i] = m.frequency;
}

// A batch in one mode: logits N(0, 2) (every other row rounded to 0.25: long runs of ties), some
// rows with masked (-inf) tokens, penalty lists of up to 64 distinct tokens per row.
SampleBatch make_batch(int64_t rows, int64_t vocab, int64_t num_top, int mode, uint64_t seed) {
  SampleBatch b;
  b.resize(rows, vocab, num_top);
  fill_logits(b, seed, 2.0f, 0);
  std::mt19937_64 g(seed + 1);
  b.pen_offsets.push_back(0);
  for (int64_t r = 0; r < rows; ++r) {
    float* l = b.row(r);
    if (r % 2) {
      for (int64_t j = 0; j < vocab; ++j) l[j] = std::round(l[j] * 4) / 4;
    }
    if (r % 5 == 3) {
      for (int64_t j = 1; j < vocab; j += 7) l[j] = -INFINITY;  // id 0 stays finite
    }
    const Mode& m = kModes[mode == kNumModes - 1 ? r % (kNumModes - 1) : mode];
    set_row(b, r, m);
    b.seed[static_cast<size_t>(r)] = g();
    b.counter[static_cast<size_t>(r)] = g() % 4096;
    if (m.repetition != 1 || m.presence != 0 || m.frequency != 0) {
      std::vector<int32_t> ids(static_cast<size_t>(vocab));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), g);
      ids.resize(std::min<size_t>(ids.size(), 64));
      for (int32_t id : ids) {
        b.pen_ids.push_back(id);
        b.pen_counts.push_back(static_cast<int32_t>(g() % 4));
      }
    }
    b.pen_offsets.push_back(static_cast<int32_t>(b.pen_ids.size()));
  }
  return b;
}

struct Tally {
  int64_t rows = 0, sampled = 0, mismatched = 0;
};

void compare(const SampleBatch& b, const SampleOut& c, const SampleOut& g, const std::string& what, Tally& t) {
  EXPECT_EQ(g.logits_after, b.logits) << what << ": the op wrote into the logits";
  for (int64_t r = 0; r < b.rows; ++r) {
    const auto i = static_cast<size_t>(r);
    ++t.rows;
    const bool sampled = b.temperature[i] > 0;
    t.sampled += sampled;
    ASSERT_GE(g.token[i], 0) << what << " row " << r;
    ASSERT_LT(g.token[i], b.vocab) << what << " row " << r;
    if (g.token[i] != c.token[i]) {
      // Greedy rows and top-k-only cuts are exact: only sampled rows may differ at a boundary.
      EXPECT_TRUE(sampled) << what << " row " << r << ": greedy token " << g.token[i] << " vs " << c.token[i];
      ++t.mismatched;
      std::printf("  boundary case? %s row %lld: cuda %d cpu %d (logprobs %.6f / %.6f)\n", what.c_str(),
                  static_cast<long long>(r), g.token[i], c.token[i], static_cast<double>(g.logprob[i]),
                  static_cast<double>(c.logprob[i]));
      continue;
    }
    EXPECT_NEAR(g.logprob[i], c.logprob[i], 1e-4) << what << " row " << r;
  }
  for (size_t j = 0; j < c.top_ids.size(); ++j) {
    ASSERT_EQ(g.top_ids[j], c.top_ids[j]) << what << " top entry " << j;
    if (c.top_lp[j] == -INFINITY)  // past the vocabulary, or a masked token
      EXPECT_EQ(g.top_lp[j], -INFINITY) << what << " top entry " << j;
    else
      EXPECT_NEAR(g.top_lp[j], c.top_lp[j], 1e-4) << what << " top entry " << j;
  }
}

TEST(Parity, SampleEveryModeVocabAndBatch) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  Tally t;
  const int64_t tops[] = {0, 1, 5, 20};
  int run = 0;
  for (int64_t vocab : {1, 7, 1000, 32000, 129280, 163840}) {
    for (int64_t rows : {1, 8, 256}) {
      for (int mode = 0; mode < kNumModes; ++mode, ++run) {
        const int64_t num_top = tops[run % 4];
        const std::string what = std::string(kModes[mode].name) + " vocab " + std::to_string(vocab) + " rows " +
                                 std::to_string(rows) + " top " + std::to_string(num_top);
        SCOPED_TRACE(what);
        const SampleBatch b = make_batch(rows, vocab, num_top, mode, static_cast<uint64_t>(run) * 7919 + 1);
        const SampleOut c = run_sample(*cpu, b), g = run_sample(*gpu, b);
        compare(b, c, g, what, t);
        if (HasFatalFailure()) return;
      }
    }
  }
  std::printf("sample parity: %lld rows (%lld sampled), %lld tokens differ at a rounding boundary\n",
              static_cast<long long>(t.rows), static_cast<long long>(t.sampled), static_cast<long long>(t.mismatched));
  EXPECT_LE(t.mismatched, 3) << "more than rounding can explain";
}

// The same request gives the same token on the GPU whatever its row and batch, and a row's token
// follows its counter.
TEST(Parity, SampleTokenDependsOnSeedAndCounterOnly) {
  KILN_NEED_GPU();
  auto& gpu = *backends().gpu;
  SampleBatch big = make_batch(64, 32000, 0, kNumModes - 1, 99);
  const SampleOut all = run_sample(gpu, big);
  for (int64_t r : {0, 13, 63}) {
    SampleBatch one;
    one.resize(1, big.vocab, 0);
    std::copy(big.row(r), big.row(r) + big.vocab, one.row(0));
    const auto i = static_cast<size_t>(r);
    one.temperature[0] = big.temperature[i], one.top_k[0] = big.top_k[i], one.top_p[0] = big.top_p[i];
    one.min_p[0] = big.min_p[i], one.repetition[0] = big.repetition[i], one.presence[0] = big.presence[i];
    one.frequency[0] = big.frequency[i], one.seed[0] = big.seed[i], one.counter[0] = big.counter[i];
    const auto b0 = big.pen_offsets[i], b1 = big.pen_offsets[i + 1];
    one.pen_offsets = {0, b1 - b0};
    one.pen_ids.assign(big.pen_ids.begin() + b0, big.pen_ids.begin() + b1);
    one.pen_counts.assign(big.pen_counts.begin() + b0, big.pen_counts.begin() + b1);
    EXPECT_EQ(run_sample(gpu, one).token[0], all.token[i]) << "row " << r;
  }
}

// Runs of equal logits cut at the lowest ids on both backends (top-k and top-p inside a tie).
TEST(Parity, SampleTiesCutAtTheSameIds) {
  KILN_NEED_GPU();
  auto& [cpu, gpu] = backends();
  SampleBatch b;
  b.resize(64, 5000, 3);
  for (int64_t r = 0; r < b.rows; ++r) {
    float* l = b.row(r);
    for (int64_t j = 0; j < b.vocab; ++j) l[j] = static_cast<float>((j * 37 + r) % 3);  // 3 values, ~1667 ties each
    if (r % 4 == 0) l[r] = -0.0f;
    const auto i = static_cast<size_t>(r);
    b.top_k[i] = static_cast<int32_t>(1 + r * 53 % 3000);
    b.top_p[i] = r % 2 ? 0.1f + 0.013f * static_cast<float>(r) : 1.0f;
    b.min_p[i] = r % 3 == 0 ? 0.5f : 0.0f;
    b.temperature[i] = r % 8 == 7 ? 0.0f : 0.6f;
    b.seed[i] = 11, b.counter[i] = static_cast<uint64_t>(r);
  }
  Tally t;
  compare(b, run_sample(*cpu, b), run_sample(*gpu, b), "ties", t);
  EXPECT_EQ(t.mismatched, 0);
}

}  // namespace
}  // namespace kiln::test
